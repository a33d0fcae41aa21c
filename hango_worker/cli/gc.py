"""`hango-worker gc`: delete finished runs' events, and with --runs the runs
(store/gc.py; docs/operations.md)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import MAX_BATCH_SIZE, a_uuid, int_between
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings


def register(sub: Subcommands) -> None:
    g = command(
        sub,
        "gc",
        cmd_gc,
        "delete finished runs' events (and with --runs the runs) older than AGE",
        tenanted=False,
    )
    g.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 45m")
    g.add_argument("--runs", action="store_true", help="also delete the runs themselves")
    g.add_argument(
        "--batch-size",
        type=int_between(1, MAX_BATCH_SIZE),
        default=1000,
        help=f"rows per short transaction (1-{MAX_BATCH_SIZE})",
    )
    g.add_argument("--tenant", type=a_uuid("a tenant id"), help="only this tenant (default: all)")
    g.add_argument("--json", action="store_true", help="(the summary is always JSON)")


async def cmd_gc(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store.gc import gc, parse_age

    try:
        age = parse_age(a.older_than)
    except ValueError as e:
        raise CliError(f"--older-than: {e}") from None
    async with pool_for(s) as (_, pool):
        result = await gc(
            pool, older_than=age, tenant_id=a.tenant, delete_runs=a.runs, batch_size=a.batch_size
        )
    print(json.dumps(dataclasses.asdict(result), default=str))
    return exits.OK
