"""`hango-worker console`: the run console in its own process (hango_worker/console)."""

from __future__ import annotations

import argparse

from hango_worker.cli import exits
from hango_worker.cli.database import database
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings


def register(sub: Subcommands) -> None:
    command(
        sub,
        "console",
        cmd_console,
        "serve the run console (web pages) on HANGO_CONSOLE_HOST:HANGO_CONSOLE_PORT; needs "
        "HANGO_CONSOLE_TOKENS or HANGO_CONSOLE_PROXY_HEADER",
        tenanted=False,
    )


async def cmd_console(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.console import server
    from hango_worker.telemetry.logs import setup_logging

    setup_logging(s.log_level, s.log_format, s.capture_content)
    server.check(s)  # before the database: a console nobody can sign in to never starts
    async with database(s) as dsn:
        await server.serve(s, dsn)
    return exits.OK
