"""The turn limit ends a run with an answer (agent/limits.py, docs/design.md §12):
one last model call without tools, status succeeded, the limit recorded."""

from __future__ import annotations

import io
import re
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.limits import Budget, RunOverrides, merge
from hango_worker.agent.spec import AgentConfig
from hango_worker.cli.show import showable
from hango_worker.provider.types import Request, Response, TextSink, ToolResultBlock
from hango_worker.render import Painter, print_run
from hango_worker.store import repo
from hango_worker.testing.inmem import run_agent
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


# -- budgets: tokens, tool calls, deadline (one mechanism: agent/limits.py) -----------------


def _costly(n: int = 10, inp: int = 100, out: int = 10) -> list[dict[str, Any]]:
    usage = {"input_tokens": inp, "output_tokens": out}
    return [{**t, "usage": usage} for t in _looping(n)]


async def test_an_input_token_budget_winds_up_while_the_answer_still_fits() -> None:
    tool, calls = recording_tool()
    provider = scripted(*_costly())
    outcome, _, io = await run_agent(
        agent(tools=["echo"], max_input_tokens=450), provider, tools=[tool]
    )
    # after 3 turns 300 used; the next turn (≥100) and the answer (≥100) would pass 450
    assert (outcome.status, outcome.limit, provider.calls) == ("succeeded", "max_input_tokens", 4)
    assert len(calls) == 3
    assert outcome.usage.input_tokens == 400 <= 450
    assert io.usage is not None and io.usage["input_tokens"] == 400  # checkpointed every turn


async def test_a_run_already_over_budget_makes_no_model_call() -> None:
    from hango_worker.agent.loop import RunInfo
    from hango_worker.provider.types import Usage

    provider = scripted(*_costly())
    spent = RunInfo(persisted=0, usage=Usage(input_tokens=300, cache_read_input_tokens=200))
    outcome, _, _ = await run_agent(
        agent(tools=["echo"], max_input_tokens=450), provider, info=spent
    )
    assert (outcome.status, outcome.limit, provider.calls) == ("failed", "max_input_tokens", 0)
    assert outcome.error == {
        "type": "max_input_tokens",
        "message": "the run reached max_input_tokens (500 of 450 tokens used) "
        "with no budget left for a final answer",
    }


async def test_an_output_budget_counts_each_calls_max_tokens_before_making_it() -> None:
    tool, _ = recording_tool()
    provider = scripted(*_costly(out=50))
    outcome, _, _ = await run_agent(
        agent(tools=["echo"], max_tokens=100, max_output_tokens=400), provider, tools=[tool]
    )
    # 50 per call; a turn is made only while used + 2 * 100 <= 400 (room for it and the
    # answer): 5 turns (250 used), then the wind-up (300 <= 400)
    assert (outcome.status, outcome.limit) == ("succeeded", "max_output_tokens")
    assert provider.calls == 6 and outcome.usage.output_tokens == 300 <= 400


async def test_tool_calls_over_the_limit_are_not_executed_and_the_run_winds_up() -> None:
    tool, calls = recording_tool()
    three = [call("echo", text=str(i)) for i in range(3)]
    provider = CapturingProvider(scripted({"tool_calls": three}, *_looping()))
    outcome, state, io = await run_agent(
        agent(tools=["echo"], max_tool_calls=2), provider, tools=[tool]
    )
    assert (outcome.status, outcome.limit) == ("succeeded", "max_tool_calls")
    assert io.tool_results["toolu_s0000_2"].outcome == "denied"  # recorded as refused
    assert len(calls) == 2 and len(provider.requests) == 2  # one turn, then the wind-up
    refused = state.messages[2].content[2]
    assert isinstance(refused, ToolResultBlock) and refused.is_error
    assert "at most 2 tool calls (max_tool_calls)" in refused.content
    assert state.private["limits"] == {"total": 2, "by_tool": {}, "refused": "max_tool_calls"}


