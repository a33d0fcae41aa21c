"""The worker on Postgres: a run end to end, checkpoints, bad input, resume with plan."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from hango_worker.store import repo
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import call, recording_tool, scripted
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

PLAN = [{"content": "first", "status": "in_progress"}, {"content": "second", "status": "pending"}]


async def test_a_run_end_to_end(pool: asyncpg.Pool, dsn: str) -> None:
    tool, calls = recording_tool()
    await make_agent(pool, tools=["echo", "write_todos"])
    run_id = await enqueue(pool, "please echo")
    provider = scripted(
        {"text": "Planning.", "tool_calls": [call("write_todos", todos=PLAN)]},
        {"text": "Echoing.", "tool_calls": [call("echo", text="hi")]},
        {"text": "All done."},
    )
    stats = await run_until_idle(dsn, provider, [tool])
    assert stats.finished == {"succeeded": 1}
    run = await details(pool, run_id)
    assert run["status"] == "succeeded" and run["attempt"] == 1 and run["error"] is None
    assert run["finished_at"] is not None and run["lease_owner"] is None
    roles = [m["role"] for m in run["transcript"]]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant"]
    assert run["transcript"][0]["content"] == [{"type": "text", "text": "please echo"}]
    assert run["transcript"][-1]["content"] == [{"type": "text", "text": "All done."}]
    assert run["state_json"]["todos"] == PLAN
    assert calls == [{"text": "hi"}]
    types = [e["type"] for e in run["events"]]
    assert types[:2] == ["run_started", "model_message"]
    assert types.count("tool_result") == 2 and types[-1] == "run_finished"
    assert run["usage"]["output_tokens"] > 0
    recorded = await pool.fetch(
        "SELECT tool_use_id, name FROM tool_calls WHERE run_id = $1", run_id
    )
    assert sorted(r["name"] for r in recorded) == ["echo", "write_todos"]


async def test_every_turn_is_checkpointed_before_its_tools_run(
    pool: asyncpg.Pool, dsn: str
) -> None:
    seen: list[dict[str, Any]] = []

    async def probe(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        rows = await pool.fetch(
            "SELECT role FROM messages m JOIN runs r ON r.session_id = m.session_id "
            "WHERE r.id = $1 ORDER BY seq",
            ctx.run_id,
        )
        state = await pool.fetchval("SELECT state_json FROM runs WHERE id = $1", ctx.run_id)
        seen.append({"roles": [r["role"] for r in rows], "todos": len(state.get("todos", []))})
        return ToolResult("probed")

    tool = Tool("probe", "Reads the database.", {"type": "object"}, probe)
    await make_agent(pool, tools=["probe", "write_todos"])
    await enqueue(pool)
    provider = scripted(
        {"tool_calls": [call("write_todos", todos=PLAN), call("probe")]},
        {"tool_calls": [call("probe")]},
        {"text": "done"},
    )
    await run_until_idle(dsn, provider, [tool])
    assert seen == [
        {"roles": ["user", "assistant"], "todos": 2},
        {"roles": ["user", "assistant", "user", "assistant"], "todos": 2},
    ]


async def test_broken_state_json_fails_that_run_only(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    bad = await enqueue(pool, "one")
    good = await enqueue(pool, "two")
    await pool.execute("UPDATE runs SET state_json = $2 WHERE id = $1", bad, {"todos": "oops"})
    stats = await run_until_idle(dsn, scripted({"text": "fine"}))
    assert stats.finished == {"failed": 1, "succeeded": 1}
    run = await details(pool, bad)
    assert run["status"] == "failed"
    assert run["error"] == {"type": "invalid_state", "message": "state_json.todos must be a list"}
    assert run["state_json"] == {"todos": "oops"}  # left as found, for the operator
    assert (await details(pool, good))["status"] == "succeeded"


async def test_invalid_agent_config_fails_the_run_clearly(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    await pool.execute("UPDATE agents SET config = $1", {"max_turns": "many"})
    run_id = await enqueue(pool)
    await run_until_idle(dsn, scripted({"text": "x"}))
    run = await details(pool, run_id)
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_agent"
    assert "max_turns" in run["error"]["message"]


async def test_unreadable_history_fails_the_run_clearly(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    first = await enqueue(pool)
    await run_until_idle(dsn, scripted({"text": "x"}))
    session = (await details(pool, first))["session_id"]
    # a block of an unknown type is kept (docs/system-architecture.md, "Content blocks");
    # one with no type at all is not a block
    await pool.execute("UPDATE messages SET content = $1 WHERE seq = 1", [{"hologram": 1}])
    second = await enqueue(pool, session_id=session)
    await run_until_idle(dsn, scripted({"text": "x"}, {"text": "y"}))
    run = await details(pool, second)
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_history"
    assert "message seq 1" in run["error"]["message"]
    assert "needs a string 'type'" in run["error"]["message"]


async def test_a_session_continues_its_history(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    first = await enqueue(pool, "one")
    await run_until_idle(dsn, scripted({"text": "A"}, {"text": "B"}))
    session = (await details(pool, first))["session_id"]
    second = await enqueue(pool, "two", session_id=session)
    await run_until_idle(dsn, scripted({"text": "A"}, {"text": "B"}))
    run = await details(pool, second)
    assert [m["content"][0]["text"] for m in run["transcript"]] == ["one", "A", "two", "B"]


async def test_cancel_mid_run_then_resume_keeps_plan_and_repeat_counts(
    pool: asyncpg.Pool, dsn: str
) -> None:
    tool, calls = recording_tool()
    cancelled = False

    async def cancel_me(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        nonlocal cancelled
        if not cancelled:
            cancelled = True
            await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, ctx.run_id)
        return ToolResult("ok")

    stopper = Tool("stopper", "Cancels its own run once.", {"type": "object"}, cancel_me)
    await make_agent(pool, tools=["echo", "write_todos", "stopper"])
    run_id = await enqueue(pool)
    same = call("echo", text="same")
    script = [
        {"tool_calls": [call("write_todos", todos=PLAN), same]},
        {"tool_calls": [same, call("stopper")]},
        {"tool_calls": [same]},  # third identical call: must be blocked after the resume
        {"text": "finished"},
    ]
    await run_until_idle(dsn, scripted(*script), [tool, stopper])
    run = await details(pool, run_id)
    assert run["status"] == "cancelled"
    assert run["state_json"]["todos"] == PLAN
    assert len(calls) == 2
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, run_id)
    await run_until_idle(dsn, scripted(*script), [tool, stopper])
    run = await details(pool, run_id)
    assert run["status"] == "succeeded" and run["attempt"] == 2
    assert len(calls) == 2  # the third identical call was blocked: counts survived
    last_results = [
        b for m in run["transcript"] for b in m["content"] if b["type"] == "tool_result"
    ]
    assert last_results[-1]["is_error"] and "already made 2 times" in last_results[-1]["content"]
    assert run["state_json"]["todos"] == PLAN
    assert json.dumps(run["transcript"]).count('"text": "finished"') == 1


async def test_enqueue_checks_agent_session_and_tenant(pool: asyncpg.Pool) -> None:
    import pytest

    await make_agent(pool, name="one", tools=[])
    await make_agent(pool, name="two", tools=[])
    first = await repo.enqueue(pool, tenant_id=repo.DEFAULT_TENANT_ID, agent="one", input_text="x")
    again = await repo.enqueue(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        agent="one",
        input_text="y",
        session_id=first["session_id"],
    )
    assert again["session_id"] == first["session_id"] and again["run_id"] != first["run_id"]
    other_tenant = "00000000-0000-0000-0000-0000000000aa"
    await pool.execute("INSERT INTO tenants (id, name) VALUES ($1, 'other')", other_tenant)
    cases = [
        ({"agent": "ghost"}, "no agent 'ghost'"),
        ({"agent": "two", "session_id": first["session_id"]}, "no session"),  # another agent's
        ({"agent": "one", "session_id": "nope"}, "not a session id"),
        ({"agent": "one", "tenant_id": other_tenant}, "no agent 'one'"),
    ]
    for kwargs, message in cases:
        args: dict[str, Any] = {"tenant_id": repo.DEFAULT_TENANT_ID, "input_text": "z", **kwargs}
        with pytest.raises(repo.NotFound, match=message):
            await repo.enqueue(pool, **args)
    assert await pool.fetchval("SELECT count(*) FROM runs") == 2
    assert await pool.fetchval("SELECT count(*) FROM sessions") == 1
