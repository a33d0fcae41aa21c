"""`memory ls|show|rm`: agents' long-term memory files in the tenant, by scope: an
agent's own, one session's, or one caller's (store/memories.py)."""

from __future__ import annotations

import argparse
import json

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.inputs import MAX_LIMIT, a_uuid, int_between, memory_key, memory_path, text
from hango_worker.cli.output import out
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.render import safe
from hango_worker.store import memories


def register(sub: Subcommands) -> None:
    mem = group(
        sub,
        "memory",
        "inspect and remove agents' long-term memory files",
        description="Memory files of this tenant. Scope: an agent's own memory, or with "
        "--session one session's, or with --key one caller's (memory_scope 'key').",
    )
    ls = command(
        mem, "ls", cmd_memory_ls, "list memory files (path, scope, size, version)", tenanted=True
    )
    _scoped(ls, agent_required=False)
    ls.add_argument("--limit", type=int_between(1, MAX_LIMIT), default=1000, help=f"1-{MAX_LIMIT}")
    for verb, fn, h in (
        ("show", cmd_memory_show, "print one memory file"),
        ("rm", cmd_memory_rm, "delete one memory file"),
    ):
        sp = command(mem, verb, fn, h, tenanted=True)
        sp.add_argument("path", type=memory_path, help="e.g. /memories/notes.md")
        _scoped(sp, agent_required=True)


def _scoped(sp: argparse.ArgumentParser, agent_required: bool) -> None:
    sp.add_argument("--agent", required=agent_required, type=text, help="agent name or id")
    which = sp.add_mutually_exclusive_group()
    which.add_argument("--session", type=a_uuid("a session id"), help="a session's memory")
    which.add_argument("--key", type=memory_key, help="a caller's memory (its memory key)")
    sp.add_argument("--json", action="store_true")


async def cmd_memory_ls(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        files = await memories.list_memories(
            pool,
            await tenant_of(pool, a),
            agent=a.agent,
            session_id=a.session,
            key=a.key,
            limit=a.limit,
        )
    if a.json:
        out(files)
        return exits.OK
    for f in files:
        scope = f"{f['scope']}:{f['scope_key']}" if f["scope_key"] else f["scope"]
        print(
            safe(
                f"{f['agent']:<16} {scope:<24} v{f['version']:<4} {f['size']:>6}B  "
                f"{f['updated_at']}  {f['path']}"
            )
        )
    return exits.OK


async def cmd_memory_show(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        f = await memories.get_memory(
            pool,
            await tenant_of(pool, a),
            agent=a.agent,
            path=a.path,
            session_id=a.session,
            key=a.key,
        )
    if a.json:
        out(f)
    else:
        print(safe(f["content"]), end="" if f["content"].endswith("\n") else "\n")
    return exits.OK


async def cmd_memory_rm(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        version = await memories.delete_memory(
            pool,
            await tenant_of(pool, a),
            agent=a.agent,
            path=a.path,
            session_id=a.session,
            key=a.key,
        )
    gone = {"path": a.path, "deleted_version": version}
    print(json.dumps(gone) if a.json else f"deleted {a.path} (version {version})")
    return exits.OK