async def test_a_tools_own_limit_refuses_its_next_call() -> None:
    from hango_worker.agent.limits import RunOverrides

    tool, calls = recording_tool()
    provider = scripted(*_looping())
    over = RunOverrides(tool_call_limits={"echo": 2})
    outcome, state, _ = await run_agent(agent(tools=["echo"]), provider, tools=[tool], limits=over)
    assert (outcome.status, outcome.limit, len(calls), provider.calls) == (
        "succeeded",
        "tool_call_limit",
        2,
        4,
    )
    assert "may call 'echo' at most 2 times" in state.messages[6].content[0].content  # type: ignore[union-attr]


async def test_a_deadline_that_passed_winds_up_before_the_first_turn() -> None:
    from datetime import UTC, datetime, timedelta

    from hango_worker.agent.limits import RunOverrides

    provider = scripted({"text": "the answer"})
    over = RunOverrides(deadline=datetime.now(UTC) - timedelta(seconds=1))
    outcome, state, _ = await run_agent(agent(), provider, limits=over)
    assert (outcome.status, outcome.limit, provider.calls) == ("succeeded", "deadline", 1)
    assert "deadline" in state.messages[0].content[-1].text  # type: ignore[union-attr]


def test_limits_are_validated_with_the_key_named() -> None:
    from hango_worker.agent.limits import parse_overrides

    assert parse_overrides({"max_turns": 3}) == {"max_turns": 3}
    for bad, where in [
        ({"max_turns": 0}, "max_turns"),
        ({"max_tool_cals": 1}, "max_tool_cals"),
        ({"deadline": "2030-01-01T00:00:00"}, "deadline"),  # no UTC offset
        ([1], "(root)"),
    ]:
        with pytest.raises(ValueError, match=rf"limits are invalid at {re.escape(where)}"):
            parse_overrides(bad)


async def test_a_producers_limits_reach_the_worker_and_bad_ones_fail_only_that_run(
    pool: asyncpg.Pool, dsn: str
) -> None:
    from hango_worker.client import Client

    await make_agent(pool, name="loop", tools=["calculator"])
    looping = [{"text": "more", "tool_calls": [call("calculator", expression="1+1")]}] * 5
    client = Client(pool)
    ok = await client.enqueue("loop", "go", limits={"max_tool_calls": 1})
    with pytest.raises(ValueError, match="max_tool_calls"):
        await client.enqueue("loop", "go", limits={"max_tool_calls": -1})
    bad = await enqueue(pool, agent="loop")
    await pool.execute(
        """UPDATE runs SET input = '{"text": "go", "limits": {"max_turns": "x"}}' WHERE id = $1""",
        bad,
    )
    await run_until_idle(dsn, scripted(*looping))
    run = await details(pool, ok.run_id)
    assert (run["status"], run["limit_reached"]) == ("succeeded", "max_tool_calls")
    failed = await details(pool, bad)
    assert failed["status"] == "failed" and failed["error"]["type"] == "invalid_input"
    assert "runs.input.limits is invalid at max_turns" in failed["error"]["message"]


async def test_usage_adds_up_across_attempts_and_bad_usage_fails_only_its_run(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="plain", tools=[])
    resumed, broken = await enqueue(pool, agent="plain"), await enqueue(pool, agent="plain")
    earlier = {"input_tokens": 1000, "output_tokens": 7}
    await pool.execute("UPDATE runs SET usage = $2 WHERE id = $1", resumed, earlier)
    await pool.execute(
        """UPDATE runs SET usage = '{"input_tokens": "lots"}' WHERE id = $1""", broken
    )
    answer = {"text": "ok", "usage": {"input_tokens": 5, "output_tokens": 3}}
    await run_until_idle(dsn, scripted(answer))
    run = await details(pool, resumed)
    assert run["status"] == "succeeded", run["error"]
    assert (run["usage"]["input_tokens"], run["usage"]["output_tokens"]) == (1005, 10)
    failed = await details(pool, broken)
    assert failed["error"]["type"] == "invalid_state"
    assert "runs.usage" in failed["error"]["message"]


