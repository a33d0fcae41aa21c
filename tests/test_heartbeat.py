"""The heartbeat statement (sql.HEARTBEAT): renews only the leases the worker still holds,
reports cancels, and locks its runs in primary-key order (as a group commit does)."""

from __future__ import annotations

import asyncio

import asyncpg

from hango_worker.store import sql
from tests.worker_helpers import enqueue_and_claim

WORKER = "hb-worker"


async def _claimed(pool: asyncpg.Pool, n: int) -> list[str]:
    return sorted(str(r["id"]) for r in await enqueue_and_claim(pool, n, WORKER, 5.0))


async def test_it_renews_held_leases_only_and_reports_cancels(pool: asyncpg.Pool) -> None:
    a, b, c = await _claimed(pool, 3)
    await pool.execute("UPDATE runs SET lease_owner = 'thief' WHERE id = $1", b)
    await pool.execute("UPDATE runs SET cancel_requested = true WHERE id = $1", c)
    rows = await pool.fetch(sql.HEARTBEAT, WORKER, 600.0, [a, b, c])
    assert {r["id"]: r["cancel_requested"] for r in rows} == {a: False, c: True}
    left = await pool.fetch(
        "SELECT id::text, lease_expires_at > now() + interval '60 seconds' AS renewed "
        "FROM runs ORDER BY id"
    )
    assert {r["id"]: r["renewed"] for r in left} == {a: True, b: False, c: True}


async def test_it_locks_its_runs_in_primary_key_order(pool: asyncpg.Pool, dsn: str) -> None:
    low, high = await _claimed(pool, 2)
    # whatever the plan: the lower run's row version is the newest in the heap, and the
    # heartbeat's connection may not use an index scan (heap order, not key order)
    await pool.execute("UPDATE runs SET input = input WHERE id = $1", low)
    beater = await asyncpg.connect(dsn)
    await beater.execute("SET enable_indexscan = off; SET enable_indexonlyscan = off")
    async with pool.acquire() as other, other.transaction():
        # another transaction holds the higher run: the heartbeat, taking the lower
        # one first, waits there holding it
        await other.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", high)
        beat = asyncio.ensure_future(beater.fetch(sql.HEARTBEAT, WORKER, 600.0, [high, low]))
        await asyncio.sleep(0.3)
        assert not beat.done()
        try:
            await other.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE NOWAIT", low)
        except asyncpg.LockNotAvailableError:
            pass
        else:
            raise AssertionError("the heartbeat did not lock the lower run first")
    assert len(await beat) == 2
    await beater.close()
