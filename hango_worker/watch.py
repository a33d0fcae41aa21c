"""Following a run live: its events as they are written, until it ends."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from hango_worker.render import LiveView
from hango_worker.store import repo

FINISHED = ("succeeded", "failed", "cancelled")


async def watch(
    pool: asyncpg.Pool,
    dsn: str,
    tenant_id: str,
    run_id: str,
    view: LiveView,
    *,
    poll_s: float = 0.1,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """Print each event of the run as it lands; returns the finished run."""
    await repo.get_run(pool, tenant_id, run_id)  # NotFound for a bad id / other tenant
    seen = 0
    async with asyncio.timeout(timeout_s):
        while True:
            for e in await repo.run_events(pool, run_id, after=seen):
                view.event(e)
                seen = e["seq"]
            run = await repo.get_run(pool, tenant_id, run_id)
            if run["status"] in FINISHED:
                for e in await repo.run_events(pool, run_id, after=seen):
                    view.event(e)
                return run
            await asyncio.sleep(poll_s)
