"""`make demo`: embedded Postgres → migrate → demo agent → enqueue → worker → live view."""

from __future__ import annotations

import os
import time

from hango_worker.config import Settings
from hango_worker.render import BOLD, DIM, LiveView, Painter
from hango_worker.run.providers import make_provider
from hango_worker.store import db, migrate, repo

DEMO_AGENT = "demo"
DEMO_MODEL = "claude-sonnet-4-6"
DEMO_INPUT = "What time is it now, and how many seconds are there in a leap year?"
DEMO_SYSTEM = [
    "You are a careful assistant. Use your tools for facts and arithmetic; plan multi-step "
    "work with write_todos."
]


async def _prepare(dsn: str) -> str:
    await migrate.upgrade(dsn, "head")
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    try:
        tenant = await repo.ensure_default_tenant(pool)
        try:
            await repo.find_agent(pool, tenant, DEMO_AGENT)
        except repo.NotFound:
            await repo.create_agent(
                pool,
                tenant_id=tenant,
                name=DEMO_AGENT,
                model=DEMO_MODEL,
                system=DEMO_SYSTEM,
                tools=["write_todos", "current_time", "calculator"],
                config={"max_turns": 12},
            )
        ids = await repo.enqueue(pool, tenant_id=tenant, agent=DEMO_AGENT, input_text=DEMO_INPUT)
    finally:
        await pool.close()
    return ids["run_id"]


async def demo(settings: Settings) -> int:
    from hango_worker.service import serve

    p = Painter()
    provider = make_provider(settings, demo=True, chunk_delay_s=0.03)
    label = getattr(provider, "label", f"Claude via the Anthropic API ({provider.name})")
    p.line(p("hango-worker demo", BOLD) + p(f" — model: {label}", DIM))
    started = time.perf_counter()
    async with db.resolve(settings.database_url, settings.data_dir) as dsn:
        p.line(p(f"database: {db.redact(dsn)}", DIM))
        run_id = await _prepare(dsn)
        p.line(p(f"enqueued run {run_id}", DIM))
        p.line(f"user: {DEMO_INPUT}")
        view = LiveView(p, run_id)
        quiet = settings.model_copy(update={"log_level": "WARNING", "metrics_port": 0})
        await serve(quiet, dsn, until_idle=True, provider=provider, observer=view)
        pool = await db.create_pool(dsn, min_size=1, max_size=2)
        try:
            run = await repo.get_run(pool, repo.DEFAULT_TENANT_ID, run_id)
        finally:
            await pool.close()
    p.line(f"status: {p(run['status'], BOLD)} in {time.perf_counter() - started:.1f}s")
    p.line(p(f"inspect it: hango-worker runs show {run_id}", DIM))
    if os.environ.get("HANGO_DATA_DIR") is None and not settings.database_url:
        p.line(p(f"(data kept in {settings.data_dir}/; `make clean` removes it)", DIM))
    return 0 if run["status"] == "succeeded" else 1
