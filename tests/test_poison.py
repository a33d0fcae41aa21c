"""Bad data fails its own run, never the batch or the queue; tool results keyed by turn;
a requested cancel survives a takeover; queue age and wait from (re)queue time."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.run.execute import RunDeps
from hango_worker.run.worker import Worker
from hango_worker.store import repo
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import call, recording_tool, scripted
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle, settings

DEEP = "[" * 3000 + "]" * 3000


async def sweep(pool: asyncpg.Pool, dsn: str, **over: Any) -> int:
    """One reclaim sweep by a worker that runs nothing."""
    deps = RunDeps(pool, settings(dsn, **over), Registry([]), scripted(), "sweeper")
    return await Worker(deps, dsn).sweep()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def assert_failed_once(pool: asyncpg.Pool, run_id: str, etype: str) -> dict[str, Any]:
    """Failed with `etype` on its first claim: recorded, with run_finished, no lease loop."""
    run = await details(pool, run_id)
    assert run["status"] == "failed", run["status"]
    assert run["error"]["type"] == etype, run["error"]
    assert run["lease_owner"] is None and run["finished_at"] is not None
    assert await pool.fetchval("SELECT lost_count FROM runs WHERE id = $1", run_id) == 0
    last = run["events"][-1]
    assert last["type"] == "run_finished" and last["payload"]["error"] == run["error"]
    return run


@pytest.mark.parametrize(
    ("column", "value", "etype", "words"),
    [
        ("input", DEEP, "invalid_input", "runs.input is nested too deeply"),
        ("state_json", DEEP, "invalid_state", "runs.state_json is nested too deeply"),
        ("state_json", "[]", "invalid_state", "must be a JSON object, got list"),
        ("state_json", "false", "invalid_state", "must be a JSON object, got bool"),
    ],
)
async def test_a_poison_row_fails_only_its_run_and_the_batch_runs(
    pool: asyncpg.Pool, dsn: str, column: str, value: str, etype: str, words: str
) -> None:
    await make_agent(pool, tools=[])
    ids = [await enqueue(pool, f"run {i}") for i in range(3)]
    await pool.execute(f"UPDATE runs SET {column} = $2::text::jsonb WHERE id = $1", ids[1], value)
    failed = sample("hango_runs_failed_total", error_type=etype)
    stats = await run_until_idle(dsn, scripted({"text": "fine"}), worker_concurrency=4)
    assert sample("hango_runs_failed_total", error_type=etype) == failed + 1
    assert stats.claimed == 3  # one batch
    assert stats.finished == {"failed": 1, "succeeded": 2}
    run = await assert_failed_once(pool, ids[1], etype)
    assert words in run["error"]["message"]
    assert run["attempt"] == 1 and run["transcript"] == []
    # left as found, for the operator
    assert await pool.fetchval(
        f"SELECT {column}::text = $2::text::jsonb::text FROM runs WHERE id = $1", ids[1], value
    )
    for good in (ids[0], ids[2]):
        assert (await details(pool, good))["status"] == "succeeded"


async def test_an_attempt_counter_at_the_int_limit_does_not_stall_the_queue(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    bad, good = await enqueue(pool, "bad"), await enqueue(pool, "good")
    await pool.execute("UPDATE runs SET attempt = 2147483647 WHERE id = $1", bad)
    before = sample("hango_runs_failed_total", error_type="invalid_row")
    stats = await run_until_idle(dsn, scripted({"text": "fine"}))
    assert stats.finished == {"succeeded": 1}
    assert (await details(pool, good))["status"] == "succeeded"
    assert await sweep(pool, dsn) == 1
    run = await details(pool, bad)
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_row"
    assert "runs.attempt is 2147483647" in run["error"]["message"]
    assert run["events"][-1]["type"] == "run_finished"
    assert sample("hango_runs_failed_total", error_type="invalid_row") == before + 1


async def test_a_lost_count_at_the_int_limit_does_not_stall_the_sweep(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    odd, plain = await enqueue(pool), await enqueue(pool)
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt = 1, lease_owner = 'gone', "
        "lease_expires_at = now() - interval '1 second'"
    )
    await pool.execute("UPDATE runs SET lost_count = 2147483647 WHERE id = $1", odd)
    assert await sweep(pool, dsn) == 2
    assert (await details(pool, odd))["error"]["type"] == "max_attempts"
    assert (await details(pool, plain))["status"] == "queued"


async def _run_with_a_tool_call(pool: asyncpg.Pool, dsn: str, tool: Tool) -> tuple[str, str]:
    await make_agent(pool, tools=[tool.name])
    run_id = await enqueue(pool)
    await run_until_idle(
        dsn, scripted({"tool_calls": [call(tool.name, text="x")]}, {"text": "done"}), [tool]
    )
    return run_id, (await details(pool, run_id))["session_id"]


async def _crash_after_last_tool_call(pool: asyncpg.Pool, run_id: str, session: str) -> None:
    """As if the worker died during its last tool batch: the messages after the last
    assistant message with tool calls are gone and the run is queued again."""
    await pool.execute(
        "DELETE FROM messages WHERE session_id = $1 AND seq > (SELECT max(seq) FROM messages "
        "WHERE session_id = $1 AND role = 'assistant' AND content::text LIKE '%tool_use%')",
        session,
    )
    await pool.execute(
        "UPDATE runs SET status = 'queued', finished_at = NULL, error = NULL WHERE id = $1",
        run_id,
    )


async def test_an_unreadable_recorded_tool_result_fails_the_run_at_once(
    pool: asyncpg.Pool, dsn: str
) -> None:
    tool, calls = recording_tool()
    run_id, session = await _run_with_a_tool_call(pool, dsn, tool)
    await _crash_after_last_tool_call(pool, run_id, session)
    await pool.execute(
        "UPDATE tool_calls SET result = '\"garbage\"'::jsonb WHERE run_id = $1", run_id
    )
    stats = await run_until_idle(dsn, scripted({"text": "never"}), [tool])
    assert stats.finished == {"failed": 1}
    run = await assert_failed_once(pool, run_id, "invalid_tool_result")
    assert "must be an object" in run["error"]["message"]
    assert len(calls) == 1
    assert sample("hango_runs_failed_total", error_type="invalid_tool_result") >= 1


async def test_an_unreadable_message_fails_the_next_run_at_once(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    first = await enqueue(pool)
    await run_until_idle(dsn, scripted({"text": "x"}))
    session = (await details(pool, first))["session_id"]
    await pool.execute("UPDATE messages SET content = '[1]'::jsonb WHERE seq = 2")
    second = await enqueue(pool, session_id=session)
    stats = await run_until_idle(dsn, scripted({"text": "y"}))
    assert stats.finished == {"failed": 1}
    run = await assert_failed_once(pool, second, "invalid_history")
    assert "message seq 2" in run["error"]["message"]


async def test_a_running_run_without_a_lease_is_never_stuck(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    swept, cancelled, resumed = [await enqueue(pool) for _ in range(3)]
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt = 1, lease_owner = NULL, "
        "lease_expires_at = NULL"
    )
    assert await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, cancelled) == "cancelled"
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, resumed)
    assert (await details(pool, resumed))["status"] == "queued"
    assert await sweep(pool, dsn) == 1
    stats = await run_until_idle(dsn, scripted({"text": "ok"}, {"text": "ok"}))
    assert stats.finished == {"succeeded": 2}
    assert (await details(pool, swept))["status"] == "succeeded"
    assert (await details(pool, resumed))["status"] == "succeeded"
    assert (await details(pool, cancelled))["status"] == "cancelled"


async def test_a_requested_cancel_survives_a_takeover(pool: asyncpg.Pool, dsn: str) -> None:
    tool, calls = recording_tool()
    await make_agent(pool, tools=["echo"])
    run_id = await enqueue(pool)
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt = 1, lease_owner = 'dies-soon', "
        "lease_expires_at = now() + interval '1 minute'"
    )
    assert await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, run_id) == "running"
    await pool.execute("UPDATE runs SET lease_expires_at = now() - interval '1 second'")
    assert await sweep(pool, dsn) == 1
    script = scripted({"tool_calls": [call("echo", text="x")]}, {"text": "done"})
    stats = await run_until_idle(dsn, script, [tool])
    assert stats.finished == {"cancelled": 1}
    assert script.calls == 0  # seen at the claim: cancelled before any model call
    run = await details(pool, run_id)
    assert run["status"] == "cancelled" and run["attempt"] == 2 and calls == []
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, run_id)  # resume clears the request
    await run_until_idle(dsn, script, [tool])
    assert (await details(pool, run_id))["status"] == "succeeded"


async def test_a_reused_tool_use_id_is_never_executed(pool: asyncpg.Pool, dsn: str) -> None:
    """Turn 2 reuses turn 1's id: it is not executed, its refusal is recorded for its own
    turn, and after a crash in that turn the resumed run refuses it again (never runs it,
    never gives it turn 1's result)."""
    seen: list[str] = []

    async def act(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        seen.append(args["text"])
        return ToolResult(f"did {args['text']}")

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    tool = Tool("act", "Acts once.", schema, act)  # not idempotent
    await make_agent(pool, tools=["act"])
    run_id = await enqueue(pool)
    turns = [
        {"tool_calls": [{"id": "toolu_same", "name": "act", "input": {"text": "first"}}]},
        {"tool_calls": [{"id": "toolu_same", "name": "act", "input": {"text": "second"}}]},
        {"text": "done"},
    ]
    await run_until_idle(dsn, scripted(*turns), [tool])
    seqs = await pool.fetch(
        "SELECT seq FROM messages WHERE run_id = $1 AND role = 'assistant' ORDER BY seq", run_id
    )
    first_seq, second_seq = seqs[0]["seq"], seqs[1]["seq"]
    row = await pool.fetchrow(
        "SELECT result->>'content' AS content, message_seq FROM tool_calls WHERE run_id = $1",
        run_id,
    )
    assert row["message_seq"] == second_seq and "already used" in row["content"]
    assert seen == ["first"]
    session = (await details(pool, run_id))["session_id"]
    await _crash_after_last_tool_call(pool, run_id, session)
    # as it was before the second call recorded: the first turn's result
    await pool.execute(
        'UPDATE tool_calls SET result = \'{"content": "did first"}\'::jsonb, '
        "message_seq = $2 WHERE run_id = $1",
        run_id,
        first_seq,
    )
    await run_until_idle(dsn, scripted(*turns), [tool])
    run = await details(pool, run_id)
    assert run["status"] == "succeeded" and seen == ["first"]
    answer = run["transcript"][-2]["content"][0]
    assert answer["type"] == "tool_result" and answer["is_error"]
    assert "did first" not in str(answer["content"])
    assert "was already used by an earlier call" in str(answer["content"])


async def test_a_duplicate_tool_use_id_in_one_response_is_an_error_result(
    pool: asyncpg.Pool, dsn: str
) -> None:
    tool, calls = recording_tool()
    await make_agent(pool, tools=["echo"])
    run_id = await enqueue(pool)
    twice = [
        {"id": "toolu_dup", "name": "echo", "input": {"text": "a"}},
        {"id": "toolu_dup", "name": "echo", "input": {"text": "b"}},
    ]
    await run_until_idle(dsn, scripted({"tool_calls": twice}, {"text": "done"}), [tool])
    run = await details(pool, run_id)
    assert run["status"] == "succeeded" and calls == [{"text": "a"}]
    results = run["transcript"][2]["content"]
    assert [r.get("is_error", False) for r in results] == [False, True]
    assert "appears more than once in this response" in results[1]["content"]
    recorded = await pool.fetchval(
        "SELECT result->>'content' FROM tool_calls WHERE run_id = $1", run_id
    )
    assert recorded == "echo: a"  # the duplicate's error never replaces the real result


async def test_queue_age_and_wait_count_from_requeue_and_sweep_failures_are_counted(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    old, lost = await enqueue(pool), await enqueue(pool)
    # created an hour ago, resumed (re-queued) 2 seconds ago
    await pool.execute(
        "UPDATE runs SET created_at = now() - interval '1 hour', "
        "queued_at = now() - interval '2 seconds' WHERE id = $1",
        old,
    )
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt = 1, lease_owner = 'gone', lost_count = 4, "
        "lease_expires_at = now() - interval '1 second' WHERE id = $1",
        lost,
    )
    failed = sample("hango_runs_failed_total", error_type="max_attempts")
    finished = sample("hango_runs_finished_total", status="failed")
    assert await sweep(pool, dsn, max_attempts=5) == 1
    assert sample("hango_runs_failed_total", error_type="max_attempts") == failed + 1
    assert sample("hango_runs_finished_total", status="failed") == finished + 1
    assert (await details(pool, lost))["events"][-1]["type"] == "run_finished"
    assert 2 <= sample("hango_queue_oldest_age_seconds") < 600
    waits = sample("hango_queue_wait_seconds_count")
    under_a_minute = sample("hango_queue_wait_seconds_bucket", le="60.0")
    await run_until_idle(dsn, scripted({"text": "ok"}))
    assert sample("hango_queue_wait_seconds_count") == waits + 1
    assert sample("hango_queue_wait_seconds_bucket", le="60.0") == under_a_minute + 1


async def test_a_pending_cancel_reruns_nothing_on_resume() -> None:
    """A run taken over with a cancel pending ends cancelled without re-running the
    interrupted batch's idempotent tools (in memory: the loop's resume step)."""
    from hango_worker.agent.loop import RunInfo
    from hango_worker.provider.types import Message, TextBlock, ToolUseBlock
    from hango_worker.testing.inmem import MemoryRunIO, make_state, run_agent
    from tests.helpers import agent

    tool, calls = recording_tool(idempotent=True)
    spec = agent(tools=["echo"])
    pending = Message("assistant", [ToolUseBlock(id="toolu_1", name="echo", input={"text": "x"})])
    state = make_state(spec, history=[Message("user", [TextBlock("go")]), pending], text=None)
    io = MemoryRunIO()
    io.control.cancel.set()
    outcome, state, io = await run_agent(
        spec,
        scripted({"text": "never"}),
        tools=[tool],
        state=state,
        io=io,
        info=RunInfo(persisted=2, turns_done=1),
    )
    assert outcome.status == "cancelled" and calls == []
    answer = state.messages[-1].content[0]
    assert getattr(answer, "is_error", False) and "interrupted" in str(answer.content)
