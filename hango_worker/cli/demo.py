"""`hango-worker demo`: an embedded Postgres and a demo agent, end to end
(hango_worker/demo.py)."""

from __future__ import annotations

import argparse

from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings


def register(sub: Subcommands) -> None:
    command(
        sub,
        "demo",
        cmd_demo,
        "start an embedded Postgres and run a demo agent end to end",
        tenanted=False,
    )


async def cmd_demo(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.demo import demo

    return await demo(s)
