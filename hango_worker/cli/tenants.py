"""`tenants create|list|set`: tenants, their weight and limits
(store/tenants.py; docs/operations.md "Tenants, fairness and limits")."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for
from hango_worker.cli.inputs import int_between, name, new_name
from hango_worker.cli.output import print_rows
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.store import tenants as t

_N = int_between(0, t.MAX_RUNNING)
_W = int_between(1, t.MAX_WEIGHT)


def register(sub: Subcommands) -> None:
    tn = group(sub, "tenants", "create, list and limit tenants (fair claiming, max_running)")
    c_ = command(tn, "create", cmd_tenants_create, "create a tenant; prints its id", tenanted=False)
    c_.add_argument("name", type=new_name, help="1-200 printable characters, not a UUID")
    c_.add_argument(
        "--weight", type=_W, default=1, help=f"its share of each claim (1-{t.MAX_WEIGHT})"
    )
    c_.add_argument("--max-running", type=_N, help="its runs running at once, fleet-wide")
    c_.add_argument("--json", action="store_true")
    ls = command(tn, "list", cmd_tenants_list, "weight, limits, queued, running", tenanted=False)
    ls.add_argument("--json", action="store_true")
    st = command(
        tn, "set", cmd_tenants_set, "change a tenant's weight or max_running", tenanted=False
    )
    st.add_argument("tenant", type=name, help="the tenant's name or id")
    st.add_argument("--weight", type=_W)
    lim = st.add_mutually_exclusive_group()
    lim.add_argument("--max-running", type=_N, help="0 pauses claiming for the tenant")
    lim.add_argument("--no-limit", action="store_true", help="remove its max_running")
    st.add_argument("--json", action="store_true")


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


def _or_dash(limit: int | None) -> str:
    return "-" if limit is None else str(limit)
