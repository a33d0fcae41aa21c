"""`tenants create|list|set` and `agents limit`: tenants, their weight and limits
(store/tenants.py; docs/operations.md "Tenants, fairness and limits")."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from hango_worker.cli import exits
from hango_worker.cli.commands import pool_for, print_rows, tenant_of
from hango_worker.cli.inputs import int_between, name, new_name
from hango_worker.config import Settings
from hango_worker.store import tenants as t

_N = int_between(0, t.MAX_RUNNING)
_W = int_between(1, t.MAX_WEIGHT)


def add_commands(sub: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    from hango_worker.cli import budgets, ratelimits

    ratelimits.add_commands(sub, cmd)
    budgets.add_commands(sub, cmd)
    tn = sub.add_parser(
        "tenants", help="create, list and limit tenants (fair claiming, max_running)"
    ).add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")
    c_ = cmd("create", cmd_tenants_create, "create a tenant; prints its id", tn, tenanted=False)
    c_.add_argument("name", type=new_name, help="1-200 printable characters, not a UUID")
    c_.add_argument(
        "--weight", type=_W, default=1, help=f"its share of each claim (1-{t.MAX_WEIGHT})"
    )
    c_.add_argument("--max-running", type=_N, help="its runs running at once, fleet-wide")
    c_.add_argument("--json", action="store_true")
    ls = cmd("list", cmd_tenants_list, "weight, limits, queued, running", tn, tenanted=False)
    ls.add_argument("--json", action="store_true")
    st = cmd("set", cmd_tenants_set, "change a tenant's weight or max_running", tn, tenanted=False)
    st.add_argument("tenant", type=name, help="the tenant's name or id")
    st.add_argument("--weight", type=_W)
    lim = st.add_mutually_exclusive_group()
    lim.add_argument("--max-running", type=_N, help="0 pauses claiming for the tenant")
    lim.add_argument("--no-limit", action="store_true", help="remove its max_running")
    st.add_argument("--json", action="store_true")


def add_agent_limit(ag: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    al = cmd("limit", cmd_agents_limit, "set or remove an agent's max_running", ag)
    al.add_argument("agent", type=name, help="agent name or id")
    lim = al.add_mutually_exclusive_group(required=True)
    lim.add_argument("--max-running", type=_N, help="its runs running at once, fleet-wide")
    lim.add_argument("--no-limit", action="store_true", help="remove its max_running")


async def cmd_tenants_create(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        tid = await t.create_tenant(pool, a.name, weight=a.weight, max_running=a.max_running)
    print(json.dumps({"tenant_id": tid}) if a.json else tid)
    return exits.OK


async def cmd_tenants_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        rows = await t.list_tenants(pool)
    return print_rows(
        rows,
        a.json,
        lambda r: (
            f"{r['id']}  {r['name']:<20} weight={r['weight']} "
            f"max_running={_or_dash(r['max_running'])} queued={r['queued']} running={r['running']}"
        ),
    )


async def cmd_tenants_set(s: Settings, a: argparse.Namespace) -> int:
    kw: dict[str, Any] = {"weight": a.weight}
    if a.no_limit or a.max_running is not None:
        kw["max_running"] = None if a.no_limit else a.max_running
    async with pool_for(s) as (_, pool):
        row = await t.update_tenant(pool, a.tenant, **kw)
    print(
        json.dumps(row)
        if a.json
        else f"{row['name']}: weight={row['weight']} max_running={_or_dash(row['max_running'])}"
    )
    return exits.OK


async def cmd_agents_limit(s: Settings, a: argparse.Namespace) -> int:
    n = None if a.no_limit else a.max_running
    async with pool_for(s) as (_, pool):
        await t.set_agent_max_running(pool, await tenant_of(pool, a), a.agent, n)
    print(f"{a.agent}: max_running={_or_dash(n)}")
    return exits.OK


def _or_dash(limit: int | None) -> str:
    return "-" if limit is None else str(limit)
