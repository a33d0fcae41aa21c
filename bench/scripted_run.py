"""One scripted agent's run through the real worker path (`serve(until_idle=True)`),
as the per-turn and parallel-tools benchmarks set it up: an agent of their own on the
scripted model, one run queued with the input "go", a worker that drains the queue."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from hango_worker.config import load_settings
from hango_worker.provider.types import Provider
from hango_worker.service import serve
from hango_worker.store import repo
from hango_worker.tool.registry import Registry


async def bench_agent(pool: asyncpg.Pool, tools: list[str], config: dict[str, Any]) -> str:
    """A new agent on the scripted model (a name of its own); its name."""
    name = f"bench-{uuid.uuid4().hex[:8]}"
    await repo.create_agent(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        name=name,
        model="scripted",
        system=["You are a benchmark agent."],
        tools=tools,
        config=config,
    )
    return name


async def enqueue_go(
    pool: asyncpg.Pool, agent: str, content: list[dict[str, Any]] | None = None
) -> str:
    """Queue one run of `agent` (with `content` blocks beside its text); its id."""
    if content is not None:
        r = await repo.enqueue_run(
            pool, tenant_id=repo.DEFAULT_TENANT_ID, agent=agent, input_text="go", content=content
        )
        return str(r.run_id)
    ids = await repo.enqueue(pool, tenant_id=repo.DEFAULT_TENANT_ID, agent=agent, input_text="go")
    return str(ids["run_id"])


async def drain(dsn: str, provider: Provider, registry: Registry, max_turns: int) -> None:
    """A worker in process until the queue is empty (metrics off, warnings only)."""
    settings = load_settings(
        database_url=dsn, metrics_port=0, max_turns=max_turns, log_level="WARNING"
    )
    await serve(settings, dsn, until_idle=True, provider=provider, registry=registry, logs=False)


async def run_status(pool: asyncpg.Pool | asyncpg.Connection, run_id: str) -> str:
    return str(await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id))
