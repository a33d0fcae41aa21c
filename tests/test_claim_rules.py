"""The claim's rules one at a time (store/sql_claim.py CLAIM; docs/operations.md "Tenants,
fairness and limits"): one running run per session, priorities within a tenant only,
the oldest heads of queue first, a full tenant never taking another's place in the
batch, and the per-tenant (per-agent) lock that keeps two claimers from both taking
the last slot. Each test fails when its rule is taken out of the statement."""

from __future__ import annotations

from collections import Counter

import asyncpg

from hango_worker.store import repo, sql
from tests.tenant_helpers import bulk_enqueue, claim, tenant_with_agent

BATCH = 8


async def _enqueue(
    pool: asyncpg.Pool, tenant: str, session: str | None = None, priority: int = 0
) -> dict[str, str]:
    return await repo.enqueue(
        pool,
        tenant_id=tenant,
        agent="agent",
        input_text="go",
        session_id=session,
        priority=priority,
    )


def _ids(rows: list[asyncpg.Record]) -> list[str]:
    return [row["id"] for row in rows]


async def test_a_session_with_a_running_run_has_no_claimable_run_and_blocks_no_one(
    pool: asyncpg.Pool,
) -> None:
    """(Two queued runs of one session claimed in the same batch are sorted out by
    the worker, which gives the later one back: sql.UNCLAIM.)"""
    a = await tenant_with_agent(pool, "a")
    b = await tenant_with_agent(pool, "b")
    first = await _enqueue(pool, a)
    assert _ids(await claim(pool, BATCH)) == [first["run_id"]]
    second = await _enqueue(pool, a, first["session_id"])
    assert await claim(pool, BATCH) == []
    # the session's next run is no head of queue of its tenant either, so a later run
    # of another tenant gets the batch of one
    other = await _enqueue(pool, b)
    assert _ids(await claim(pool, 1)) == [other["run_id"]]
    await pool.execute("UPDATE runs SET status = 'succeeded' WHERE id = $1", first["run_id"])
    assert _ids(await claim(pool, BATCH)) == [second["run_id"]]


async def test_priorities_order_a_tenants_own_runs_and_never_cross_tenants(
    pool: asyncpg.Pool,
) -> None:
    a = await tenant_with_agent(pool, "a")
    old_a = await _enqueue(pool, a)
    b = await tenant_with_agent(pool, "b")
    runs_b = [await _enqueue(pool, b) for _ in range(2)]
    urgent_a = await _enqueue(pool, a, priority=9)
    # A's head of queue is its urgent run, younger than B's head: B goes first
    assert _ids(await claim(pool, 1)) == [runs_b[0]["run_id"]]
    # in a batch of two, each tenant's first slot: A's is its urgent run, not its oldest
    got = _ids(await claim(pool, 2))
    assert sorted(got) == sorted([urgent_a["run_id"], runs_b[1]["run_id"]])
    assert _ids(await claim(pool, 2)) == [old_a["run_id"]]


async def test_an_agents_last_free_slot_goes_to_its_most_urgent_run(pool: asyncpg.Pool) -> None:
    t = await tenant_with_agent(pool, "t")
    await pool.execute("UPDATE agents SET max_running = 1 WHERE tenant_id = $1", t)
    await _enqueue(pool, t)
    urgent = await _enqueue(pool, t, priority=3)
    assert _ids(await claim(pool, BATCH)) == [urgent["run_id"]]


async def test_the_oldest_heads_of_queue_go_first(pool: asyncpg.Pool) -> None:
    """Three tenants, a batch of one, each time: the tenant whose next run is oldest
    (whatever point the claim starts its walk of the tenants at)."""
    tenants = [await tenant_with_agent(pool, f"t{i}") for i in range(3)]
    order = []
    for _ in range(3):
        for t in tenants:
            order.append((await _enqueue(pool, t))["run_id"])
    got = [run_id for _ in order for run_id in _ids(await claim(pool, 1))]
    assert got == order


async def test_a_full_tenant_takes_no_place_in_the_batch(pool: asyncpg.Pool) -> None:
    """Two tenants at their max_running with older heads of queue: a batch of two still
    goes to the tenants with room."""
    full = [await tenant_with_agent(pool, f"full{i}", max_running=1) for i in range(2)]
    for t in full:
        await bulk_enqueue(pool, t, 3)
    assert len(await claim(pool, 2)) == 2  # one each: both full now
    free = await tenant_with_agent(pool, "free")
    await bulk_enqueue(pool, free, 3)
    got = await claim(pool, 2)
    assert [row["tenant_id"] for row in got] == [free, free]


async def test_a_full_agent_holds_back_no_other_agent_of_its_tenant(pool: asyncpg.Pool) -> None:
    """An agent at its max_running with a backlog of older runs: the tenant's other
    agent still gets the batch (the full agent's runs are no candidates at all)."""
    t = await tenant_with_agent(pool, "t")
    await pool.execute("UPDATE agents SET max_running = 1 WHERE tenant_id = $1", t)
    await bulk_enqueue(pool, t, 2 * BATCH)
    assert len(await claim(pool, BATCH)) == 1  # the agent is full now
    await repo.create_agent(
        pool, tenant_id=t, name="other", model="claude-test", system=[], tools=[], config={}
    )
    others = [
        (await repo.enqueue(pool, tenant_id=t, agent="other", input_text="go"))["run_id"]
        for _ in range(3)
    ]
    assert sorted(_ids(await claim(pool, BATCH))) == sorted(others)


async def _claim_in(con: asyncpg.Connection, worker: str) -> list[asyncpg.Record]:
    return list(await con.fetch(sql.CLAIM, worker, BATCH, 30.0))


async def test_a_claimer_deciding_for_a_limited_tenant_holds_the_others_off(
    pool: asyncpg.Pool,
) -> None:
    """Two workers claim at once for a tenant of max_running 2 (and an agent of
    max_running 1): while the first has not committed, the second takes nothing of
    them (it skips what another claimer is deciding), so together they never exceed
    the limit. Without the per-tenant lock, the second would count no running runs
    (the first's are not committed) and take two more."""
    lim = await tenant_with_agent(pool, "limited", max_running=2)
    agent_lim = await tenant_with_agent(pool, "agent-limited")
    await pool.execute("UPDATE agents SET max_running = 1 WHERE tenant_id = $1", agent_lim)
    free = await tenant_with_agent(pool, "free")
    # more runs than a claim looks at (it locks its candidates): the second claimer
    # finds unlocked runs of every tenant, and only the limits can hold it off
    for t in (lim, agent_lim, free):
        await bulk_enqueue(pool, t, 3 * BATCH)
    async with pool.acquire() as first, pool.acquire() as second:
        tx = first.transaction()
        await tx.start()
        try:
            mine = await _claim_in(first, "w1")
            theirs = await _claim_in(second, "w2")
        finally:
            await tx.commit()
        took = Counter(row["tenant_id"] for row in mine)
        assert (took[lim], took[agent_lim]) == (2, 1)
        assert {row["tenant_id"] for row in theirs} == {free}
        # committed: the limits are full, seen by every later claim
        later = await _claim_in(second, "w3")
        assert {row["tenant_id"] for row in later} <= {free}
    running = await pool.fetch(
        "SELECT tenant_id::text, count(*) AS n FROM runs WHERE status = 'running' GROUP BY 1"
    )
    counts = {row["tenant_id"]: row["n"] for row in running}
    assert counts[lim] == 2 and counts[agent_lim] == 1
