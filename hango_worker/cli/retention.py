"""`retention set|show|rm`: how long a tenant's finished runs, events, files, orphan
sessions and unused memories are kept, per tenant (or the fleet default) with
per-agent overrides (store/retention.py; docs/operations.md "Retention policies").
The workers enforce them."""

from __future__ import annotations

import argparse
from typing import Any

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import name
from hango_worker.cli.output import print_rows
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.store.schema import RETENTION_KINDS

INHERIT = "inherit"  # a kind's value that clears it (falls through to the wider scope)


def _age(text: str) -> int | None:
    from hango_worker.store.gc import parse_age

    if text == INHERIT:
        return None
    try:
        return int(parse_age(text).total_seconds())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _scope(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--agent", type=name, help="an agent's override (its name in the tenant)")
    sp.add_argument(
        "--fleet", action="store_true", help="the fleet default (every tenant without its own)"
    )


def register(sub: Subcommands) -> None:
    rs = group(sub, "retention", "how long finished runs and their data are kept")
    st = command(rs, "set", cmd_retention_set, "set a policy's durations", tenanted=True)
    _scope(st)
    for kind in RETENTION_KINDS:
        st.add_argument(
            f"--{kind}",
            type=_age,
            metavar="AGE",
            default=argparse.SUPPRESS,
            help=f"keep {kind} this long (e.g. 30d; '{INHERIT}': the wider scope's)",
        )
    sh = command(rs, "show", cmd_retention_show, "the fleet's and tenant's policies", tenanted=True)
    sh.add_argument("--json", action="store_true")
    rm = command(rs, "rm", cmd_retention_rm, "remove a policy", tenanted=True)
    _scope(rm)


async def _where(pool: Any, a: argparse.Namespace) -> tuple[str | None, str | None]:
    from hango_worker.store.retention import agent_id

    if a.fleet:
        if a.agent or a.tenant_name:
            raise CliError("--fleet takes neither --tenant nor --agent")
        return None, None
    tid = await tenant_of(pool, a)
    return tid, (await agent_id(pool, tid, a.agent) if a.agent else None)


async def cmd_retention_set(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store.retention import set_policy

    seconds = {k: getattr(a, k) for k in RETENTION_KINDS if hasattr(a, k)}
    if not seconds:
        raise CliError("give at least one of " + ", ".join(f"--{k}" for k in RETENTION_KINDS))
    async with pool_for(s) as (_, pool):
        tenant, agent = await _where(pool, a)
        await set_policy(pool, tenant, agent, seconds)
    return exits.OK


def _fmt(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    for unit, n in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds and seconds % n == 0:
            return f"{seconds // n}{unit}"
    return f"{seconds}s"


async def cmd_retention_show(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store.retention import list_policies

    async with pool_for(s) as (_, pool):
        rows = await list_policies(pool, await tenant_of(pool, a))
    return print_rows(
        rows,
        a.json,
        lambda r: (
            f"{r['tenant'] or '(fleet)':<20} {r['agent'] or '*':<16} "
            + " ".join(f"{k}={_fmt(r[f'{k}_s'])}" for k in RETENTION_KINDS)
        ),
    )


async def cmd_retention_rm(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store.retention import remove_policy

    async with pool_for(s) as (_, pool):
        tenant, agent = await _where(pool, a)
        if not await remove_policy(pool, tenant, agent):
            raise CliError("no such policy", exits.NOT_FOUND)
    return exits.OK
