"""`hango_worker.store.gc`: retention deletes exactly the finished, old rows, in bounded batches."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import asyncpg
import pytest

from hango_worker.store import repo
from hango_worker.store.gc import GcResult, gc, parse_age

DAY = datetime.timedelta(days=1)
OTHER_TENANT = "00000000-0000-0000-0000-0000000000aa"


async def _agent(pool: asyncpg.Pool, tenant: str) -> str:
    await pool.execute(
        "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        tenant,
        f"gc-{tenant}",  # a name is never shaped like an id (migration 0012)
    )
    return await repo.create_agent(
        pool, tenant_id=tenant, name="gc-agent", model="m", system=[], tools=[], config={}
    )


async def _session(pool: asyncpg.Pool, tenant: str, agent: str) -> str:
    sid = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO sessions (id, tenant_id, agent_id) VALUES ($1, $2, $3)", sid, tenant, agent
    )
    return sid


async def _run(
    pool: asyncpg.Pool,
    tenant: str,
    agent: str,
    session: str,
    status: str,
    *,
    age_days: float | None,
    events: int = 3,
    messages: int = 2,
    tool_calls: int = 1,
) -> str:
    """A run with rows in every child table; finished `age_days` ago (None: not finished)."""
    rid = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO runs (id, tenant_id, session_id, agent_id, status, input, created_at) "
        "VALUES ($1, $2, $3, $4, $5, '{}'::jsonb, now() - make_interval(days => 90))",
        rid,
        tenant,
        session,
        agent,
        status,
    )
    if age_days is not None:
        await pool.execute(
            "UPDATE runs SET finished_at = now() - make_interval(secs => $2) WHERE id = $1",
            rid,
            age_days * 86_400,
        )
    base = await pool.fetchval(
        "SELECT coalesce(max(seq), 0) FROM messages WHERE session_id = $1", session
    )
    for i in range(messages):
        await pool.execute(
            "INSERT INTO messages (session_id, seq, run_id, role, content) "
            "VALUES ($1, $2, $3, $4, '[]'::jsonb)",
            session,
            base + i + 1,
            rid,
            "user" if i % 2 == 0 else "assistant",
        )
    for i in range(tool_calls):
        await pool.execute(
            "INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt) "
            "VALUES ($1, $2, 'calculator', '{}'::jsonb, 1)",
            rid,
            f"toolu_{i}",
        )
    for i in range(events):
        await pool.execute(
            "INSERT INTO run_events (run_id, seq, type) VALUES ($1, $2, 'turn')", rid, i + 1
        )
    return rid


async def _counts(pool: asyncpg.Pool, rid: str) -> dict[str, int]:
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM runs WHERE id = $1) AS runs, "
        "(SELECT count(*) FROM run_events WHERE run_id = $1) AS events, "
        "(SELECT count(*) FROM messages WHERE run_id = $1) AS messages, "
        "(SELECT count(*) FROM tool_calls WHERE run_id = $1) AS tool_calls",
        rid,
    )
    assert row is not None
    return dict(row)


FULL = {"runs": 1, "events": 3, "messages": 2, "tool_calls": 1}
NO_EVENTS = {"runs": 1, "events": 0, "messages": 2, "tool_calls": 1}
GONE = {"runs": 0, "events": 0, "messages": 0, "tool_calls": 0}


@pytest.fixture
async def world(pool: asyncpg.Pool) -> dict[str, Any]:
    """Runs of every status, old and recent, in two tenants; one run per session
    unless named otherwise."""
    t = repo.DEFAULT_TENANT_ID
    await repo.ensure_default_tenant(pool)
    a = await _agent(pool, t)
    b = await _agent(pool, OTHER_TENANT)

    async def solo(status: str, age: float | None, tenant: str = t, agent: str = a) -> str:
        return await _run(
            pool, tenant, agent, await _session(pool, tenant, agent), status, age_days=age
        )

    w: dict[str, Any] = {
        "old_succeeded": await solo("succeeded", 40),
        "old_failed": await solo("failed", 31),
        "old_cancelled": await solo("cancelled", 365),
        "recent_succeeded": await solo("succeeded", 29),
        "queued": await solo("queued", None),
        "running": await solo("running", None),
        # a running run that carries a stale finished_at (e.g. resumed): status wins
        "running_stale_finished": await solo("running", 60),
        "other_tenant_old": await solo("succeeded", 40, OTHER_TENANT, b),
    }
    # one session: an old finished run followed by a queued one (a conversation going on)
    s = await _session(pool, t, a)
    w["old_in_live_session"] = await _run(pool, t, a, s, "succeeded", age_days=50)
    w["queued_in_live_session"] = await _run(pool, t, a, s, "queued", age_days=None)
    # one session: two old runs and a recent one
    s = await _session(pool, t, a)
    w["old_in_recent_session"] = await _run(pool, t, a, s, "failed", age_days=45)
    w["old_in_recent_session_2"] = await _run(pool, t, a, s, "succeeded", age_days=44)
    w["recent_in_recent_session"] = await _run(pool, t, a, s, "succeeded", age_days=1)
    # one session: every run old and finished
    s = await _session(pool, t, a)
    w["old_session_a"] = await _run(pool, t, a, s, "failed", age_days=70)
    w["old_session_b"] = await _run(pool, t, a, s, "succeeded", age_days=69)
    w["old_session"] = s
    return w


OLD_FINISHED_DEFAULT = (
    "old_succeeded",
    "old_failed",
    "old_cancelled",
    "old_in_live_session",
    "old_in_recent_session",
    "old_in_recent_session_2",
    "old_session_a",
    "old_session_b",
)
UNTOUCHABLE = (
    "recent_succeeded",
    "queued",
    "running",
    "running_stale_finished",
    "queued_in_live_session",
    "recent_in_recent_session",
)


async def test_events_of_old_finished_runs_of_the_tenant_only(
    pool: asyncpg.Pool, world: dict[str, Any]
) -> None:
    res = await gc(pool, older_than=30 * DAY, tenant_id=repo.DEFAULT_TENANT_ID)
    for name in OLD_FINISHED_DEFAULT:
        assert await _counts(pool, world[name]) == NO_EVENTS, name
    for name in (*UNTOUCHABLE, "other_tenant_old"):
        assert await _counts(pool, world[name]) == FULL, name
    assert res.events_deleted == 3 * len(OLD_FINISHED_DEFAULT)
    assert (res.runs_deleted, res.messages_deleted, res.tool_calls_deleted) == (0, 0, 0)
    assert res.cutoff is not None
    # a second pass finds nothing more
    again = await gc(pool, older_than=30 * DAY, tenant_id=repo.DEFAULT_TENANT_ID)
    assert (again.rows_deleted, again.batches) == (0, 0)


async def test_delete_runs_removes_whole_old_sessions_only(
    pool: asyncpg.Pool, world: dict[str, Any]
) -> None:
    sessions_before = await pool.fetchval("SELECT count(*) FROM sessions")
    res = await gc(pool, older_than=30 * DAY, tenant_id=repo.DEFAULT_TENANT_ID, delete_runs=True)
    deleted = ("old_succeeded", "old_failed", "old_cancelled", "old_session_a", "old_session_b")
    for name in deleted:
        assert await _counts(pool, world[name]) == GONE, name
    # old and finished, but their session goes on: history kept, events dropped
    for name in ("old_in_live_session", "old_in_recent_session", "old_in_recent_session_2"):
        assert await _counts(pool, world[name]) == NO_EVENTS, name
    for name in (*UNTOUCHABLE, "other_tenant_old"):
        assert await _counts(pool, world[name]) == FULL, name
    assert res.runs_deleted == len(deleted)
    assert res.messages_deleted == 2 * len(deleted)
    assert res.tool_calls_deleted == len(deleted)
    assert res.events_deleted == 3 * len(OLD_FINISHED_DEFAULT)
    # sessions stay (an emptied one can be continued as a fresh conversation)
    assert await pool.fetchval("SELECT count(*) FROM sessions") == sessions_before
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM messages WHERE session_id = $1", world["old_session"]
        )
        == 0
    )


async def test_all_tenants_when_no_tenant_given(pool: asyncpg.Pool, world: dict[str, Any]) -> None:
    res = await gc(pool, older_than=30 * DAY, delete_runs=True)
    assert await _counts(pool, world["other_tenant_old"]) == GONE
    for name in UNTOUCHABLE:
        assert await _counts(pool, world[name]) == FULL, name
    assert res.runs_deleted == 6


async def test_cut_off_is_respected(pool: asyncpg.Pool, world: dict[str, Any]) -> None:
    await gc(pool, older_than=100 * DAY, delete_runs=True)
    assert await _counts(pool, world["old_cancelled"]) == GONE  # 365 days
    for name in ("old_succeeded", "old_session_a", "old_failed"):  # 31..70 days
        assert await _counts(pool, world[name]) == FULL, name


async def test_a_run_resumed_is_no_longer_collected(
    pool: asyncpg.Pool, world: dict[str, Any]
) -> None:
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, world["old_failed"])
    await gc(pool, older_than=30 * DAY, delete_runs=True)
    assert await _counts(pool, world["old_failed"]) == FULL


async def test_batches_are_bounded(pool: asyncpg.Pool) -> None:
    t = await repo.ensure_default_tenant(pool)
    a = await _agent(pool, t)
    big = await _run(
        pool,
        t,
        a,
        await _session(pool, t, a),
        "succeeded",
        age_days=40,
        events=5,
        messages=0,
        tool_calls=0,
    )
    seen: list[tuple[int, int]] = []

    def progress(r: GcResult) -> None:
        seen.append((r.batches, r.events_deleted))

    res = await gc(pool, older_than=30 * DAY, batch_size=2, progress=progress)
    assert res.events_deleted == 5
    assert res.batches == 3
    assert seen == [(1, 2), (2, 4), (3, 5)]
    assert await _counts(pool, big) == {"runs": 1, "events": 0, "messages": 0, "tool_calls": 0}

    # five old sessions of one run each (weight 1): runs go two per batch
    runs = [
        await _run(
            pool,
            t,
            a,
            await _session(pool, t, a),
            "failed",
            age_days=40,
            events=0,
            messages=0,
            tool_calls=0,
        )
        for _ in range(5)
    ]
    res = await gc(pool, older_than=30 * DAY, batch_size=2, delete_runs=True)
    assert res.runs_deleted == 6  # the five and `big`
    assert res.batches == 3
    for rid in (*runs, big):
        assert await _counts(pool, rid) == GONE


async def test_a_session_larger_than_a_batch_goes_alone(pool: asyncpg.Pool) -> None:
    t = await repo.ensure_default_tenant(pool)
    a = await _agent(pool, t)
    s = await _session(pool, t, a)
    rid = await _run(pool, t, a, s, "succeeded", age_days=40, events=4, messages=6, tool_calls=3)
    res = await gc(pool, older_than=30 * DAY, batch_size=2, delete_runs=True)
    assert await _counts(pool, rid) == GONE
    assert (res.events_deleted, res.messages_deleted, res.tool_calls_deleted) == (4, 6, 3)
    assert res.batches == 2 + 1  # events in two batches, then the session in one


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", datetime.timedelta(days=30)),
        ("12h", datetime.timedelta(hours=12)),
        ("45m", datetime.timedelta(minutes=45)),
        ("90s", datetime.timedelta(seconds=90)),
        ("0s", datetime.timedelta(0)),
        (" 7d ", datetime.timedelta(days=7)),
    ],
)
def test_parse_age(text: str, expected: datetime.timedelta) -> None:
    assert parse_age(text) == expected


@pytest.mark.parametrize(
    "text", ["", "30", "d", "1.5h", "-1d", "30 days", "1w", "10y", "3dd", "d3", "99999999999999d"]
)
def test_parse_age_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid age"):
        parse_age(text)


async def test_gc_rejects_bad_arguments(pool: asyncpg.Pool) -> None:
    with pytest.raises(ValueError, match="batch_size"):
        await gc(pool, older_than=DAY, batch_size=0)
    with pytest.raises(ValueError, match="negative"):
        await gc(pool, older_than=-DAY)
    with pytest.raises(ValueError, match="not a UUID"):
        await gc(pool, older_than=DAY, tenant_id="acme")
