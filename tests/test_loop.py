"""The plain loop with the scripted model: the regression gate for the middleware chain.

Every test runs with an empty stack (`stack=[]`), which must reproduce the
plain loop exactly, and again with the default stack where the outcome must
not change for these scenarios.
"""

from __future__ import annotations

from typing import Any

import pytest

from hango_worker.agent.middleware import ModelHandler, ModelRequest, ModelResponse
from hango_worker.provider.types import Message, TextBlock, ToolResultBlock, ToolUseBlock
from hango_worker.testing.memory import run_agent
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import agent, call, recording_tool, scripted
from tests.test_chain import CapturingProvider

STACKS = [pytest.param([], id="empty-stack"), pytest.param(None, id="default-stack")]


def results(state: Any) -> list[ToolResultBlock]:
    return [b for m in state.messages for b in m.content if isinstance(b, ToolResultBlock)]


@pytest.mark.parametrize("stack", STACKS)
async def test_text_only_answer(stack: Any) -> None:
    streamed: list[str] = []
    outcome, state, io = await run_agent(
        agent(), scripted({"text": "Hello there, friend."}), stack=stack, on_text=streamed.append
    )
    assert outcome.status == "succeeded"
    assert [m.role for m in state.messages] == ["user", "assistant"]
    assert state.messages[-1].content == [TextBlock("Hello there, friend.")]
    assert "".join(streamed) == "Hello there, friend."
    assert len(streamed) > 1  # streamed as deltas, like a model
    assert [m.role for m in io.messages] == ["user", "assistant"]
    assert io.outcome is not None and io.outcome.status == "succeeded"
    assert [e.type for e in io.events] == ["run_started", "model_message", "run_finished"]


@pytest.mark.parametrize("stack", STACKS)
async def test_several_tool_calls_in_one_response(stack: Any) -> None:
    outcome, state, io = await run_agent(
        agent(),
        scripted(
            {
                "text": "Two sums.",
                "tool_calls": [
                    call("calculator", expression="2+3"),
                    call("calculator", expression="6*7"),
                ],
            },
            {"text": "5 and 42."},
        ),
        stack=stack,
    )
    assert outcome.status == "succeeded"
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "assistant"]
    uses = [b for b in state.messages[1].content if isinstance(b, ToolUseBlock)]
    res = state.messages[2].content
    assert [r.tool_use_id for r in res if isinstance(r, ToolResultBlock)] == [u.id for u in uses]
    assert [(r.content, r.is_error) for r in results(state)] == [("5", False), ("42", False)]
    assert [e.type for e in io.events].count("tool_result") == 2


@pytest.mark.parametrize("stack", STACKS)
async def test_schema_invalid_arguments_become_an_error_result(stack: Any) -> None:
    outcome, state, _ = await run_agent(
        agent(),
        scripted({"tool_calls": [call("calculator", expr="1+1")]}, {"text": "Sorry."}),
        stack=stack,
    )
    assert outcome.status == "succeeded"
    (r,) = results(state)
    assert r.is_error
    assert "invalid arguments for tool 'calculator'" in r.content
    assert "'expression' is a required property" in r.content


@pytest.mark.parametrize("stack", STACKS)
async def test_unknown_tool_becomes_an_error_result(stack: Any) -> None:
    a = agent(tools=["calculator", "teleport"])  # listed, but no such tool exists
    outcome, state, _ = await run_agent(
        a, scripted({"tool_calls": [call("teleport", to="mars")]}, {"text": "Cannot."}), stack=stack
    )
    assert outcome.status == "succeeded"
    (r,) = results(state)
    assert r.is_error and "unknown tool 'teleport'" in r.content
    assert "calculator" in r.content  # says what is available


