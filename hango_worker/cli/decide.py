"""`runs approve|reject|answer` (a person's decision about a waiting run), `runs fork`
and `runs history`."""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any

from hango_worker.cli import exits
from hango_worker.cli.commands import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import json_arg, read_input
from hango_worker.config import Settings
from hango_worker.render import safe
from hango_worker.store import decisions, repo
from hango_worker.vocab import Decision


def _edited(raw: str | None) -> Any:
    if raw is None:
        return None
    value = json_arg(raw, "--input")
    if not isinstance(value, dict):
        raise CliError("--input must be a JSON object (the call's arguments)")
    return value


async def _decide(s: Settings, a: argparse.Namespace, d: Decision, **kw: Any) -> int:
    try:
        async with pool_for(s) as (_, pool):
            done = await decisions.decide(
                pool,
                await tenant_of(pool, a),
                a.run_id,
                d,
                call_id=a.call,
                decided_by=f"cli:{getpass.getuser()}",
                **kw,
            )
    except ValueError as e:
        if isinstance(e, repo.Conflict):
            raise
        raise CliError(str(e)) from None
    if a.json:
        print(json.dumps({**done, "status": "queued"}))
    else:
        print(f"{done['decision']} {done['tool_use_id']}: the run is queued again")
    return exits.OK


async def cmd_runs_approve(s: Settings, a: argparse.Namespace) -> int:
    return await _decide(s, a, Decision.APPROVE, edited=_edited(a.input))


async def cmd_runs_reject(s: Settings, a: argparse.Namespace) -> int:
    return await _decide(s, a, Decision.REJECT, text=a.reason)


async def cmd_runs_answer(s: Settings, a: argparse.Namespace) -> int:
    return await _decide(s, a, Decision.ANSWER, text=a.text)


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
