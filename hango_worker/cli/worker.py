"""`hango-worker run`: the worker service (hango_worker/service.py)."""

from __future__ import annotations

import argparse
import json
import sys

from hango_worker.cli import exits
from hango_worker.cli.database import database
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings


def register(sub: Subcommands) -> None:
    r = command(sub, "run", cmd_run, "run the worker service", tenanted=False)
    r.add_argument("--until-idle", action="store_true", help="exit once nothing is queued")


async def cmd_run(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.service import serve

    async with database(s) as dsn:
        stats = await serve(s, dsn, until_idle=a.until_idle, install_signals=True)
    print(json.dumps({"claimed": stats.claimed, "finished": stats.finished}), file=sys.stderr)
    return exits.OK
