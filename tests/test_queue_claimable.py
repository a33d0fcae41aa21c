"""The claimable backlog (store/sql.py QUEUE_CLAIMABLE, the hango_queue_claimable gauge
the sweep sets): the queued runs a worker could claim now, by the claim's own rules,
never waiting runs, runs of a tenant or agent at its max_running, runs of a busy session
or runs whose attempt is out of range (docs/operations.md "Autoscaling on work")."""

from __future__ import annotations

import asyncpg
from prometheus_client import REGISTRY

from hango_worker.run.sweep import CLAIMABLE_CAP, sweep
from hango_worker.store import repo, sql
from tests.tenant_helpers import bulk_enqueue, claim, tenant_with_agent


async def _one(pool: asyncpg.Pool, tenant: str, session: str | None = None) -> str:
    r = await repo.enqueue(
        pool, tenant_id=tenant, agent="agent", input_text="go", session_id=session
    )
    return r["run_id"]


async def _fleet(pool: asyncpg.Pool) -> int:
    """Runs in every state; returns how many of the queued ones a worker could claim."""
    free = await tenant_with_agent(pool, "free")  # no limits
    two = await tenant_with_agent(pool, "two", max_running=2)
    one = await tenant_with_agent(pool, "one", max_running=1)
    paused = await tenant_with_agent(pool, "paused", max_running=0)
    agent3 = await tenant_with_agent(pool, "agent3")
    await pool.execute("UPDATE agents SET max_running = 3 WHERE tenant_id = $1", agent3)
    busy = await _one(pool, free)
    for t in (two, one, agent3):
        await _one(pool, t)
    assert len(await claim(pool, 8)) == 4  # one run of each running
    session = await pool.fetchval("SELECT session_id::text FROM runs WHERE id = $1", busy)

    await bulk_enqueue(pool, free, 3)  # claimable: 3
    await _one(pool, free, session)  # its session has a run running: not claimable
    over = await _one(pool, free)
    await pool.execute("UPDATE runs SET attempt = $2 WHERE id = $1", over, sql.ATTEMPT_LIMIT)
    waiting = await _one(pool, free)
    await pool.execute(
        "UPDATE runs SET status = 'waiting', waiting_since = now() WHERE id = $1", waiting
    )
    await bulk_enqueue(pool, two, 5)  # one slot of two free: 1
    await bulk_enqueue(pool, one, 4)  # at its limit: 0
    await bulk_enqueue(pool, paused, 2)  # max_running 0: 0
    await bulk_enqueue(pool, agent3, 5)  # the agent has 2 of 3 slots free: 2
    return 3 + 1 + 0 + 0 + 2


async def test_the_claimable_backlog_counts_only_what_the_claim_would_take(
    pool: asyncpg.Pool,
) -> None:
    expected = await _fleet(pool)
    queued = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'queued'")
    assert queued == 21 and expected == 6
    assert await pool.fetchval(sql.QUEUE_CLAIMABLE, CLAIMABLE_CAP) == expected
    # the sweep reports it (every worker the same global value)
    await sweep(pool, "sweeper", 3)
    assert REGISTRY.get_sample_value("hango_queue_claimable") == expected
    # and it is what the claim takes: claims until none is left take exactly that many
    taken = 0
    while got := await claim(pool, 8, worker="w2"):
        taken += len(got)
    assert taken == expected
    assert await pool.fetchval(sql.QUEUE_CLAIMABLE, CLAIMABLE_CAP) == 0


async def test_a_tenants_count_stops_at_the_cap(pool: asyncpg.Pool) -> None:
    await _fleet(pool)
    # at most 2 per tenant looked at: free 2, two 1, agent3 2
    assert await pool.fetchval(sql.QUEUE_CLAIMABLE, 2) == 5


async def test_an_empty_queue_has_no_claimable_backlog(pool: asyncpg.Pool) -> None:
    assert await pool.fetchval(sql.QUEUE_CLAIMABLE, CLAIMABLE_CAP) == 0
    await tenant_with_agent(pool, "idle")
    assert await pool.fetchval(sql.QUEUE_CLAIMABLE, CLAIMABLE_CAP) == 0
