"""`tenants purge NAME --yes` and `runs purge ID|--session ID --yes`: remove every row
of a tenant, a run or a session, in every table (store/purge.py; docs/operations.md
"Purge"). Each prints the rows deleted per table."""

from __future__ import annotations

import argparse
import json

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import MAX_BATCH_SIZE, a_uuid, int_between, name
from hango_worker.cli.runs import verbs
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.store.purge import PurgeResult


def _common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--yes", action="store_true", help="really delete (required)")
    sp.add_argument(
        "--batch-size",
        type=int_between(1, MAX_BATCH_SIZE),
        default=1000,
        help=f"rows per short transaction (1-{MAX_BATCH_SIZE})",
    )
    sp.add_argument("--json", action="store_true", help="the counts as one JSON object")


def register(sub: Subcommands) -> None:
    tn = group(sub, "tenants", "create, list and limit tenants (fair claiming, max_running)")
    tp = command(
        tn,
        "purge",
        cmd_tenants_purge,
        "delete the tenant and every row of it in every table (refused while it has "
        "unfinished runs)",
        tenanted=False,
    )
    tp.add_argument("tenant", type=name, help="the tenant's name or id")
    _common(tp)
    rp = command(
        verbs(sub),
        "purge",
        cmd_runs_purge,
        "delete a finished run (with its subagent runs) or a whole session, every row",
        tenanted=True,
    )
    which = rp.add_mutually_exclusive_group(required=True)
    which.add_argument("run_id", nargs="?", type=a_uuid("a run id"))
    which.add_argument("--session", type=a_uuid("a session id"), help="the whole session")
    _common(rp)


def _confirmed(a: argparse.Namespace, what: str) -> None:
    if not a.yes:
        raise CliError(f"purge deletes {what} for good: add --yes to confirm")


def _report(result: PurgeResult, as_json: bool) -> int:
    if as_json:
        print(json.dumps(result.deleted))
    else:
        for table, n in result.deleted.items():
            print(f"{table:<14} {n}")
        print(f"{'total':<14} {result.total}")
    return exits.OK


async def cmd_tenants_purge(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store.purge import purge_tenant
    from hango_worker.store.tenants import resolve_tenant

    _confirmed(a, f"tenant {a.tenant!r} and all its data")
    async with pool_for(s) as (_, pool):
        tid = await resolve_tenant(pool, a.tenant)
        result = await purge_tenant(pool, tid, batch_size=a.batch_size)
    return _report(result, a.json)


async def cmd_runs_purge(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store.purge import purge_run, purge_session

    _confirmed(a, f"session {a.session}" if a.session else f"run {a.run_id}")
    async with pool_for(s) as (_, pool):
        tid = await tenant_of(pool, a)
        if a.session:
            result = await purge_session(pool, tid, a.session, batch_size=a.batch_size)
        else:
            result = await purge_run(pool, tid, a.run_id, batch_size=a.batch_size)
    return _report(result, a.json)