def priced(**config: Any) -> Any:
    from hango_worker.agent.spec import AgentConfig, AgentSpec

    return AgentSpec(
        id="agent-1",
        name="tester",
        model="claude-sonnet-4-6",  # $3 / $15 per million input / output tokens
        tools=["echo"],
        config=AgentConfig(**config),
    )


async def test_a_cost_budget_winds_up_while_the_answer_still_fits() -> None:
    tool, calls = recording_tool()
    provider = scripted(*_costly(inp=1000, out=100))  # $0.0045 a call
    outcome, _, _ = await run_agent(priced(max_cost_usd=0.02), provider, tools=[tool])
    # after 3 calls $0.0135: the next call and the answer would pass $0.02; one more fits
    assert (outcome.status, outcome.limit, provider.calls) == ("succeeded", "max_cost_usd", 4)
    assert len(calls) == 3 and outcome.cost_usd == pytest.approx(0.018)


async def test_a_cost_budget_without_a_price_fails_before_any_call() -> None:
    provider = scripted(*_costly())
    outcome, _, _ = await run_agent(agent(tools=["echo"], max_cost_usd=1.0), provider)
    assert (outcome.status, outcome.limit, provider.calls) == ("failed", "max_cost_usd", 0)
    assert outcome.error is not None and "has no price" in outcome.error["message"]


async def test_max_tool_calls_used_up_exactly_winds_up_without_refusing_a_call() -> None:
    tool, calls = recording_tool()
    provider = scripted(*_looping())
    outcome, state, _ = await run_agent(
        agent(tools=["echo"], max_tool_calls=2), provider, tools=[tool]
    )
    assert (outcome.status, outcome.limit, provider.calls, len(calls)) == (
        "succeeded",
        "max_tool_calls",
        3,  # two turns with one call each, then the wind-up
        2,
    )
    assert state.private["limits"] == {"total": 2, "by_tool": {}, "refused": None}


def test_the_question_joins_an_unsaved_user_turn_or_starts_a_new_one() -> None:
    from hango_worker.agent.limits import Reached, ask_for_answer
    from hango_worker.provider.types import Message, TextBlock
    from hango_worker.vocab import RunLimit

    reached = Reached(RunLimit.MAX_TURNS, "3")
    fresh = [Message("user", [TextBlock("go")])]
    ask_for_answer(fresh, persisted=0, reached=reached)  # not stored yet: same message
    assert len(fresh) == 1 and len(fresh[0].content) == 2
    assert (
        fresh[0]
        .content[1]
        .text.startswith("[hango-worker] This run has reached its max_turns limit (3).")
    )  # type: ignore[union-attr]
    stored = [Message("user", [TextBlock("go")])]
    ask_for_answer(stored, persisted=1, reached=reached)  # stored: a message of its own
    assert [len(m.content) for m in stored] == [1, 1] and stored[1].role == "user"
    after = [Message("user", [TextBlock("go")]), Message("assistant", [TextBlock("hm")])]
    ask_for_answer(after, persisted=0, reached=reached)
    assert [m.role for m in after] == ["user", "assistant", "user"]


def test_a_run_without_overrides_gets_its_agent_s_budget_kept_per_config() -> None:
    a = AgentConfig(max_tool_calls=3, max_turns=7)
    first = merge(a, None)
    assert type(first) is Budget and first.max_tool_calls == 3
    assert merge(a, None) is first  # kept: the same config object
    b = AgentConfig(max_tool_calls=4)
    assert merge(b, None).max_tool_calls == 4  # another config, its own budget
    over = merge(a, RunOverrides(max_tool_calls=1))
    assert over.max_tool_calls == 1 and merge(a, None).max_tool_calls == 3
