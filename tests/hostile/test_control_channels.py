"""Control channels carry no authority (docs/operations.md, "Trust model"): a NOTIFY is
a hint to look; a worker acts only on what the run's row says."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
from prometheus_client import REGISTRY

from hango_worker.store import repo
from tests.helpers import call, scripted
from tests.test_shutdown import start, until, waiting_tool
from tests.worker_helpers import details, enqueue, make_agent

T = repo.DEFAULT_TENANT_ID


def _hints(result: str) -> float:
    return REGISTRY.get_sample_value("hango_cancel_hints_total", {"result": result}) or 0.0


async def _notify_as_nobody(pool: asyncpg.Pool, channel: str, payload: str) -> None:
    """NOTIFY from a role with no grants at all (any role that can connect can)."""
    role = f"hango_hostile_{uuid.uuid4().hex[:8]}"
    async with pool.acquire() as conn:
        await conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
        try:
            await conn.execute(f'SET ROLE "{role}"')
            await conn.execute("SELECT pg_notify($1, $2)", channel, payload)
            await conn.execute("RESET ROLE")
        finally:
            await conn.execute("RESET ROLE")
            await conn.execute(f'DROP ROLE "{role}"')


async def test_a_cancel_notify_from_a_role_with_no_grants_cancels_nothing(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Proves: the worker checks cancel_requested before acting on hango_cancel."""
    await make_agent(pool, tools=["wait"])
    run_id = await enqueue(pool)
    release, started = asyncio.Event(), asyncio.Event()
    model = scripted({"tool_calls": [call("wait")]}, {"text": "finished"})
    w = await start(dsn, model, [waiting_tool("wait", release, started)], until_idle=True)
    await asyncio.wait_for(started.wait(), 30)
    ignored = _hints("ignored")
    await _notify_as_nobody(pool, "hango_cancel", run_id)
    await until(lambda: asyncio.sleep(0, _hints("ignored") > ignored))  # looked, ignored
    release.set()
    await w.stopped(60)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", "a bare NOTIFY cancelled the run"


async def test_a_cancel_through_the_api_is_acted_on_at_once(pool: asyncpg.Pool, dsn: str) -> None:
    """Proves the other half: the durable request (hango_api.cancel) still cancels a
    running run promptly, through the same hint."""
    await make_agent(pool, tools=["wait"])
    run_id = await enqueue(pool)
    release, started = asyncio.Event(), asyncio.Event()
    model = scripted({"tool_calls": [call("wait")]}, {"text": "never"})
    tool = waiting_tool("wait", release, started)
    # a long lease: no heartbeat (every lease / 3) can see the flag before the hint does
    w = await start(dsn, model, [tool], until_idle=True, lease_s=300)
    await asyncio.wait_for(started.wait(), 30)
    acted = _hints("acted")
    assert await repo.request_cancel(pool, T, run_id) == "running"  # at its next boundary
    await w.stopped(60)
    assert (await details(pool, run_id))["status"] == "cancelled"
    assert _hints("acted") - acted == 1
