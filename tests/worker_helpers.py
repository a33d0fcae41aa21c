"""Running the real worker in-process against the test database."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from hango_worker.config import Settings, load_settings
from hango_worker.provider.types import Provider
from hango_worker.run.worker import WorkerStats
from hango_worker.service import serve
from hango_worker.store import repo, sql
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool


def settings(dsn: str, **over: Any) -> Settings:
    base: dict[str, Any] = {
        "database_url": dsn,
        "poll_interval_s": 0.2,
        "metrics_port": 0,
        "lease_s": 30,
        "model_retries": 2,
        "worker_concurrency": 4,
    }
    base.update(over)
    return load_settings(**base)


async def make_agent(
    pool: asyncpg.Pool,
    name: str = "agent",
    tools: Sequence[str] = ("echo",),
    config: dict[str, Any] | None = None,
) -> None:
    await repo.create_agent(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        name=name,
        model="claude-test",
        system=["Be brief."],
        tools=list(tools),
        config=config or {},
    )


async def enqueue(
    pool: asyncpg.Pool, text: str = "go", agent: str = "agent", session_id: str | None = None
) -> str:
    ids = await repo.enqueue(
        pool, tenant_id=repo.DEFAULT_TENANT_ID, agent=agent, input_text=text, session_id=session_id
    )
    return ids["run_id"]


async def enqueue_and_claim(
    pool: asyncpg.Pool, n: int, worker: str, lease_s: float = 30.0
) -> list[asyncpg.Record]:
    """`n` runs of a new agent, enqueued and claimed at once by `worker` (sql.CLAIM)."""
    await make_agent(pool)
    for i in range(n):
        await enqueue(pool, f"run {i}")
    rows = await pool.fetch(sql.CLAIM, worker, n, lease_s)
    assert len(rows) == n
    return list(rows)


async def run_until_idle(
    dsn: str, provider: Provider, tools: Sequence[Tool] = (), **over: Any
) -> WorkerStats:
    registry = Registry(
        [*Registry.default(load_entry_points=False).view(["calculator", "current_time"]), *tools]
    )
    return await serve(
        settings(dsn, **over),
        dsn,
        until_idle=True,
        provider=provider,
        registry=registry,
        logs=False,
    )


async def details(pool: asyncpg.Pool, run_id: str) -> dict[str, Any]:
    return await repo.run_details(pool, repo.DEFAULT_TENANT_ID, run_id)
