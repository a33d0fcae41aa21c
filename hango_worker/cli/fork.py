"""`runs fork`: a new run from the end of one of a run's turns, with the same history
up to there (store/fork.py; docs/operations.md)."""

from __future__ import annotations

import argparse
import json

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import a_uuid, int_between, read_input, text
from hango_worker.cli.runs import verbs
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings
from hango_worker.store import repo


def register(sub: Subcommands) -> None:
    fk = command(
        verbs(sub),
        "fork",
        cmd_runs_fork,
        "a new run from the end of one of this run's turns",
        tenanted=True,
    )
    fk.add_argument("run_id", type=a_uuid("a run id"))
    fk.add_argument(
        "--at-turn", type=int_between(0, 1_000_000), required=True, help="0: before turn 1"
    )
    given = fk.add_mutually_exclusive_group()
    given.add_argument("--input", type=text, help="the user's next message ('-': read stdin)")
    given.add_argument("--input-file", type=text, metavar="PATH", help="read it from a file")
    fk.add_argument("--json", action="store_true")


async def cmd_runs_fork(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store import fork

    text = read_input(a.input, a.input_file) if (a.input or a.input_file) else None
    try:
        async with pool_for(s) as (_, pool):
            ids = await fork.fork(pool, await tenant_of(pool, a), a.run_id, a.at_turn, text)
    except ValueError as e:
        if isinstance(e, repo.Conflict):
            raise
        raise CliError(str(e)) from None
    print(json.dumps(ids) if a.json else ids["run_id"])
    return exits.OK
