"""Following a run live from any process: its events as they are committed, and the
model's text as it streams (batched NOTIFYs on `hango_text`), until the run ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import asyncpg

from hango_worker.render import LiveView
from hango_worker.store import db, repo
from hango_worker.store.sql import TEXT_CHANNEL
from hango_worker.vocab import FINISHED


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
    listener = await db.connect(dsn)

    def on_text(conn: object, pid: int, channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):  # not ours: ignored
            msg = json.loads(payload)
            if msg["run_id"] == run_id and isinstance(msg["text"], str):
                view.delta(run_id, msg["text"], offset=int(msg["offset"]))

    await listener.add_listener(TEXT_CHANNEL, on_text)
    try:
        async with asyncio.timeout(timeout_s):
            return await _follow(pool, tenant_id, run_id, view, poll_s)
    finally:
        await listener.close()


async def _follow(
    pool: asyncpg.Pool, tenant_id: str, run_id: str, view: LiveView, poll_s: float
) -> dict[str, Any]:
    seen = 0
    while True:
        run = await repo.get_run(pool, tenant_id, run_id)
        for e in await repo.run_events(pool, run_id, after=seen):
            view.event(e)
            seen = e["seq"]
        if run["status"] in FINISHED:
            return run
        await asyncio.sleep(poll_s)
