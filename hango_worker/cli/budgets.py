"""`budgets set|show|rm`: spend budgets in USD per tenant or agent, per UTC day or month,
shared by every worker (store/budgets.py, run/budget.py; docs/operations.md "Spend
budgets"). Operator commands: the producer SQL API has none."""

from __future__ import annotations

import argparse
import math
from typing import Any

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import name
from hango_worker.cli.output import out, print_rows
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.store import budgets as b


def usd(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of USD") from None
    if not math.isfinite(v) or not 0 <= v <= b.MAX_LIMIT_USD:
        raise argparse.ArgumentTypeError(f"{value} is out of range: must be 0-{b.MAX_LIMIT_USD:g}")
    return v


def register(sub: Subcommands) -> None:
    bs = group(sub, "budgets", "spend budgets in USD per tenant or agent, per UTC day or month")
    st = command(bs, "set", cmd_budgets_set, "create or change a budget", tenanted=True)
    st.add_argument("--agent", type=name, help="the agent's name or id (default: the tenant)")
    st.add_argument("--period", required=True, choices=b.PERIODS, help="a UTC calendar window")
    st.add_argument("--usd", required=True, type=usd, help="the limit (0 stops every call)")
    st.add_argument(
        "--on-exhausted",
        choices=b.ON_EXHAUSTED,
        default="wait",
        help="what a run does when the budget is spent (default: wait)",
    )
    st.add_argument("--json", action="store_true")
    sh = command(
        bs,
        "show",
        cmd_budgets_show,
        "the tenant's budgets: limit, spent, held, waiting",
        tenanted=True,
    )
    sh.add_argument("--all", action="store_true", help="every tenant's")
    sh.add_argument("--json", action="store_true")
    rm = command(
        bs, "rm", cmd_budgets_rm, "remove a budget (its waiting runs go on)", tenanted=True
    )
    rm.add_argument("--agent", type=name, help="the agent's name or id (default: the tenant)")
    rm.add_argument("--period", choices=b.PERIODS, help="default: both periods")


async def cmd_budgets_set(s: Settings, a: argparse.Namespace) -> int:
    try:
        async with pool_for(s) as (_, pool):
            row = await b.set_budget(
                pool, await tenant_of(pool, a), a.agent, a.period, a.usd, a.on_exhausted
            )
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.json:
        out(row)
    else:
        print(_line(row))
    return exits.OK


async def cmd_budgets_show(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        rows = await b.list_budgets(pool, None if a.all else await tenant_of(pool, a))
    return print_rows(rows, a.json, _line)


async def cmd_budgets_rm(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        n = await b.remove_budget(pool, await tenant_of(pool, a), a.agent, a.period)
    print(f"removed {n} budget{'s' if n != 1 else ''}")
    return exits.OK


def _line(r: dict[str, Any]) -> str:
    scope = f"{r['tenant']}/{r['agent']}" if r["agent"] else f"{r['tenant']} (every agent)"
    return (
        f"{scope} {r['period']}: limit=${r['limit_usd']:.2f} spent=${r['spent_usd']:.4f} "
        f"held=${r['reserved_usd']:.4f} left=${r['remaining_usd']:.4f} "
        f"on_exhausted={r['on_exhausted']} waiting={r['waiting']} "
        f"window_end={r['window_end']:%Y-%m-%dT%H:%MZ}"
    )
