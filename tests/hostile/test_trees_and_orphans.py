"""Cycles and orphans: what only SQL can make (a parent cycle, a run whose agent is
gone) never loops forever and never blocks the queue."""

from __future__ import annotations

import asyncio

import asyncpg

from hango_worker.store import fork, repo
from tests.helpers import scripted
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

T = repo.DEFAULT_TENANT_ID


async def _cycle(pool: asyncpg.Pool) -> tuple[str, str]:
    await make_agent(pool)
    a, b = await enqueue(pool, "a"), await enqueue(pool, "b")
    await pool.execute("UPDATE runs SET parent_run_id = $2 WHERE id = $1", a, b)
    await pool.execute("UPDATE runs SET parent_run_id = $2 WHERE id = $1", b, a)
    return a, b


async def test_runs_tree_lists_each_run_of_a_parent_cycle_once(pool: asyncpg.Pool) -> None:
    """Proves: the tree query detects the cycle (CYCLE ... SET in_cycle) and the walk
    lists each run once; before, the walk never ended."""
    a, b = await _cycle(pool)
    rows = await asyncio.wait_for(fork.tree(pool, T, a), 10)
    assert [r["id"] for r in rows] == [a, b]


async def test_cancel_ends_on_a_parent_cycle(pool: asyncpg.Pool) -> None:
    """Proves: hango_api.cancel walks the tree with cycle detection (migration 0012)
    and cancels both runs once; before, its recursive query never ended."""
    a, b = await _cycle(pool)
    async with pool.acquire() as conn:
        await conn.execute("SET statement_timeout = '10s'")  # a loop fails, never hangs
        try:
            assert await repo.request_cancel(conn, T, a) == "cancelled"  # type: ignore[arg-type]
        finally:
            await conn.execute("RESET statement_timeout")
    statuses = await pool.fetch("SELECT status FROM runs WHERE id = ANY($1::uuid[])", [a, b])
    assert [r["status"] for r in statuses] == ["cancelled", "cancelled"]


async def test_a_queued_run_whose_agent_is_gone_fails_at_claim(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Proves: the claim takes a run whose agent row is gone (deleted with the foreign
    key checks off) and fails it with agent_not_found; before, it stayed queued forever
    and counted against its tenant's fairness."""
    await make_agent(pool, name="doomed")
    await make_agent(pool, name="fine")
    orphan = await enqueue(pool, agent="doomed")
    other = await enqueue(pool, agent="fine")
    async with pool.acquire() as conn:
        await conn.execute("SET session_replication_role = replica")  # FK triggers off
        await conn.execute("DELETE FROM agents WHERE name = 'doomed'")
        await conn.execute("RESET session_replication_role")
    await asyncio.wait_for(run_until_idle(dsn, scripted({"text": "ok"})), 60)
    run = await details(pool, orphan)
    assert run["status"] == "failed" and run["error"]["type"] == "agent_not_found"
    assert (await details(pool, other))["status"] == "succeeded"