@pytest.mark.parametrize("stack", STACKS)
async def test_a_tool_that_raises_becomes_an_error_result(stack: Any) -> None:
    async def boom(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        raise RuntimeError("disk on fire")

    tool = Tool("boom", "Fails.", {"type": "object"}, boom)
    outcome, state, _ = await run_agent(
        agent(tools=["boom"]),
        scripted({"tool_calls": [call("boom")]}, {"text": "It failed."}),
        tools=[tool],
        stack=stack,
    )
    assert outcome.status == "succeeded"
    (r,) = results(state)
    assert r.is_error and r.content == "tool 'boom' failed: RuntimeError: disk on fire"


@pytest.mark.parametrize("stack", STACKS)
async def test_max_turns_fails_the_run_clearly(stack: Any) -> None:
    tool, calls = recording_tool()
    turns = [{"tool_calls": [call("echo", text=f"step {i}")]} for i in range(10)]
    outcome, _state, io = await run_agent(
        agent(tools=["echo"]), scripted(*turns), tools=[tool], stack=stack, max_turns=3
    )
    assert outcome.status == "failed"
    assert outcome.error == {
        "type": "max_turns",
        "message": "the run reached max_turns (3) without a final answer",
    }
    assert len(calls) == 3
    assert io.outcome is outcome


@pytest.mark.parametrize("stack", STACKS)
async def test_script_running_out_fails_clearly(stack: Any) -> None:
    tool, _ = recording_tool()
    outcome, _, _ = await run_agent(
        agent(tools=["echo"]),
        scripted({"tool_calls": [call("echo", text="x")]}),
        tools=[tool],
        stack=stack,
    )
    assert outcome.status == "failed"
    assert outcome.error is not None and outcome.error["type"] == "script_exhausted"
    assert "has no turn 2" in outcome.error["message"]


@pytest.mark.parametrize("stack", STACKS)
async def test_retryable_model_error_is_retried_then_succeeds(stack: Any) -> None:
    provider = scripted(
        {"text": "ok", "error": {"type": "overloaded_error", "retryable": True, "times": 2}}
    )
    outcome, _, _ = await run_agent(agent(), provider, stack=stack)
    assert outcome.status == "succeeded"
    assert provider.calls == 3


@pytest.mark.parametrize("stack", STACKS)
async def test_fatal_model_error_fails_at_once(stack: Any) -> None:
    provider = scripted(
        {"text": "ok", "error": {"type": "authentication_error", "message": "bad key"}}
    )
    outcome, _, _ = await run_agent(agent(), provider, stack=stack)
    assert outcome.status == "failed"
    assert outcome.error == {"type": "authentication_error", "message": "bad key"}
    assert provider.calls == 1


@pytest.mark.parametrize("stack", STACKS)
async def test_tool_cut_off_by_max_tokens_is_never_executed(stack: Any) -> None:
    tool, calls = recording_tool()
    outcome, state, _ = await run_agent(
        agent(tools=["echo"]),
        scripted(
            {"tool_calls": [call("echo", text="half")], "stop_reason": "max_tokens"},
            {"text": "Retrying later."},
        ),
        tools=[tool],
        stack=stack,
    )
    assert outcome.status == "succeeded"
    assert calls == []
    (r,) = results(state)
    assert r.is_error and "cut off by max_tokens" in r.content


class InPlaceEditor:
    """A careless model wrapper that appends to the request's message list in place."""

    name = "in_place_editor"

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        req.request.messages.append(Message("user", [TextBlock("(note for this call only)")]))
        return await next(req)


async def test_model_wrappers_get_a_copy_of_the_history_not_the_history() -> None:
    provider = CapturingProvider(
        scripted({"tool_calls": [call("calculator", expression="1")]}, {"text": "ok"})
    )
    _, state, io = await run_agent(agent(), provider, stack=[InPlaceEditor()])
    # each request is a snapshot: the first one does not grow with the turns after it
    first, second = provider.requests
    assert [m.role for m in first.messages] == ["user", "user"]
    assert [m.role for m in second.messages] == ["user", "assistant", "user", "user"]
    # what a wrapper does to its request never reaches the run's history or the store
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "assistant"]
    for messages in (state.messages, io.messages):
        texts = [b.text for m in messages for b in m.content if isinstance(b, TextBlock)]
        assert "(note for this call only)" not in texts
