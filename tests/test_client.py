"""The producer API: typed results, idempotency keys, enqueue in the caller's
transaction, and wait woken by the run's terminal notification."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from hango_worker.client import Client, EnqueueResult, enqueue
from hango_worker.store import repo
from hango_worker.store.sql import DONE_CHANNEL
from tests.helpers import scripted
from tests.worker_helpers import make_agent, run_until_idle


async def test_enqueue_returns_a_typed_result_and_honours_the_idempotency_key(
    pool: asyncpg.Pool,
) -> None:
    await make_agent(pool, tools=[])
    client = Client(pool)
    first = await client.enqueue("agent", "charge order 7", idempotency_key="order-7")
    assert isinstance(first, EnqueueResult) and first.created
    assert first["run_id"] == first.run_id  # dict-style access still works
    again = await client.enqueue("agent", "charge order 7", idempotency_key="order-7")
    assert again == EnqueueResult(first.run_id, first.session_id, created=False)
    other = await client.enqueue("agent", "charge order 8", idempotency_key="order-8")
    plain = await client.enqueue("agent", "no key")
    assert len({first.run_id, other.run_id, plain.run_id}) == 3
    assert await pool.fetchval("SELECT count(*) FROM runs") == 3
    assert await pool.fetchval("SELECT count(*) FROM sessions") == 3
    # the same key in another tenant is another run
    tenant = "00000000-0000-0000-0000-0000000000bb"
    await pool.execute("INSERT INTO tenants (id, name) VALUES ($1, 'b')", tenant)
    await repo.create_agent(
        pool, tenant_id=tenant, name="agent", model="m", system=[], tools=[], config={}
    )
    theirs = await Client(pool, tenant).enqueue("agent", "x", idempotency_key="order-7")
    assert theirs.created and theirs.run_id != first.run_id
    for bad in ("", "k" * 201):
        with pytest.raises(ValueError, match="an idempotency key must be 1 to 200 characters"):
            await client.enqueue("agent", "x", idempotency_key=bad)


async def test_enqueue_in_the_callers_transaction_commits_or_rolls_back_with_it(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    conn = await asyncpg.connect(dsn)  # the caller's own connection: no codecs of ours
    try:
        await conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES (1)")
                await enqueue(conn, agent="agent", input="order 1")
                raise RuntimeError("the business write failed")
        assert await pool.fetchval("SELECT count(*) FROM runs") == 0
        assert await pool.fetchval("SELECT count(*) FROM sessions") == 0
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES (2)")
            r = await Client(pool).enqueue("agent", "order 2", conn=conn)
            assert await pool.fetchval("SELECT count(*) FROM runs") == 0  # not yet committed
        run = await pool.fetchrow("SELECT id::text, input FROM runs")
        assert run["id"] == r.run_id and run["input"] == {"text": "order 2"}
    finally:
        await conn.close()


async def _listening(pool: asyncpg.Pool) -> None:
    async with asyncio.timeout(20):
        while not await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %hango_done%'"
        ):
            await asyncio.sleep(0.02)


async def test_wait_wakes_on_the_runs_notification(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    client = Client(pool)
    r = await client.enqueue("agent", "hello")
    # the fallback poll is an hour: only the notification can end this wait in time
    waiting = asyncio.create_task(client.wait(r.run_id, timeout_s=60, poll_s=3600))
    await _listening(pool)
    await run_until_idle(dsn, scripted({"text": "hi"}))
    run = await waiting
    assert run["status"] == "succeeded"


async def test_every_way_a_run_ends_notifies(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    client = Client(pool)
    got: list[str] = []
    conn = await asyncpg.connect(dsn)
    await conn.add_listener(DONE_CHANNEL, lambda c, p, ch, payload: got.append(payload))
    try:
        ok = await client.enqueue("agent", "ok")
        cancelled = await client.enqueue("agent", "never")
        assert await client.cancel(cancelled.run_id) == "cancelled"
        await run_until_idle(dsn, scripted({"text": "done"}))
        async with asyncio.timeout(20):
            while len(got) < 2:
                await asyncio.sleep(0.02)
        assert sorted(got) == sorted([ok.run_id, cancelled.run_id])
    finally:
        await conn.close()
