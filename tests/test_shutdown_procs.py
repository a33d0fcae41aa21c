"""`hango-worker run` processes stopped by SIGTERM at the worst moments: during a tool
call stuck in its thread, during a wait for the fleet rate limit, while the database
keeps the run's writes waiting. Each time the process exits by itself (code 0, not the
watchdog's STUCK_EXIT) within HANGO_SHUTDOWN_GRACE_S + PROCESS_BOUND_S, and no run it held
is left `running` without a lease that expires (docs/system-architecture.md,
"Graceful shutdown")."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg

from hango_worker.service import PROCESS_BOUND_S
from hango_worker.store import ratelimits
from hango_worker.testing.chaos_tools import ensure_table
from tests.procs import start_worker, stderr_of, stop_worker, wait_all_finished, worker_env
from tests.worker_helpers import enqueue, make_agent

GRACE_S = 1.0
BOUND_S = GRACE_S + PROCESS_BOUND_S  # what `hango-worker run` promises


async def _setup(pool: asyncpg.Pool, tmp: Path, turns: list[dict[str, Any]], tools: list[str]):
    await ensure_table(pool)
    path = tmp / "script.json"
    path.write_text(json.dumps(turns))
    await make_agent(pool, tools=tools)
    return path, await enqueue(pool, "go")


async def _until(check: Any, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def _row(pool: asyncpg.Pool, run_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        "SELECT status, lease_owner, lease_expires_at, lost_count FROM runs WHERE id = $1", run_id
    )


async def test_sigterm_during_a_tool_stuck_in_its_thread(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    marker = tmp_path / "hang-started"
    turns = [{"tool_calls": [{"name": "hang", "input": {"marker": str(marker)}}]}, {"text": "ok"}]
    path, run_id = await _setup(pool, tmp_path, turns, ["hang"])
    a = await start_worker(worker_env(dsn, path, HANGO_SHUTDOWN_GRACE_S=str(GRACE_S)))

    async def started() -> bool:
        return marker.exists()

    await _until(started)
    # the thread never returns: the run is cancelled after the grace and handed back, and
    # the thread (a daemon) does not keep the process alive
    assert await stop_worker(a, timeout=BOUND_S + 10) == 0, stderr_of(a)
    r = await _row(pool, run_id)
    assert (r["status"], r["lease_owner"], r["lost_count"]) == ("queued", None, 0)


async def test_sigterm_during_a_wait_for_the_rate_limit(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    path, run_id = await _setup(pool, tmp_path, [{"text": "never"}], [])
    await ratelimits.set_rate_limit(pool, "anthropic", requests_per_minute=60)
    await pool.execute(
        "UPDATE rate_limits SET blocked_until = now() + interval '10 minutes', "
        "updated_at = now() - interval '1 hour'"
    )
    env = worker_env(dsn, path, HANGO_RATE_LIMIT_KEY="anthropic", HANGO_SHUTDOWN_GRACE_S="30")
    a = await start_worker(env)

    async def refused() -> bool:  # RATE_TAKE stamps updated_at: asked, refused, sleeping
        return bool(
            await pool.fetchval("SELECT updated_at > now() - interval '1 minute' FROM rate_limits")
        )

    await _until(refused)
    assert await stop_worker(a, timeout=30 + PROCESS_BOUND_S + 10) == 0, stderr_of(a)
    r = await _row(pool, run_id)
    assert (r["status"], r["lease_owner"], r["lost_count"]) == ("queued", None, 0)
    last = await pool.fetchval(
        "SELECT payload->>'status' FROM run_events WHERE run_id = $1 AND type = 'run_finished' "
        "ORDER BY seq DESC LIMIT 1",
        run_id,
    )
    assert last == "released", "handed back from its wait, not cancelled after the grace"


async def test_sigterm_while_the_database_keeps_the_runs_writes_waiting(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    turns = [{"tool_calls": [{"name": "pause", "input": {"seconds": 1.0}}]}, {"text": "done"}]
    path, run_id = await _setup(pool, tmp_path, turns, ["pause"])
    env = worker_env(dsn, path, HANGO_SHUTDOWN_GRACE_S=str(GRACE_S))
    a = await start_worker(env)
    locker = await asyncpg.connect(dsn)
    try:

        async def pausing() -> bool:
            return bool(await pool.fetchval("SELECT count(*) FROM chaos_exec"))

        await _until(pausing)
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", run_id)

        async def blocked() -> bool:  # the tool returned; recording its result waits
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            )

        await _until(blocked)
        assert await stop_worker(a, timeout=BOUND_S + 10) == 0, stderr_of(a)
        await tx.rollback()
    finally:
        await locker.close()
    r = await _row(pool, run_id)
    # nothing could land: the run keeps a lease that expires, and is taken over
    assert r["status"] == "running" and r["lease_expires_at"] is not None
    b = await start_worker(env)
    try:
        (row,) = await wait_all_finished(pool, [run_id], timeout=60)
    finally:
        await stop_worker(b)
    assert row["status"] == "succeeded"
