"""A person in the loop (agent/middlewares/hitl.py, agent/batch.py): a call that needs approval
suspends the run before it executes; the decision decides what runs, exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from hango_worker.agent.loop import RunInfo
from hango_worker.agent.middlewares.hitl import DecisionRecord
from hango_worker.agent.state import State
from hango_worker.provider.types import ToolResultBlock
from hango_worker.testing.inmem import MemoryRunIO, run_agent
from hango_worker.vocab import Decision
from tests.helpers import agent, call, recording_tool, scripted
from tests.test_chain import CapturingProvider

BATCH = {
    "text": "Working.",
    "tool_calls": [
        call("calculator", expression="1+1"),
        call("echo", text="rm -rf /tmp/x"),
        call("calculator", expression="2+2"),
    ],
}
ANSWER = {"text": "Done."}
ECHO_ID = "toolu_s0000_1"


def approver(**config: Any) -> Any:
    base: dict[str, Any] = {"approvals": [{"tool": "echo"}]}
    return agent(tools=["calculator", "echo"], **{**base, **config})


async def suspend(a: Any = None, turns: tuple[dict[str, Any], ...] = (BATCH, ANSWER)) -> Any:
    tool, calls = recording_tool()
    outcome, state, io = await run_agent(a or approver(), scripted(*turns), tools=[tool])
    return outcome, state, io, tool, calls


async def resume(
    state: State, io: MemoryRunIO, tool: Any, decisions: dict[str, DecisionRecord], a: Any = None
) -> tuple[Any, State, MemoryRunIO, CapturingProvider]:
    """The attempt that resumes a waiting run, as the worker builds it: recorded results,
    the calls not started, the decisions for the pending turn."""
    waiting = io.outcome.waiting if io.outcome else None
    assert waiting is not None
    provider = CapturingProvider(scripted(BATCH, ANSWER))
    info = RunInfo(
        persisted=len(state.messages),
        turns_done=1,
        recorded=dict(io.tool_results),
        not_started=frozenset(waiting["not_started"]),
    )
    again = MemoryRunIO()
    outcome, state, _ = await run_agent(
        a or approver(),
        provider,
        tools=[tool],
        state=state,
        io=again,
        info=info,
        decisions=decisions,
    )
    return outcome, state, again, provider


def approve(input: dict[str, Any] | None = None) -> dict[str, DecisionRecord]:
    return {ECHO_ID: DecisionRecord(Decision.APPROVE, "echo", {"text": "rm -rf /tmp/x"}, input)}


async def test_a_call_that_needs_approval_suspends_the_run_before_it_runs() -> None:
    outcome, state, io, _, calls = await suspend()
    assert outcome.status == "waiting" and calls == []
    assert set(io.tool_results) == {"toolu_s0000_0"}  # the call before it ran and is recorded
    assert outcome.waiting == {
        "reason": "approval",
        "not_started": [ECHO_ID, "toolu_s0000_2"],
        "call": {
            "tool_use_id": ECHO_ID,
            "name": "echo",
            "input": {"text": "rm -rf /tmp/x"},
            "rule": {"tool": "echo", "when": {}},
        },
    }
    assert state.messages[-1].role == "assistant"  # no tool-result turn yet
    assert [e.type for e in io.events][-1] == "run_waiting"


async def test_approval_runs_the_call_once_then_the_rest_of_the_batch_in_order() -> None:
    _, state, io, tool, calls = await suspend()
    outcome, state, again, provider = await resume(state, io, tool, approve())
    assert outcome.status == "succeeded"
    assert calls == [{"text": "rm -rf /tmp/x"}]
    assert again.started == [ECHO_ID, "toolu_s0000_2"]  # each marked before it started
    results = provider.requests[0].messages[-1].content
    assert [b.tool_use_id for b in results] == ["toolu_s0000_0", ECHO_ID, "toolu_s0000_2"]  # type: ignore[union-attr]
    assert [b.content for b in results] == ["2", "echo: rm -rf /tmp/x", "4"]  # type: ignore[union-attr]


async def test_edited_arguments_are_what_runs() -> None:
    _, state, io, tool, calls = await suspend()
    await resume(state, io, tool, approve({"text": "ls /tmp/x"}))
    assert calls == [{"text": "ls /tmp/x"}]


async def test_a_rejection_reaches_the_model_with_its_reason_and_nothing_runs() -> None:
    _, state, io, tool, calls = await suspend()
    no = {
        ECHO_ID: DecisionRecord(
            Decision.REJECT, "echo", {"text": "rm -rf /tmp/x"}, None, "too risky"
        )
    }
    outcome, _, _, provider = await resume(state, io, tool, no)
    assert outcome.status == "succeeded" and calls == []
    rejected = provider.requests[0].messages[-1].content[1]
    assert isinstance(rejected, ToolResultBlock) and rejected.is_error
    assert rejected.content == "not executed: a person rejected this call: too risky"


async def test_a_decision_for_other_arguments_does_not_apply() -> None:
    _, state, io, tool, calls = await suspend()
    stale = {ECHO_ID: DecisionRecord(Decision.APPROVE, "echo", {"text": "something else"})}
    outcome, _, _, _ = await resume(state, io, tool, stale)
    assert outcome.status == "waiting" and calls == []


async def test_a_rule_with_when_asks_only_for_matching_arguments() -> None:
    rule = {"approvals": [{"tool": "echo", "when": {"text": "^rm "}}]}
    safe = {"tool_calls": [call("echo", text="ls")]}
    outcome, _, _, _, calls = await suspend(approver(**rule), (safe, ANSWER))
    assert outcome.status == "succeeded" and calls == [{"text": "ls"}]
    outcome, _, _, _, calls = await suspend(approver(**rule))
    assert outcome.status == "waiting" and calls == []


def test_a_rule_with_a_bad_pattern_is_refused_when_the_agent_is_read() -> None:
    with pytest.raises(ValueError, match=r"when.text: '\(' is not a valid regex"):
        approver(approvals=[{"tool": "echo", "when": {"text": "("}}])


async def test_a_banned_tool_is_never_offered_for_approval() -> None:
    banned = agent(tools=["calculator"], approvals=[{"tool": "echo"}])
    turn = {"tool_calls": [call("echo", text="x")]}
    outcome, state, _, _, calls = await suspend(banned, (turn, ANSWER))
    assert outcome.status == "succeeded" and calls == []
    refused = state.messages[2].content[0]
    assert isinstance(refused, ToolResultBlock) and "not allowed" in refused.content


async def test_ask_user_waits_for_the_answer_which_becomes_the_result() -> None:
    asker = agent(tools=["ask_user"])
    ask = {"tool_calls": [call("ask_user", question="Which region?")]}
    tool, _ = recording_tool()
    outcome, state, io = await run_agent(asker, scripted(ask, ANSWER), tools=[tool])
    assert outcome.status == "waiting" and outcome.waiting is not None
    assert outcome.waiting["reason"] == "question"
    assert outcome.waiting["call"]["question"] == "Which region?"
    answer = {
        "toolu_s0000_0": DecisionRecord(
            Decision.ANSWER, "ask_user", {"question": "Which region?"}, None, "eu-west-1"
        )
    }
    outcome, _, _, provider = await resume(state, io, tool, answer, asker)
    assert outcome.status == "succeeded"
    (result,) = provider.requests[0].messages[-1].content
    assert isinstance(result, ToolResultBlock) and result.content == "eu-west-1"


async def test_ask_user_is_offered_only_when_listed() -> None:
    provider = CapturingProvider(scripted(ANSWER))
    await run_agent(agent(tools=["calculator"]), provider)
    assert [t.name for t in provider.requests[0].tools] == ["calculator"]


async def test_a_suspended_call_is_not_counted_as_a_repeat() -> None:
    strict = approver(repeat_call_threshold=2)
    _, state, io, tool, calls = await suspend(strict)
    counts = [n for _, n in state.private["repeat_call"]["recent"]]
    assert counts == [1]  # the calculator call; the suspended echo call was not counted
    outcome, _, _, _ = await resume(state, io, tool, approve(), strict)
    assert outcome.status == "succeeded" and len(calls) == 1


async def test_the_suspended_call_span_is_not_an_error(spans: Any) -> None:
    await suspend()
    (echo,) = [s for s in spans.named("execute_tool echo")]
    assert [e.name for e in echo.events] == ["hitl.suspended"]
    assert dict(echo.events[0].attributes) == {"hango.wait.reason": "approval"}
    assert echo.status.status_code.name == "UNSET"
    (turn,) = spans.named("turn 1")
    assert "hitl.suspended" in [e.name for e in turn.events]


async def test_a_second_approval_in_the_resumed_batch_writes_no_history_again() -> None:
    two = {"tool_calls": [call("echo", text="one"), call("echo", text="two")]}
    _, state, io, tool, calls = await suspend(turns=(two, ANSWER))
    first = {
        "toolu_s0000_0": DecisionRecord(Decision.APPROVE, "echo", {"text": "one"}),
    }
    outcome, _, again, _ = await resume(state, io, tool, first)
    assert outcome.status == "waiting" and calls == [{"text": "one"}]
    assert outcome.waiting is not None and outcome.waiting["not_started"] == ["toolu_s0000_1"]
    assert again.messages == []  # the stored history is not written a second time


def test_a_rule_matches_named_arguments_by_regex_and_json_for_non_strings() -> None:
    from hango_worker.agent.middlewares.hitl import ApprovalRule

    rule = ApprovalRule(tool="deploy", when={"env": "^prod$", "replicas": "^[0-9]{2,}$"})
    assert rule.matches("deploy", {"env": "prod", "replicas": 12})
    assert not rule.matches("deploy", {"env": "prod", "replicas": 3})
    assert not rule.matches("deploy", {"env": "prod"})  # a named argument missing: no
    assert not rule.matches("other", {"env": "prod", "replicas": 12})
    nested = ApprovalRule(tool="t", when={"opts": '^\\{"a": 1, "b": 2\\}$'})
    assert nested.matches("t", {"opts": {"b": 2, "a": 1}})  # compact JSON, keys sorted


async def test_an_applied_decision_is_a_span_event_and_counted(spans: Any) -> None:
    from prometheus_client import REGISTRY

    def counted() -> float:
        value = REGISTRY.get_sample_value("hango_hitl_decisions_total", {"decision": "approve"})
        return value or 0.0

    _, state, io, tool, _ = await suspend()
    before = counted()
    await resume(state, io, tool, approve())
    assert counted() == before + 1
    (event,) = spans.events("hitl.approved")
    assert event.attributes["hango.middleware.name"] == "human_in_the_loop"
    assert event.attributes["hango.middleware.reason"] == "echo"


async def test_the_calls_after_the_waiting_one_are_answered_listed_or_skipped() -> None:
    """Behind a call that waits for approval: a call with bad arguments is answered now
    (it could never run), a repeated id is listed once, every other call is listed as
    not started in order; the approval's time limit goes at the top of the record."""
    turn = {
        "tool_calls": [
            call("echo", text="x"),  # toolu_s0000_0: waits for approval
            {"name": "calculator", "input": [1]},  # 1: bad arguments
            {"name": "calculator", "input": {"expression": "0"}, "id": "toolu_s0000_0"},
            call("calculator", expression="2+2"),  # 3: not started
            {"name": "calculator", "input": {"expression": "3"}, "id": "toolu_s0000_3"},
            call("calculator", expression="5"),  # 5: not started
        ]
    }
    a = approver(approval_timeout_s=60, on_approval_timeout="fail")
    outcome, _, io, _, calls = await suspend(a, turns=(turn, ANSWER))
    assert outcome.status == "waiting" and calls == []
    waiting = outcome.waiting
    assert waiting is not None
    assert waiting["not_started"] == ["toolu_s0000_0", "toolu_s0000_3", "toolu_s0000_5"]
    assert set(io.tool_results) == {"toolu_s0000_1"}
    refused = io.tool_results["toolu_s0000_1"]
    assert refused.outcome == "invalid_arguments" and "JSON object" in refused.content
    assert (waiting["timeout_s"], waiting["on_timeout"]) == (60, "fail")
    assert "timeout_s" not in waiting["call"] and "on_timeout" not in waiting["call"]
