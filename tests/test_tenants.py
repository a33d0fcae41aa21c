"""Fair claiming across tenants, priorities, max_running per tenant and agent, tenants'
bad input (docs/operations.md "Tenants, fairness and limits")."""

from __future__ import annotations

import json
from collections import Counter

import asyncpg
import pytest

from hango_worker.client import Client
from hango_worker.store import db, repo, sql, tenants
from tests.tenant_helpers import bulk_enqueue, claim, tenant_with_agent

BATCH = 8


async def test_one_tenants_backlog_delays_another_by_at_most_one_claim_batch(
    pool: asyncpg.Pool,
) -> None:
    a = await tenant_with_agent(pool, "a")
    b = await tenant_with_agent(pool, "b")
    await bulk_enqueue(pool, a, 2000)
    r = await repo.enqueue(pool, tenant_id=b, agent="agent", input_text="mine")
    first = await claim(pool, BATCH)
    assert len(first) == BATCH
    assert r["run_id"] in [row["id"] for row in first], "B's run must be in the first batch"
    # and B's run goes first among the tenants' first runs: A gets the other slots
    assert Counter(row["tenant_id"] for row in first) == {a: BATCH - 1, b: 1}


async def test_the_claim_walks_the_ring_of_tenants_round_from_any_start(
    pool: asyncpg.Pool,
) -> None:
    """Each claim starts its walk of the tenants with work at a random point and wraps
    round: every tenant is found whatever the start (12 of 12), and a batch's tenants
    are distinct while more than a batch of tenants have work (40 tenants, 5 claims)."""
    few = [await tenant_with_agent(pool, f"f{i}") for i in range(12)]
    for _ in range(10):
        for t in few:
            await bulk_enqueue(pool, t, 1)
        got = await claim(pool, 12)
        assert sorted(row["tenant_id"] for row in got) == sorted(few)
    many = few + [await tenant_with_agent(pool, f"m{i}") for i in range(28)]
    for t in many:
        await bulk_enqueue(pool, t, 1)
    seen: list[str] = []
    for _ in range(5):
        got = await claim(pool, BATCH)
        assert len({row["tenant_id"] for row in got}) == len(got) == BATCH
        seen += [row["tenant_id"] for row in got]
    assert sorted(seen) == sorted(many)


async def test_claims_alternate_by_weight_when_both_tenants_have_a_backlog(
    pool: asyncpg.Pool,
) -> None:
    heavy = await tenant_with_agent(pool, "heavy", weight=3)
    light = await tenant_with_agent(pool, "light")
    await bulk_enqueue(pool, light, 50)  # older: light's head of queue is first
    await bulk_enqueue(pool, heavy, 50)
    got = Counter(row["tenant_id"] for row in await claim(pool, BATCH))
    assert got == {heavy: 6, light: 2}  # ranks 1..6 / 3 vs 1..2 / 1 interleave 3:1


async def test_a_high_priority_run_enqueued_after_500_normal_ones_is_claimed_next(
    pool: asyncpg.Pool,
) -> None:
    t = await tenant_with_agent(pool, "default")
    await bulk_enqueue(pool, t, 500)
    client = Client(pool, t)
    urgent = await client.enqueue("agent", "urgent", priority=5)
    assert [row["id"] for row in await claim(pool, 1)] == [urgent.run_id]
    row = await pool.fetchrow("SELECT priority FROM runs WHERE id = $1", urgent.run_id)
    assert row["priority"] == 5
    assert (await repo.get_run(pool, t, urgent.run_id))["priority"] == 5


async def test_max_running_per_tenant_and_per_agent_bound_the_claim(pool: asyncpg.Pool) -> None:
    lim = await tenant_with_agent(pool, "limited", max_running=2)
    free = await tenant_with_agent(pool, "free")
    await bulk_enqueue(pool, lim, 20)
    await bulk_enqueue(pool, free, 20)
    got = Counter(row["tenant_id"] for row in await claim(pool, BATCH))
    assert got == {lim: 2, free: BATCH - 2}
    again = Counter(row["tenant_id"] for row in await claim(pool, BATCH, "w2"))
    assert again == {free: BATCH}  # the limited tenant is full: nothing more of it
    # an agent's own limit, inside a tenant without one
    await pool.execute("UPDATE agents SET max_running = 1 WHERE tenant_id = $1", free)
    await pool.execute(
        "UPDATE runs SET status = 'succeeded' WHERE tenant_id = $1 AND status = 'running'", free
    )
    assert Counter(row["tenant_id"] for row in await claim(pool, BATCH, "w3")) == {free: 1}
    assert await claim(pool, BATCH, "w4") == []


