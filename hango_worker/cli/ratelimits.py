"""`ratelimits set|list|rm`: the fleet-wide model rate limits (store/ratelimits.py),
used by workers started with HANGO_RATE_LIMIT_KEY."""

from __future__ import annotations

import argparse
from typing import Any

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import int_between, name
from hango_worker.cli.output import out, print_rows
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.store import ratelimits as rl

_PER_MINUTE = int_between(1, rl.MAX_PER_MINUTE)


def _seconds(value: str) -> float:
    try:
        s = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not 0.001 <= s <= 3600:
        raise argparse.ArgumentTypeError(f"{s} is out of range: must be 0.001-3600")
    return s


def register(sub: Subcommands) -> None:
    rs = group(
        sub, "ratelimits", "fleet-wide model rate limits (token buckets shared by all workers)"
    )
    st = command(rs, "set", cmd_ratelimits_set, "create or change a key's limits", tenanted=False)
    st.add_argument("key", type=name, help="as HANGO_RATE_LIMIT_KEY names it, e.g. anthropic")
    st.add_argument("--rpm", type=_PER_MINUTE, help="requests per minute")
    st.add_argument("--input-tpm", type=_PER_MINUTE, help="input tokens per minute")
    st.add_argument("--output-tpm", type=_PER_MINUTE, help="output tokens per minute")
    st.add_argument(
        "--window-s", type=_seconds, default=60.0, help="bucket size in seconds of rate (60)"
    )
    st.add_argument("--json", action="store_true")
    ls = command(rs, "list", cmd_ratelimits_list, "keys, limits and current levels", tenanted=False)
    ls.add_argument("--json", action="store_true")
    rm = command(
        rs,
        "rm",
        cmd_ratelimits_rm,
        "remove a key's limits (its calls go unlimited)",
        tenanted=False,
    )
    rm.add_argument("key", type=name)


async def cmd_ratelimits_set(s: Settings, a: argparse.Namespace) -> int:
    try:
        async with pool_for(s) as (_, pool):
            row = await rl.set_rate_limit(
                pool,
                a.key,
                requests_per_minute=a.rpm,
                input_tokens_per_minute=a.input_tpm,
                output_tokens_per_minute=a.output_tpm,
                window_s=a.window_s,
            )
    except ValueError as e:
        raise CliError(str(e)) from None
    if a.json:
        out(row)
    else:
        print(_limits(row))
    return exits.OK


async def cmd_ratelimits_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        rows = await rl.list_rate_limits(pool)
    return print_rows(
        rows, a.json, lambda r: f"{_limits(r)} blocked_until={r['blocked_until'] or '-'}"
    )


def _limits(r: dict[str, Any]) -> str:
    return (
        f"{r['key']}: rpm={r['requests_per_minute']} input_tpm={r['input_tokens_per_minute']} "
        f"output_tpm={r['output_tokens_per_minute']} window_s={r['window_s']}"
    )


async def cmd_ratelimits_rm(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        await rl.remove_rate_limit(pool, a.key)
    return exits.OK
