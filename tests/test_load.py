"""Loading a claimed run (run/execute.py `load`, sql.LOAD_RUN): one statement reads the
agent, the session's history in seq order and the run's counters."""

from __future__ import annotations

import json

import asyncpg

from hango_worker.run.claim import Claim
from hango_worker.run.execute import LoadError, load
from hango_worker.store import db, sql
from tests.worker_helpers import enqueue, make_agent

WORKER = "load-worker"


def _text(t: str) -> str:
    return json.dumps([{"type": "text", "text": t}])


async def _message(pool: asyncpg.Pool, session: str, seq: int, run: str, role: str, c: str) -> None:
    await pool.execute(
        "INSERT INTO messages (session_id, seq, run_id, role, content) "
        "VALUES ($1, $2, $3, $4, $5::text::jsonb)",
        session,
        seq,
        run,
        role,
        c,
    )


async def _claim(pool: asyncpg.Pool) -> Claim:
    rows = await pool.fetch(sql.CLAIM, WORKER, 1, 30.0)
    assert len(rows) == 1
    return Claim.from_record(rows[0])


async def test_a_resumed_run_loads_its_session_history_in_order_and_its_own_counts(
    pool: asyncpg.Pool,
) -> None:
    await make_agent(pool)
    first = await enqueue(pool, "earlier question")
    session = await pool.fetchval("SELECT session_id::text FROM runs WHERE id = $1", first)
    await pool.execute("UPDATE runs SET status = 'succeeded' WHERE id = $1", first)
    run = await enqueue(pool, "follow-up", session_id=session)
    call = [{"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"x": 1}}]
    # stored out of seq order on purpose: the history comes back ordered by seq
    await _message(pool, session, 4, run, "assistant", json.dumps(call))
    await _message(pool, session, 2, first, "assistant", _text("earlier answer"))
    await _message(pool, session, 3, run, "user", _text("follow-up"))
    await _message(pool, session, 1, first, "user", _text("earlier question"))
    for seq in (1, 2, 3):
        await pool.execute(
            "INSERT INTO run_events (run_id, seq, type, payload) VALUES ($1, $2, 'x', '{}')",
            run,
            seq,
        )
    await pool.execute(
        "INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt, message_seq) "
        "VALUES ($1, 'toolu_1', 'echo', $2::text::jsonb, 1, 4)",
        run,
        json.dumps({"content": "echoed", "is_error": False}),
    )

    c = await _claim(pool)
    assert c.run_id == run
    loaded = await load(pool, c)

    assert [m.role for m in loaded.messages] == ["user", "assistant", "user", "assistant"]
    assert loaded.messages[1].content[0].text == "earlier answer"  # type: ignore[union-attr]
    assert loaded.persisted == 4  # the input is stored already: not added again
    assert loaded.turns_done == 1  # this run's assistant messages only
    assert loaded.next_message_seq == 5
    assert loaded.next_event_seq == 4
    assert loaded.recorded["toolu_1"].content == "echoed"  # the pending turn's result
    assert loaded.agent.name == "agent" and loaded.agent.system == ["Be brief."]


async def test_a_new_run_in_a_new_session_starts_from_its_input(pool: asyncpg.Pool) -> None:
    await make_agent(pool)
    await enqueue(pool, "hello")
    loaded = await load(pool, await _claim(pool))
    assert [m.role for m in loaded.messages] == ["user"]
    assert loaded.messages[0].content[0].text == "hello"  # type: ignore[union-attr]
    assert (loaded.persisted, loaded.turns_done) == (0, 0)
    assert (loaded.next_message_seq, loaded.next_event_seq) == (1, 1)
    assert loaded.recorded == {}


async def test_an_unreadable_message_names_its_seq(pool: asyncpg.Pool) -> None:
    await make_agent(pool)
    run = await enqueue(pool, "hello")
    session = await pool.fetchval("SELECT session_id::text FROM runs WHERE id = $1", run)
    await _message(pool, session, 1, run, "user", _text("hello"))
    await _message(pool, session, 2, run, "assistant", json.dumps({"not": "a list"}))
    c = await _claim(pool)
    try:
        await load(pool, c)
    except LoadError as e:
        assert e.error["type"] == "invalid_history"
        assert "message seq 2" in e.error["message"]
    else:
        raise AssertionError("an unreadable message must fail the load")


async def test_an_updated_agent_is_read_again_and_an_unchanged_one_is_not(
    pool: asyncpg.Pool,
) -> None:
    await make_agent(pool)
    first = await enqueue(pool, "one")
    a1 = (await load(pool, await _claim(pool))).agent
    await pool.execute("UPDATE runs SET status = 'succeeded' WHERE id = $1", first)
    second = await enqueue(pool, "two")
    a2 = (await load(pool, await _claim(pool))).agent
    assert a2 is a1  # parsed once while the agent row is unchanged
    await pool.execute("UPDATE runs SET status = 'succeeded' WHERE id = $1", second)
    await pool.execute("UPDATE agents SET system = '[\"Be thorough.\"]'::jsonb")
    await enqueue(pool, "three")
    a3 = (await load(pool, await _claim(pool))).agent
    assert a3.system == ["Be thorough."] and a1.system == ["Be brief."]


async def test_the_claim_brings_the_start_so_a_new_run_loads_without_another_round_trip(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool)
    await enqueue(pool, "hello")
    c = await _claim(pool)
    assert c.start is not None  # sql.CLAIM returned the run's start with the run
    closed = await db.create_pool(dsn, min_size=1, max_size=1)
    await closed.close()  # any statement on it would raise
    loaded = await load(closed, c)
    assert loaded.messages[0].content[0].text == "hello"  # type: ignore[union-attr]
    assert loaded.agent.name == "agent" and c.start is None  # read once


async def test_a_claim_of_a_run_whose_agent_is_not_its_tenants_fails_that_run_clearly(
    pool: asyncpg.Pool,
) -> None:
    await make_agent(pool)
    run = await enqueue(pool, "hello")
    other = await pool.fetchval(
        "INSERT INTO tenants (id, name) VALUES (gen_random_uuid(), 'other-load') RETURNING id::text"
    )
    # a row made inconsistent by hand: the agent now belongs to another tenant
    await pool.execute("UPDATE agents SET tenant_id = $1", other)
    c = await _claim(pool)
    assert c.run_id == run and c.start is not None and c.start["agent_row"] is None
    try:
        await load(pool, c)
    except LoadError as e:
        assert e.error["type"] == "agent_not_found" and run in e.error["message"]
    else:
        raise AssertionError("a run whose agent cannot be read must fail its load")
