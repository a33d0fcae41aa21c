"""`hango-worker` — the command line: run the service, migrate, enqueue, inspect."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from hango_worker.config import ConfigError, Settings, load_settings
from hango_worker.render import LiveView, Painter, print_run
from hango_worker.store import db, embedded, migrate, repo
from hango_worker.tool.registry import ToolLoadError


class CliError(Exception):
    pass


@asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[str]:
    """The DSN to use: HANGO_DATABASE_URL, or the embedded server under HANGO_DATA_DIR."""
    if settings.database_url:
        yield settings.database_url
        return
    try:
        _server, dsn = await asyncio.to_thread(embedded.start, settings.data_dir)
    except Exception as e:
        raise CliError(f"could not start the embedded Postgres in {settings.data_dir}: {e}") from e
    where = settings.data_dir.resolve()
    print(
        f"HANGO_DATABASE_URL is unset: using an embedded development database in {where}",
        file=sys.stderr,
    )
    yield dsn


@asynccontextmanager
async def pool_for(settings: Settings, *, size: int = 4) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    async with database(settings) as dsn:
        try:
            pool = await db.create_pool(dsn, min_size=1, max_size=size)
        except (OSError, asyncpg.PostgresError) as e:
            raise CliError(f"cannot connect to Postgres at {db.redact(dsn)}: {e}") from e
        try:
            yield dsn, pool
        except asyncpg.UndefinedTableError:
            raise CliError("the database is not migrated: run `hango-worker migrate`") from None
        finally:
            await pool.close()


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


# -- commands -----------------------------------------------------------------------------


async def cmd_migrate(s: Settings, a: argparse.Namespace) -> int:
    async with database(s) as dsn:
        await migrate.upgrade_and_seed(dsn)
    print(f"migrated to {migrate.head_revision()}")
    return 0


async def cmd_agents_create(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.agent.spec import AgentConfig

    try:
        cfg = AgentConfig.model_validate(json.loads(a.config)).model_dump(exclude_none=True)
    except (ValueError, TypeError) as e:
        raise CliError(f"--config is not a valid agent config: {e}") from None
    async with pool_for(s) as (_, pool):
        tenant = await repo.ensure_default_tenant(pool)
        agent_id = await repo.create_agent(
            pool,
            tenant_id=tenant,
            name=a.name,
            model=a.model,
            system=a.system or [],
            tools=a.tool or [],
            config=cfg,
        )
    print(agent_id)
    return 0


async def cmd_agents_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        agents = await repo.list_agents(pool, repo.DEFAULT_TENANT_ID)
    if a.json:
        print(_json(agents))
    for ag in [] if a.json else agents:
        print(f"{ag['id']}  {ag['name']:<20} {ag['model']:<28} tools={','.join(ag['tools'])}")
    return 0


async def cmd_enqueue(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        ids = await repo.enqueue(
            pool,
            tenant_id=repo.DEFAULT_TENANT_ID,
            agent=a.agent,
            input_text=a.input,
            session_id=a.session,
        )
    print(_json(ids) if a.json else ids["run_id"])
    return 0


async def cmd_runs_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        runs = await repo.list_runs(pool, repo.DEFAULT_TENANT_ID, status=a.status, limit=a.limit)
    if a.json:
        print(_json(runs))
        return 0
    for r in runs:
        err = f"  {r['error'].get('type')}" if r["error"] else ""
        print(
            f"{r['id']}  {r['status']:<9} {r['agent']:<16} attempt={r['attempt']} "
            f"{r['created_at']}{err}"
        )
    return 0


async def cmd_runs_show(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        run = await repo.run_details(pool, repo.DEFAULT_TENANT_ID, a.run_id)
    if a.json:
        print(_json(run))
    else:
        print_run(Painter(), run)
    return 0


async def cmd_runs_cancel(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        status = await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, a.run_id)
    print("cancelled" if status == "cancelled" else "cancel requested (at the next turn boundary)")
    return 0


async def cmd_runs_resume(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        await repo.resume(pool, repo.DEFAULT_TENANT_ID, a.run_id)
    print("queued")
    return 0


async def cmd_runs_watch(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.watch import watch

    async with pool_for(s) as (dsn, pool):
        run = await watch(pool, dsn, repo.DEFAULT_TENANT_ID, a.run_id, LiveView(Painter()))
    return 0 if run["status"] == "succeeded" else 1


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
    return 0


async def cmd_run(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.service import serve

    async with database(s) as dsn:
        stats = await serve(s, dsn, until_idle=a.until_idle, install_signals=True)
    print(json.dumps({"claimed": stats.claimed, "finished": stats.finished}), file=sys.stderr)
    return 0


async def cmd_demo(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.demo import demo

    return await demo(s)


def fake_anthropic(a: argparse.Namespace) -> int:
    """Runs outside asyncio: the fake server owns its own loop and signal handling."""
    from hango_worker.provider.scripted import ScriptError
    from hango_worker.testing.fake_anthropic import serve_forever

    try:
        serve_forever(a.port, a.script)
    except ScriptError as e:
        raise CliError(str(e)) from None
    return 0


# -- parser -------------------------------------------------------------------------------

Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hango-worker",
        description="Durable run-worker for LLM agents on Postgres. Configured by HANGO_* "
        "environment variables (see README).",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, fn: Handler, help: str, parent: Any = sub) -> argparse.ArgumentParser:
        sp: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
        sp.set_defaults(fn=fn)
        return sp

    r = cmd("run", cmd_run, "run the worker service")
    r.add_argument("--until-idle", action="store_true", help="exit once nothing is queued")
    cmd("migrate", cmd_migrate, "migrate the database to the latest schema")
    cmd("demo", cmd_demo, "start an embedded Postgres and run a demo agent end to end")
    e = cmd("enqueue", cmd_enqueue, "queue a run; prints its id")
    e.add_argument("--agent", required=True, help="agent name or id")
    e.add_argument("--input", required=True, help="the user's message")
    e.add_argument("--session", help="continue this session's history")
    e.add_argument("--json", action="store_true")

    _agents_and_runs(sub, cmd)

    g = cmd("gc", cmd_gc, "delete finished runs' events (and with --runs the runs) older than AGE")
    g.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 45m")
    g.add_argument("--runs", action="store_true", help="also delete the runs themselves")
    g.add_argument("--batch-size", type=int, default=1000, help="rows per short transaction")
    g.add_argument("--tenant", help="only this tenant (default: all)")

    fa = sub.add_parser("fake-anthropic", help="serve the fake Anthropic API (for tests)")
    fa.set_defaults(fn=None, sync=fake_anthropic)
    fa.add_argument("--port", type=int, default=8765)
    fa.add_argument("--script", required=True, help="JSON list of scripted responses")
    return p


def _agents_and_runs(sub: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    ag = sub.add_parser("agents", help="create and list agents").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c = cmd("create", cmd_agents_create, "create an agent; prints its id", ag)
    c.add_argument("--name", required=True)
    c.add_argument("--model", required=True, help="e.g. claude-sonnet-4-6")
    c.add_argument("--system", action="append", help="a system prompt block (repeatable)")
    c.add_argument("--tool", action="append", help="an allowed tool (repeatable; none = no tools)")
    c.add_argument("--config", default="{}", help='JSON, e.g. {"max_turns": 20}')
    cmd("list", cmd_agents_list, "list agents", ag).add_argument("--json", action="store_true")

    rs = sub.add_parser("runs", help="inspect and control runs").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    ls = cmd("list", cmd_runs_list, "recent runs", rs)
    ls.add_argument("--status", choices=["queued", "running", "succeeded", "failed", "cancelled"])
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--json", action="store_true")
    for name, fn, h in (
        ("show", cmd_runs_show, "status, attempt, transcript, state, events, error"),
        ("watch", cmd_runs_watch, "follow a run live until it ends"),
        ("cancel", cmd_runs_cancel, "cancel a run (at its next turn boundary)"),
        ("resume", cmd_runs_resume, "re-queue a cancelled or failed run from its checkpoint"),
    ):
        sp = cmd(name, fn, h, rs)
        sp.add_argument("run_id")
        if name == "show":
            sp.add_argument("--json", action="store_true")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.fn is None:
            sync: Callable[[argparse.Namespace], int] = args.sync
            return sync(args)
        settings = load_settings()
        code: int = asyncio.run(args.fn(settings, args))
        return code
    except (ConfigError, CliError, repo.NotFound, repo.Conflict, ToolLoadError) as e:
        print(f"hango-worker: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main())
