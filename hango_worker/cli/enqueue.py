"""`hango-worker enqueue`: queue a run (its message, attachments, limits, parameters)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import asyncpg

from hango_worker.cli import exits
from hango_worker.cli.attach import given_text, read_content
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import a_uuid, int_between, json_arg, memory_key, read_input, text
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings
from hango_worker.store import repo
from hango_worker.store.repo import MAX_PRIORITY


def register(sub: Subcommands) -> None:
    e = command(sub, "enqueue", cmd_enqueue, "queue a run; prints its id", tenanted=True)
    e.add_argument(
        "--priority",
        type=int_between(0, MAX_PRIORITY),
        default=0,
        help=f"0-{MAX_PRIORITY} (default 0); within the tenant, higher is claimed first",
    )
    e.add_argument("--agent", required=True, type=text, help="agent name or id")
    given = e.add_mutually_exclusive_group()
    given.add_argument("--input", type=text, help="the user's message ('-': read stdin)")
    given.add_argument("--input-file", type=text, metavar="PATH", help="read it from a file")
    e.add_argument(
        "--attach",
        action="append",
        type=text,
        metavar="PATH",
        help="an image (PNG, JPEG, GIF, WebP) or PDF beside the message; repeatable",
    )
    e.add_argument(
        "--input-json",
        type=text,
        metavar="FILE",
        help="content blocks as JSON (a list, or {\"content\": [...]}; '-': stdin)",
    )
    e.add_argument("--session", type=a_uuid("a session id"), help="continue its history")
    e.add_argument(
        "--limits",
        type=text,
        metavar="JSON",
        help='this run\'s own limits, e.g. {"max_turns": 10, "max_output_tokens": 20000}',
    )
    e.add_argument(
        "--params",
        type=text,
        metavar="JSON",
        help="Messages API parameters for this run, over the agent's config, e.g. "
        '{"thinking": {"type": "enabled", "budget_tokens": 2048}}',
    )
    e.add_argument(
        "--memory-key",
        type=memory_key,
        help="whose memory the run uses when its agent's memory_scope is 'key' (e.g. a user id)",
    )
    e.add_argument("--json", action="store_true")


async def cmd_enqueue(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.agent.limits import parse_overrides

    content = read_content(a.attach, a.input_json)
    if content is None and not given_text(a):
        raise CliError("enqueue: give --input, --input-file, --attach or --input-json")
    text = read_input(a.input, a.input_file) if content is None or given_text(a) else ""
    limits = None
    if a.limits is not None:
        try:
            limits = parse_overrides(json_arg(a.limits, "--limits"))
        except ValueError as e:
            raise CliError(f"--limits: {e}") from None
    params = None if a.params is None else json_arg(a.params, "--params")
    async with pool_for(s) as (_, pool):
        tenant_id = await tenant_of(pool, a)
        if params is not None:
            params = await _run_params(pool, tenant_id, a.agent, params)
        try:
            r = await repo.enqueue_run(
                pool,
                tenant_id=tenant_id,
                agent=a.agent,
                input_text=text,
                session_id=a.session,
                limits=limits,
                memory_key=a.memory_key,
                priority=a.priority,
                params=params,
                content=content,
            )
        except ValueError as e:  # refused by the producer API (QH003): one line, exit 2
            raise CliError(str(e)) from None
    ids = {"run_id": r.run_id, "session_id": r.session_id}
    print(json.dumps(ids) if a.json else ids["run_id"])
    return exits.OK


async def _run_params(
    pool: asyncpg.Pool, tenant_id: str, agent: str, params: Any
) -> dict[str, Any]:
    """`--params` checked against the agent's config (agent/spec.py check_run_params)."""
    from hango_worker.agent.spec import check_run_params

    try:
        return check_run_params(await repo.agent_config(pool, tenant_id, agent), params)
    except ValueError as e:
        raise CliError(f"--params: {e}") from None
