"""The plain loop with the scripted model: the regression gate for the middleware chain.

Every test runs with an empty stack (`stack=[]`), which must reproduce the
plain loop exactly, and again with the default stack where the outcome must
not change for these scenarios.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry.trace import StatusCode

from hango_worker.agent.loop import RunInfo
from hango_worker.agent.middleware import (
    ModelHandler,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
    ToolHandler,
)
from hango_worker.agent.ports import Event
from hango_worker.agent.state import State, StateError
from hango_worker.provider.types import (
    Message,
    ModelError,
    Request,
    Response,
    TextBlock,
    TextSink,
    ToolResultBlock,
    ToolUseBlock,
)
from hango_worker.testing.inmem import MemoryRunIO, make_state, run_agent
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
async def test_max_turns_with_on_limit_fail_fails_the_run_clearly(stack: Any) -> None:
    tool, calls = recording_tool()
    turns = [{"tool_calls": [call("echo", text=f"step {i}")]} for i in range(10)]
    provider = scripted(*turns)
    outcome, _state, io = await run_agent(
        agent(tools=["echo"], on_limit="fail"), provider, tools=[tool], stack=stack, max_turns=3
    )
    assert (outcome.status, outcome.limit, provider.calls) == ("failed", "max_turns", 3)
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


# -- ends of a run: stop requests, cancellation, invalid state -----------------------------


def _stopper(io: MemoryRunIO, how: str) -> Tool:
    async def stop(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if how == "cancel":
            io.control.cancel.set()
        else:
            io.control.shutdown = True
        return ToolResult("stopping")

    return Tool("stopper", "Asks the run to stop.", {"type": "object"}, stop)


@pytest.mark.parametrize(("how", "status"), [("cancel", "cancelled"), ("shutdown", "released")])
async def test_a_stop_request_ends_the_run_at_the_next_turn_boundary(how: str, status: str) -> None:
    io = MemoryRunIO()
    provider = scripted({"tool_calls": [call("stopper")]}, {"text": "never played"})
    outcome, state, _ = await run_agent(
        agent(tools=["stopper"]), provider, tools=[_stopper(io, how)], io=io
    )
    assert outcome.status == status and outcome.error is None
    assert provider.calls == 1  # the batch finished; no second model call
    assert [m.role for m in state.messages] == ["user", "assistant", "user"]
    assert io.outcome is outcome and io.checkpoints[-1]["outcome"] is outcome
    assert [m.role for m in io.messages] == ["user", "assistant", "user"]  # all committed
    assert io.events[-1] == Event("run_finished", {"status": status, "error": None})


class HangsUntilCancelled:
    """A model call that never answers; it cancels the run once it has started."""

    name = "hanging"

    def __init__(self, io: MemoryRunIO) -> None:
        self.io = io
        self.interrupted = False

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.io.control.cancel.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.interrupted = True
            raise
        raise AssertionError("unreachable")


async def test_cancel_interrupts_a_model_call_in_flight() -> None:
    io = MemoryRunIO()
    provider = HangsUntilCancelled(io)
    outcome, state, _ = await run_agent(agent(), provider, io=io)
    assert outcome.status == "cancelled"
    assert provider.interrupted  # the call itself was cancelled, not left running
    assert [m.role for m in state.messages] == ["user"]
    assert io.events[-1] == Event("run_finished", {"status": "cancelled", "error": None})


class FailsFirst:
    """Raises the given model errors in order, then answers as `inner` does."""

    name = "fails_first"

    def __init__(self, inner: Any, errors: list[ModelError], on_error: Any = None) -> None:
        self.inner, self.errors, self.on_error = inner, errors, on_error
        self.calls = 0

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.calls += 1
        if self.errors:
            if self.on_error is not None:
                self.on_error()
            raise self.errors.pop(0)
        resp: Response = await self.inner.complete(request, on_text)
        return resp


def _busy(retry_after_s: float | None = None) -> ModelError:
    return ModelError("overloaded_error", "busy", retryable=True, retry_after_s=retry_after_s)


async def test_cancel_during_a_retry_backoff_ends_the_run_without_another_call() -> None:
    io = MemoryRunIO()
    provider = FailsFirst(scripted({"text": "x"}), [_busy(60.0)], on_error=io.control.cancel.set)
    outcome, _, _ = await run_agent(agent(), provider, io=io)
    assert outcome.status == "cancelled"
    assert provider.calls == 1


async def test_retries_stop_after_model_retries_and_back_off_exponentially(spans: Any) -> None:
    provider = FailsFirst(scripted({"text": "x"}), [_busy() for _ in range(10)])
    outcome, _, _ = await run_agent(agent(), provider)  # model_retries=4, retry_base_s=0.01
    assert outcome.status == "failed"
    assert outcome.error == {"type": "overloaded_error", "message": "busy"}
    assert provider.calls == 5  # the first call and four retries
    events = spans.events("model.retried")
    assert [e.attributes["hango.retry.attempt"] for e in events] == [1, 2, 3, 4]
    for e in events:
        assert e.attributes["error.type"] == "overloaded_error"
        full = 0.01 * 2 ** (e.attributes["hango.retry.attempt"] - 1)
        assert full * 0.5 <= e.attributes["hango.retry.delay_s"] <= full  # jittered down


async def test_a_retry_after_from_the_provider_is_the_backoff(spans: Any) -> None:
    provider = FailsFirst(scripted({"text": "x"}), [_busy(0.02)])
    outcome, _, _ = await run_agent(agent(), provider)
    assert outcome.status == "succeeded" and provider.calls == 2
    (ev,) = spans.events("model.retried")
    assert ev.attributes["hango.retry.delay_s"] == 0.02


class BrokenState:
    name = "broken_state"

    def __init__(self, where: str) -> None:
        self.where = where

    async def before_run(self, state: State) -> None:
        if self.where == "before_run":
            raise StateError("middleware 'broken_state': bad blob")

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        raise StateError("middleware 'broken_state': bad blob")


@pytest.mark.parametrize("where", ["before_run", "tool_call"])
async def test_unreadable_middleware_state_fails_the_run_as_invalid_state(where: str) -> None:
    outcome, _, io = await run_agent(
        agent(),
        scripted({"tool_calls": [call("calculator", expression="1")]}, {"text": "ok"}),
        stack=[BrokenState(where)],
    )
    error = {"type": "invalid_state", "message": "middleware 'broken_state': bad blob"}
    assert outcome.status == "failed" and outcome.error == error
    assert io.outcome is outcome
    assert io.events[-1] == Event("run_finished", {"status": "failed", "error": error})


# -- how the model's last answer ends the run ----------------------------------------------


async def test_max_tokens_without_tool_calls_fails_with_a_precise_reason() -> None:
    outcome, _, _ = await run_agent(agent(), scripted({"text": "cut", "stop_reason": "max_tokens"}))
    assert outcome.status == "failed"
    assert outcome.error == {
        "type": "max_tokens",
        "message": "the model hit max_tokens before finishing its answer; "
        "raise the agent's max_tokens",
    }


@pytest.mark.parametrize("reason", ["refusal", "model_context_window_exceeded"])
async def test_a_model_that_stops_by_itself_fails_the_run_naming_why(reason: str) -> None:
    outcome, _, _ = await run_agent(agent(), scripted({"text": "no", "stop_reason": reason}))
    assert outcome.status == "failed" and outcome.error is not None
    assert outcome.error["type"] == reason and reason in outcome.error["message"]


async def test_a_paused_turn_is_continued_not_ended() -> None:
    provider = scripted({"text": "thinking", "stop_reason": "pause_turn"}, {"text": "done"})
    outcome, state, _ = await run_agent(agent(), provider)
    assert outcome.status == "succeeded" and provider.calls == 2
    assert [m.role for m in state.messages] == ["user", "assistant", "assistant"]


# -- what tools and spans are told ---------------------------------------------------------


async def test_a_tool_is_told_its_run_tenant_and_call_id() -> None:
    seen: list[ToolContext] = []

    async def probe(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        seen.append(ctx)
        return ToolResult("ok")

    tool = Tool("probe", "Records its context.", {"type": "object"}, probe)
    _, state, _ = await run_agent(
        agent(tools=["probe"]),
        scripted({"tool_calls": [call("probe")]}, {"text": "ok"}),
        tools=[tool],
    )
    (use,) = state.messages[1].tool_uses()
    assert [(c.run_id, c.tenant_id, c.tool_use_id) for c in seen] == [("run-1", "tenant-1", use.id)]


async def test_the_invoke_agent_span_names_the_run_and_marks_failures(spans: Any) -> None:
    info = RunInfo(persisted=0, attempt=2, span_attributes={"hango.run.attempt": 2})
    await run_agent(agent(), scripted({"text": "ok"}), info=info)
    tools = [{"tool_calls": [call("calculator", expression=f"{i}")]} for i in range(5)]
    await run_agent(agent(on_limit="fail"), scripted(*tools), max_turns=2)
    ok, failed = spans.named("invoke_agent tester")
    a = ok.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.agent.name"]) == ("invoke_agent", "tester")
    assert (a["gen_ai.provider.name"], a["gen_ai.request.model"]) == ("scripted", "claude-test")
    assert (a["hango.run.id"], a["hango.tenant.id"], a["hango.run.attempt"]) == (
        "run-1",
        "tenant-1",
        2,
    )
    (stack,) = [e for e in ok.events if e.name == "agent.middleware_stack"]
    assert list(stack.attributes["hango.middleware.names"])[-1] == "tool_allowlist"
    assert ok.status.status_code == StatusCode.UNSET
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["error.type"] == "max_turns"
    assert failed.status.description == "the run reached max_turns (2) without a final answer"


# -- resuming an interrupted tool batch ----------------------------------------------------


async def test_an_interrupted_batch_reuses_results_reruns_idempotent_tools_repairs_the_rest(
    spans: Any,
) -> None:
    from hango_worker.agent.middlewares.repair import INTERRUPTED

    once, once_calls = recording_tool("once")  # not idempotent
    again, again_calls = recording_tool("again", idempotent=True)
    done, done_calls = recording_tool("done")  # its result was recorded before the crash
    uses = [
        ToolUseBlock("toolu_done", "done", {"text": "d"}),
        ToolUseBlock("toolu_again", "again", {"text": "a"}),
        ToolUseBlock("toolu_once", "once", {"text": "o"}),
    ]
    history = [Message("user", [TextBlock("go")]), Message("assistant", list(uses))]
    a = agent(tools=["done", "again", "once"])
    io = MemoryRunIO()
    info = RunInfo(
        persisted=2, turns_done=1, recorded={"toolu_done": ToolResult("recorded before")}
    )
    outcome, state, _ = await run_agent(
        a,
        scripted({}, {"text": "finished"}),  # turn 2 is played: one assistant message so far
        tools=[once, again, done],
        state=make_state(a, text=None, history=history),
        io=io,
        info=info,
    )
    assert outcome.status == "succeeded"
    assert (done_calls, again_calls, once_calls) == ([], [{"text": "a"}], [])
    by_id = {r.tool_use_id: r for r in results(state)}
    assert by_id["toolu_done"].content == "recorded before"
    assert by_id["toolu_again"].content == "echo: a" and not by_id["toolu_again"].is_error
    assert by_id["toolu_once"].content == INTERRUPTED and by_id["toolu_once"].is_error
    assert list(io.tool_results) == ["toolu_again"]  # only the re-run is recorded anew
    (resumed,) = spans.named("resume tool batch")
    assert resumed.attributes["hango.turn.index"] == 1
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "assistant"]
    assert [m.role for m in io.messages] == ["user", "assistant"]  # only what is new


async def test_a_history_that_ends_in_an_answer_has_nothing_to_resume(spans: Any) -> None:
    tool, calls = recording_tool()
    history = [Message("user", [TextBlock("go")]), Message("assistant", [TextBlock("hi")])]
    a = agent(tools=["echo"])
    state = make_state(a, text="again", history=history)
    outcome, state, _ = await run_agent(
        a, scripted({}, {"text": "ok"}), tools=[tool], state=state, info=RunInfo(persisted=2)
    )
    assert outcome.status == "succeeded" and calls == []
    assert spans.named("resume tool batch") == []
    assert [m.role for m in state.messages] == ["user", "assistant", "user", "assistant"]


async def test_the_provider_gets_the_agents_settings_and_events_carry_each_turn(
    spans: Any,
) -> None:
    provider = CapturingProvider(
        scripted(
            {"text": "sum", "tool_calls": [call("calculator", expression="2+2")]},
            {"text": "4", "usage": {"input_tokens": 7, "output_tokens": 3}},
        )
    )
    a = agent(max_tokens=321, temperature=0.25)
    _, state, io = await run_agent(a, provider)
    first = provider.requests[0]
    assert (first.model, first.max_tokens, first.temperature) == ("claude-test", 321, 0.25)
    assert [t.name for t in first.tools] == ["calculator", "current_time"]
    turns = [e.payload for e in io.events if e.type == "model_message"]
    assert [(p["turn"], p["stop_reason"]) for p in turns] == [(1, "tool_use"), (2, "end_turn")]
    assert [p["message"] for p in turns] == [
        state.messages[1].to_dict(),
        state.messages[3].to_dict(),
    ]
    assert turns[1]["usage"]["input_tokens"] == 7 and turns[1]["usage"]["output_tokens"] == 3
    (use,) = state.messages[1].tool_uses()
    assert io.tool_results == {use.id: ToolResult("4")}
    (result_event,) = [e.payload for e in io.events if e.type == "tool_result"]
    assert result_event["tool_use_id"] == use.id and result_event["name"] == "calculator"
    assert result_event["input"] == {"expression": "2+2"}
    spans_by_turn = {s.name: s.attributes["hango.turn.index"] for s in spans.named("turn ")}
    assert spans_by_turn == {"turn 1": 1, "turn 2": 2}


async def test_chat_spans_name_the_provider_and_capture_content_only_when_asked(
    spans: Any,
) -> None:
    provider = FailsFirst(scripted({"text": "CONTENT-5c"}), [_busy(0.0)])
    await run_agent(agent(), provider, capture_content=True)
    failed, ok = spans.named("chat ")
    for s in (failed, ok):
        assert s.attributes["gen_ai.provider.name"] == "fails_first"
    assert failed.attributes["error.type"] == "overloaded_error"
    assert "CONTENT-5c" in ok.attributes["gen_ai.output.messages"]
    assert "hello" in ok.attributes["gen_ai.input.messages"]
    spans.exporter.clear()
    await run_agent(agent(), scripted({"text": "CONTENT-5c"}))
    (quiet,) = spans.named("chat ")
    assert "gen_ai.output.messages" not in quiet.attributes
