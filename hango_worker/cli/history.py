"""`runs tree|history`: a run and its child runs (subagents), and a run's turns
(store/fork.py tree, history)."""

from __future__ import annotations

import argparse
import json

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.inputs import a_uuid
from hango_worker.cli.runs import verbs
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings
from hango_worker.render import safe


def register(sub: Subcommands) -> None:
    rs = verbs(sub)
    for verb, fn, h in (
        ("tree", cmd_runs_tree, "the run and its child runs (subagents), with statuses"),
        ("history", cmd_runs_history, "the run's turns: time, tools, state changed"),
    ):
        sp = command(rs, verb, fn, h, tenanted=True)
        sp.add_argument("run_id", type=a_uuid("a run id"))
        sp.add_argument("--json", action="store_true")


async def cmd_runs_tree(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store import fork

    async with pool_for(s) as (_, pool):
        rows = await fork.tree(pool, await tenant_of(pool, a), a.run_id)
    if a.json:
        print(json.dumps(rows, default=str))
        return exits.OK
    for r in rows:
        call = f"  (task {safe(r['parent_tool_use_id'])})" if r["parent_tool_use_id"] else ""
        cost = f"  ${r['cost_usd']:.4f}" if r["cost_usd"] is not None else ""
        print(f"{'  ' * r['level']}{r['id']}  {r['status']:<9}  {safe(r['agent'])}{cost}{call}")
    costs = [r["cost_usd"] for r in rows]
    if all(c is not None for c in costs):  # the tree's cost: each run's own, added up
        print(f"total cost ${sum(c for c in costs if c is not None):.4f} ({len(rows)} runs)")
    return exits.OK


async def cmd_runs_history(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store import fork

    async with pool_for(s) as (_, pool):
        turns = await fork.history(pool, await tenant_of(pool, a), a.run_id)
    if a.json:
        print(json.dumps(turns, default=str))
        return exits.OK
    for t in turns:
        tools = ", ".join(safe(n) for n in t["tool_calls"]) or "(answer)"
        changed = "  state changed" if t["state_changed"] else ""
        print(f"{t['turn']:>4}  {t['at']}  {tools}{changed}")
    return exits.OK
