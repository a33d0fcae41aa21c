"""The command handlers: each returns its exit code (see `exits`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import asyncpg
from pydantic import ValidationError

from hango_worker.cli import exits, migrating
from hango_worker.cli.attach import given_text, read_content
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import check_tools, json_arg, read_input
from hango_worker.cli.show import JsonLines, showable
from hango_worker.config import Settings
from hango_worker.render import LiveView, Painter, print_run, safe
from hango_worker.store import db, memories, repo


def database(settings: Settings) -> AbstractAsyncContextManager[str]:
    """The DSN to use: HANGO_DATABASE_URL, or the embedded server under HANGO_DATA_DIR."""
    return db.resolve(settings.database_url, settings.data_dir)


@asynccontextmanager
async def pool_for(settings: Settings, *, size: int = 4) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    async with database(settings) as dsn:
        pool = await db.open_pool(dsn, min_size=1, max_size=size)
        try:
            yield dsn, pool
        except asyncpg.UndefinedTableError:
            raise db.Unavailable(db.not_migrated(dsn)) from None
        finally:
            await pool.close()


async def tenant_of(pool: asyncpg.Pool, a: argparse.Namespace) -> str:
    """The tenant a command acts in: `--tenant NAME|ID`, else the default tenant."""
    from hango_worker.store.tenants import resolve_tenant

    return await resolve_tenant(pool, getattr(a, "tenant_name", None))


def out(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


def print_rows(rows: list[dict[str, Any]], as_json: bool, line: Callable[[Any], str]) -> int:
    """A listing: the rows as JSON (`--json`), else one `line(row)` each."""
    if as_json:
        out(rows)
    else:
        for r in rows:
            print(line(r))
    return exits.OK


async def cmd_migrate(s: Settings, a: argparse.Namespace) -> int:
    return await migrating.migrate_command(s, a)


def known_tools(settings: Settings) -> list[str]:
    """The registry's tools plus those middlewares provide (e.g. write_todos)."""
    from hango_worker.agent.stack import PROVIDED_TOOLS, StackConfig, default_stack
    from hango_worker.agent.state import State
    from hango_worker.tool.registry import Registry

    names = Registry.default(modules=settings.tool_modules).names()
    probe = State(run_id="", session_id="", agent_id="", tenant_id="")
    for mw in default_stack(StackConfig(allowlist=())):
        provide = getattr(mw, "provide_tools", None)
        if provide is not None:
            names += [t.name for t in provide(probe) if t.name not in names]
    return names + [t for t in PROVIDED_TOOLS if t not in names]


async def cmd_agents_create(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.agent.spec import AgentConfig, skills_problem

    try:
        cfg = AgentConfig.model_validate(json_arg(a.config, "--config")).model_dump(
            exclude_none=True
        )
    except ValidationError as e:
        why = "; ".join(
            f"{'.'.join(map(str, x['loc'])) or 'value'}: {x['msg']}" for x in e.errors()
        )
        raise CliError(f"--config is not a valid agent config: {why}") from None
    except (ValueError, TypeError) as e:
        raise CliError(f"--config is not valid JSON: {e}") from None
    tools = check_tools(a.tool or [], known_tools(s))
    if problem := skills_problem(tools, AgentConfig.model_validate(cfg)):
        raise CliError(f"--config: {problem} (add --tool load_skill)")
    async with pool_for(s) as (_, pool):
        tenant = await tenant_of(pool, a)
        agent_id = await repo.create_agent(
            pool,
            tenant_id=tenant,
            name=a.name,
            model=a.model,
            system=a.system or [],
            tools=tools,
            config=cfg,
        )
    print(json.dumps({"agent_id": agent_id}) if a.json else agent_id)
    return exits.OK


async def cmd_agents_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        agents = await repo.list_agents(pool, await tenant_of(pool, a))
    if a.json:
        out(agents)
        return exits.OK
    for ag in agents:
        print(f"{ag['id']}  {ag['name']:<20} {ag['model']:<28} tools={','.join(ag['tools'])}")
    return exits.OK


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
    if a.json:
        out(run)
        return exits.OK
    shown, problems = showable(run)
    print_run(Painter(), shown)
    for p in problems:
        print(f"hango-worker: malformed row shown as a marker: {p}", file=sys.stderr)
    return exits.OK


async def cmd_runs_files(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        files = await repo.run_files(pool, await tenant_of(pool, a), a.run_id)
    if a.json:
        out(files)
        return exits.OK
    for f in files:
        call = f["tool_use_id"] or "-"
        print(f"{safe(f['path'])}  {f['size']} bytes  {safe(call)}  {f['updated_at']}")
    return exits.OK


async def cmd_runs_file(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        f = await repo.run_file(pool, await tenant_of(pool, a), a.run_id, a.path)
    if a.json:
        out(f)
        return exits.OK
    content = safe(f["content"])
    print(content, end="" if content.endswith("\n") else "\n")
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


async def cmd_gc(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.store.gc import gc, parse_age

    try:
        age = parse_age(a.older_than)
    except ValueError as e:
        raise CliError(f"--older-than: {e}") from None
    async with pool_for(s) as (_, pool):
        result = await gc(
            pool, older_than=age, tenant_id=a.tenant, delete_runs=a.runs, batch_size=a.batch_size
        )
    print(json.dumps(dataclasses.asdict(result), default=str))
    return exits.OK


async def cmd_run(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.service import serve

    async with database(s) as dsn:
        stats = await serve(s, dsn, until_idle=a.until_idle, install_signals=True)
    print(json.dumps({"claimed": stats.claimed, "finished": stats.finished}), file=sys.stderr)
    return exits.OK


async def cmd_demo(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.demo import demo

    return await demo(s)
