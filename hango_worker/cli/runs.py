"""`runs list|show|watch|cancel|resume`: inspect and control the tenant's runs
(store/repo.py, watch.py). The other `runs` verbs are in decide.py (approve, reject,
answer), fork.py, history.py (tree, history), files.py (files, file) and export.py (export,
import)."""

from __future__ import annotations

import argparse
import json
import sys

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.inputs import MAX_LIMIT, STATUSES, a_uuid, int_between
from hango_worker.cli.output import out
from hango_worker.cli.show import JsonLines, showable
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.provider.content import without_bytes
from hango_worker.render import LiveView, Painter, print_run
from hango_worker.store import repo


def verbs(sub: Subcommands) -> Subcommands:
    """`hango-worker runs …`: where every module with a `runs` verb adds it."""
    return group(sub, "runs", "inspect and control runs")


def register(sub: Subcommands) -> None:
    rs = verbs(sub)
    ls = command(rs, "list", cmd_runs_list, "recent runs", tenanted=True)
    ls.add_argument("--status", choices=STATUSES)
    ls.add_argument(
        "--limit", type=int_between(1, MAX_LIMIT), default=50, help=f"1-{MAX_LIMIT} (default 50)"
    )
    ls.add_argument("--json", action="store_true")
    for verb, fn, h in (
        ("show", cmd_runs_show, "status, attempt, transcript, state, events, error"),
        ("watch", cmd_runs_watch, "follow a run live until it ends"),
        ("cancel", cmd_runs_cancel, "cancel a run (at its next turn boundary)"),
        ("resume", cmd_runs_resume, "re-queue a cancelled or failed run from its checkpoint"),
    ):
        sp = command(rs, verb, fn, h, tenanted=True)
        sp.add_argument("run_id", type=a_uuid("a run id"))
        sp.add_argument("--json", action="store_true")
        if verb == "show":
            sp.add_argument(
                "--with-bytes",
                action="store_true",
                help="with --json: attachments' base64 as stored (default: their size only)",
            )


async def cmd_runs_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        runs = await repo.list_runs(pool, await tenant_of(pool, a), status=a.status, limit=a.limit)
    if a.json:
        out(runs)
        return exits.OK
    for r in runs:
        error = r["error"]
        err = f"  {error.get('type')}" if isinstance(error, dict) else "  (malformed error)"
        print(
            f"{r['id']}  {r['status']:<9} {r['agent']:<16} attempt={r['attempt']} "
            f"{r['created_at']}{err if error is not None else ''}"
        )
    return exits.OK


async def cmd_runs_show(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        run = await repo.run_details(pool, await tenant_of(pool, a), a.run_id)
    if a.json:  # attachments by size, never their base64 (unless --with-bytes)
        out(run if a.with_bytes else without_bytes(run))
        return exits.OK
    shown, problems = showable(run)
    print_run(Painter(), shown)
    for p in problems:
        print(f"hango-worker: malformed row shown as a marker: {p}", file=sys.stderr)
    return exits.OK


async def cmd_runs_cancel(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        status = await repo.request_cancel(pool, await tenant_of(pool, a), a.run_id)
    if a.json:
        print(json.dumps({"run_id": a.run_id, "status": status}))
    else:
        done = status == "cancelled"
        print("cancelled" if done else "cancel requested (at the next turn boundary)")
    return exits.OK


async def cmd_runs_resume(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        await repo.resume(pool, await tenant_of(pool, a), a.run_id)
    print(json.dumps({"run_id": a.run_id, "status": "queued"}) if a.json else "queued")
    return exits.OK


async def cmd_runs_watch(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.watch import watch

    view = JsonLines() if a.json else LiveView(Painter())
    async with pool_for(s) as (dsn, pool):
        run = await watch(pool, dsn, await tenant_of(pool, a), a.run_id, view)
    if a.json:
        view.p.line(json.dumps({"type": "run", **run}, default=str, ensure_ascii=False))
    return exits.OK if run["status"] == "succeeded" else exits.FAILED