async def test_a_limit_lowered_while_runs_run_stops_new_claims_only(pool: asyncpg.Pool) -> None:
    t = await tenant_with_agent(pool, "t")
    await bulk_enqueue(pool, t, 10)
    assert len(await claim(pool, 4)) == 4
    row = await tenants.update_tenant(pool, "t", max_running=0)
    assert row["max_running"] == 0
    running = "SELECT count(*) FROM runs WHERE status = 'running'"
    assert await claim(pool, 4) == [] and await pool.fetchval(running) == 4  # none stopped
    await tenants.update_tenant(pool, "t", max_running=5)
    assert len(await claim(pool, 4)) == 1  # 4 running, room for one more
    await tenants.update_tenant(pool, "t", max_running=None)
    assert len(await claim(pool, 10)) == 5
    assert (await tenants.list_tenants(pool))[-1]["running"] == 10


async def test_bad_tenant_input_is_refused_with_a_clear_error(pool: asyncpg.Pool) -> None:
    await tenant_with_agent(pool, "default")
    with pytest.raises(ValueError, match="priority must be 0 to 1000"):
        await repo.enqueue(
            pool, tenant_id=repo.DEFAULT_TENANT_ID, agent="agent", input_text="x", priority=-1
        )
    with pytest.raises(ValueError, match="max_running must be an integer 0"):
        await tenants.create_tenant(pool, "neg", max_running=-1)
    with pytest.raises(ValueError, match="weight must be an integer 1 to 1000"):
        await tenants.create_tenant(pool, "w0", weight=0)
    with pytest.raises(repo.NotFound, match="no tenant 'nosuch'"):
        await tenants.resolve_tenant(pool, "nosuch")
    await tenants.create_tenant(pool, "dup")
    with pytest.raises(repo.Conflict, match="already exists"):
        await tenants.create_tenant(pool, "dup")
    with pytest.raises(repo.NotFound, match="no agent 'ghost'"):
        await tenants.set_agent_max_running(pool, repo.DEFAULT_TENANT_ID, "ghost", 1)
    # and the database refuses what slipped past (a hand-edited row)
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute("UPDATE tenants SET max_running = -1")
    assert await pool.fetchval("SELECT count(*) FROM runs") == 0


async def _plan(dsn: str, settings: dict[str, str] | None) -> str:
    """CLAIM's plan on a connection opened as the worker's claim connection is (settings:
    sql.CLAIM_SESSION_SETTINGS) or as the shared pool's (None: the worker's fallback),
    prepared and executed as asyncpg runs it: the plan that connection would use."""
    pool = await db.create_pool(dsn, min_size=1, max_size=1, server_settings=settings)
    try:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("PREPARE claim_plan(text, int, float8) AS " + sql.CLAIM)
            for _ in range(6):  # past the custom plans plan_cache_mode=auto starts with
                await conn.execute(f"EXPLAIN EXECUTE claim_plan('w', {BATCH}, 30.0)")
            raw = await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) EXECUTE claim_plan('w', {BATCH}, 30.0)"
            )
    finally:
        await pool.close()
    return json.dumps(json.loads(raw) if isinstance(raw, str) else raw)


@pytest.mark.parametrize("settings", [sql.CLAIM_SESSION_SETTINGS, None], ids=["claim", "shared"])
async def test_the_claim_reads_runs_by_index_only_whatever_is_queued_or_finished(
    pool: asyncpg.Pool, dsn: str, settings: dict[str, str] | None
) -> None:
    ts = [await tenant_with_agent(pool, f"t{i}") for i in range(20)]
    for t in ts:
        await bulk_enqueue(pool, t, 1000)
    await pool.execute("UPDATE runs SET status = 'succeeded' WHERE random() < 0.5")
    await pool.execute("ANALYZE")
    text = await _plan(dsn, settings)
    plan = json.loads(text)
    if settings is not None:
        # planned once for every claim (a generic plan: the batch size stays a parameter)
        assert settings["plan_cache_mode"] == "force_generic_plan"
        assert "LEAST((4 * $2), 400)" in text, text[:2000]
    scans: list[tuple[str, str]] = []  # (node type, index) of each read of a table
    kinds: list[tuple[str, str]] = []  # (node type, table)

    def walk(node: dict[str, object]) -> None:
        if "Relation Name" in node and node["Node Type"] != "ModifyTable":
            scans.append((str(node["Node Type"]), str(node.get("Index Name"))))
            kinds.append((str(node["Node Type"]), str(node["Relation Name"])))
        for child in node.get("Plans", []) or []:  # type: ignore[union-attr]
            walk(child)

    walk(plan[0]["Plan"])
    on_runs = [kind for kind, rel in kinds if rel == "runs"]
    assert on_runs and all("Index" in kind for kind in on_runs), kinds
    # each tenant's head of queue and its runs come from the queue index
    assert ("Index Scan", "runs_tenant_queue_idx") in scans, scans
