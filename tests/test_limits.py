"""The turn limit ends a run with an answer (agent/limits.py, docs/design.md §12):
one last model call without tools, status succeeded, the limit recorded."""

from __future__ import annotations

import io
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.cli.show import showable
from hango_worker.provider.types import Request, Response, TextSink, ToolResultBlock
from hango_worker.render import Painter, print_run
from hango_worker.store import repo
from hango_worker.testing.memory import run_agent
from tests.helpers import agent, call, recording_tool, scripted
from tests.test_chain import CapturingProvider
from tests.test_loop import STACKS
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle


def _limits(on_limit: str) -> float:
    labels = {"limit": "max_turns", "on_limit": on_limit}
    return REGISTRY.get_sample_value("hango_run_limits_total", labels) or 0.0


def _looping(n: int = 10) -> list[dict[str, Any]]:
    return [{"text": f"step {i}", "tool_calls": [call("echo", text=f"{i}")]} for i in range(n)]


@pytest.mark.parametrize("stack", STACKS)
async def test_max_turns_ends_with_one_tool_free_call_for_the_answer(stack: Any) -> None:
    tool, calls = recording_tool()
    provider = CapturingProvider(scripted(*_looping()))
    before = _limits("answer")
    outcome, state, io = await run_agent(
        agent(tools=["echo"]), provider, tools=[tool], stack=stack, max_turns=3
    )
    assert (outcome.status, outcome.error, outcome.limit) == ("succeeded", None, "max_turns")
    assert len(calls) == 3 and len(provider.requests) == 4  # 3 turns + the wind-up call
    *turns, last = provider.requests
    assert all(r.tool_choice is None for r in turns)
    assert last.tool_choice == {"type": "none"}
    assert [t.name for t in last.tools] == [t.name for t in turns[-1].tools]  # prefix unchanged
    # the question rides on the last tool-result turn, after its results, and is stored
    asked = last.messages[-1]
    assert asked.role == "user" and isinstance(asked.content[0], ToolResultBlock)
    assert "reached its max_turns limit (3)" in asked.content[-1].text  # type: ignore[union-attr]
    assert state.messages[-1].text() == "step 3" and not state.messages[-1].tool_uses()
    assert io.messages == state.messages  # the question and the answer were stored
    assert [e.payload for e in io.events if e.type == "limit_reached"] == [
        {"limit": "max_turns", "turn": 4}
    ]
    assert _limits("answer") == before + 1


async def test_the_limit_is_on_the_span_and_the_turn_records_it(spans: Any) -> None:
    tool, _ = recording_tool()
    await run_agent(agent(tools=["echo"]), scripted(*_looping()), tools=[tool], max_turns=2)
    (run,) = spans.named("invoke_agent tester")
    assert run.attributes["hango.run.limit"] == "max_turns"
    (turn,) = spans.named("turn 3")
    assert turn.attributes["hango.run.limit"] == "max_turns"
    assert [e.name for e in turn.events if e.name == "agent.limit_reached"] == [
        "agent.limit_reached"
    ]
    assert not spans.named("turn 4")


async def test_on_limit_fail_makes_no_wind_up_call() -> None:
    tool, _ = recording_tool()
    provider = scripted(*_looping())
    before = _limits("fail")
    outcome, _, _ = await run_agent(
        agent(tools=["echo"], on_limit="fail"), provider, tools=[tool], max_turns=2
    )
    assert (outcome.status, outcome.limit, provider.calls) == ("failed", "max_turns", 2)
    assert outcome.error is not None and outcome.error["type"] == "max_turns"
    assert _limits("fail") == before + 1


class IgnoresToolChoice:
    """A model that calls a tool even when told it may not."""

    name = "scripted"

    def __init__(self) -> None:
        self.inner = scripted(*_looping())

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        resp: Response = await self.inner.complete(
            Request(model=request.model, messages=request.messages, tools=request.tools), on_text
        )
        return resp


async def test_a_wind_up_answer_that_calls_tools_fails_the_run_and_runs_nothing() -> None:
    tool, calls = recording_tool()
    outcome, state, _ = await run_agent(
        agent(tools=["echo"]), IgnoresToolChoice(), tools=[tool], max_turns=2
    )
    assert (outcome.status, outcome.limit) == ("failed", "max_turns")
    assert outcome.error is not None
    assert "called tools instead of answering" in outcome.error["message"]
    assert len(calls) == 2  # the wind-up's call was never executed
    assert state.messages[-1].tool_uses()


async def test_a_run_at_its_limit_on_postgres_records_it_and_resume_clears_it(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="loop", tools=["calculator"])
    looping = [{"text": "more", "tool_calls": [call("calculator", expression="1+1")]}] * 5
    run_id = await enqueue(pool, agent="loop")
    await run_until_idle(dsn, scripted(*looping), max_turns=2)
    run = await details(pool, run_id)
    assert (run["status"], run["limit_reached"], run["error"]) == ("succeeded", "max_turns", None)
    last = run["transcript"][-1]
    assert last["role"] == "assistant" and last["content"] == [{"type": "text", "text": "more"}]
    asked = run["transcript"][-2]["content"]
    assert [b["type"] for b in asked] == ["tool_result", "text"]
    out = io.StringIO()
    print_run(Painter(out), showable(run)[0])
    assert "limit: max_turns" in out.getvalue()
    await pool.execute("UPDATE runs SET status = 'failed' WHERE id = $1", run_id)
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, run_id)
    assert (await details(pool, run_id))["limit_reached"] is None
