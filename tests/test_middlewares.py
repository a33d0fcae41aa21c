"""The four shipped middlewares: allowlist, todo, repeat-call, repair."""

from __future__ import annotations

from typing import Any

import pytest

from hango_worker.agent.loop import RunInfo
from hango_worker.agent.middleware import ModelHandler, ModelRequest, ModelResponse
from hango_worker.agent.middlewares.repair import INTERRUPTED, dangling_tool_uses
from hango_worker.agent.middlewares.repeat import call_key, fnv1a64
from hango_worker.agent.middlewares.todo import TOOL_NAME
from hango_worker.agent.state import Todo, dump_state, load_state
from hango_worker.provider.types import Message, TextBlock, ToolResultBlock, ToolUseBlock
from hango_worker.testing.inmem import make_state, run_agent
from tests.helpers import agent, call, recording_tool, scripted
from tests.test_chain import CapturingProvider


def results(state: Any) -> list[ToolResultBlock]:
    return [b for m in state.messages for b in m.content if isinstance(b, ToolResultBlock)]


# -- allowlist -----------------------------------------------------------------------------


async def test_a_banned_tool_called_by_the_model_never_runs(spans: Any) -> None:
    tool, calls = recording_tool()
    outcome, state, _ = await run_agent(
        agent(tools=["calculator"]),  # echo exists in the registry but is not allowed
        scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"}),
        tools=[tool],
    )
    assert outcome.status == "succeeded"
    assert calls == []
    (r,) = results(state)
    assert r.is_error
    assert r.content == (
        "tool 'echo' is not allowed for this agent (allowed: calculator); it was not run"
    )
    (ev,) = spans.events("middleware.short_circuited")
    assert dict(ev.attributes) == {
        "hango.middleware.name": "tool_allowlist",
        "hango.middleware.reason": "tool not in allowlist",
        "gen_ai.tool.name": "echo",
    }
    (denied,) = spans.events("tool.denied")
    assert dict(denied.attributes) == {
        "hango.middleware.name": "tool_allowlist",
        "hango.middleware.reason": "tool not in allowlist",
    }


@pytest.mark.parametrize(
    ("tools", "listing"),
    [([], "none"), (["current_time", "calculator"], "calculator, current_time")],
)
async def test_a_denial_lists_what_the_agent_may_call(tools: list[str], listing: str) -> None:
    tool, _ = recording_tool()
    _, state, _ = await run_agent(
        agent(tools=tools),
        scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"}),
        tools=[tool],
    )
    (r,) = results(state)
    assert (
        r.content
        == f"tool 'echo' is not allowed for this agent (allowed: {listing}); it was not run"
    )


class ReAdder:
    """A misbehaving middleware that tries to put a banned tool back."""

    name = "re_adder"

    def __init__(self, tool: Any) -> None:
        self.tool = tool

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        return await next(req.with_request(tools=[*req.request.tools, self.tool.spec()]))


async def test_a_middleware_re_adding_a_banned_tool_is_defeated(spans: Any) -> None:
    from hango_worker.agent.stack import StackConfig, default_stack

    tool, calls = recording_tool()
    stack = default_stack(StackConfig(("calculator",)))
    stack[0] = ReAdder(tool)  # outer slot
    provider = CapturingProvider(scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"}))
    await run_agent(agent(tools=["calculator"]), provider, tools=[tool], stack=stack)
    assert [t.name for t in provider.requests[0].tools] == ["calculator"]
    assert calls == []
    rewritten = spans.events("middleware.request_rewritten")
    assert len(rewritten) == 2  # once per model call: the re-adder tries every turn
    assert dict(rewritten[0].attributes) == {
        "hango.middleware.name": "tool_allowlist",
        "hango.middleware.reason": "tools not in allowlist removed",
        "hango.tools.removed": ("echo",),
    }


async def test_dropping_an_unlisted_provided_tool_is_not_recorded_as_a_rewrite(
    spans: Any,
) -> None:
    """write_todos is offered by the Todo middleware to every agent; an agent that does
    not list it has opted out, so removing it is no rewrite of the agent's request."""
    provider = CapturingProvider(
        scripted({"tool_calls": [call("calculator", expression="1")]}, {"text": "ok"})
    )
    await run_agent(agent(tools=["calculator"]), provider)
    assert [[t.name for t in r.tools] for r in provider.requests] == [["calculator"]] * 2
    assert spans.events("middleware.request_rewritten") == []


async def test_a_denied_call_is_an_expected_outcome_not_a_span_error(spans: Any) -> None:
    from opentelemetry.trace import StatusCode
    from prometheus_client import REGISTRY

    def tool_calls(outcome: str) -> float:
        # echo is not among this agent's tools, so its label is the bounded "_unknown"
        labels = {"gen_ai_tool_name": "_unknown", "outcome": outcome}
        return REGISTRY.get_sample_value("hango_tool_calls_total", labels) or 0.0

    tool, calls = recording_tool()
    denied0, error0 = tool_calls("denied"), tool_calls("error")
    await run_agent(
        agent(tools=["calculator"]),  # echo exists but is not allowed
        scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"}),
        tools=[tool],
    )
    assert calls == []
    (span,) = spans.named("execute_tool echo")
    assert span.status.status_code == StatusCode.UNSET
    assert "error.type" not in span.attributes
    assert span.attributes["hango.tool.denied_by"] == "tool_allowlist"
    (ev,) = [e for e in span.events if e.name == "tool.denied"]
    assert ev.attributes["hango.middleware.name"] == "tool_allowlist"
    assert (tool_calls("denied"), tool_calls("error")) == (denied0 + 1, error0)


async def test_a_failing_allowed_tool_still_marks_its_span_as_an_error(spans: Any) -> None:
    from opentelemetry.trace import StatusCode

    await run_agent(
        agent(tools=["calculator"]),
        scripted({"tool_calls": [call("calculator", expression="1/0")]}, {"text": "ok"}),
    )
    (span,) = spans.named("execute_tool calculator")
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "tool_error"
    assert "hango.tool.denied_by" not in span.attributes


# -- todo ----------------------------------------------------------------------------------

PLAN = [{"content": "one", "status": "in_progress"}, {"content": "two", "status": "pending"}]


async def test_write_todos_replaces_renders_and_never_enters_messages(spans: Any) -> None:
    second = [{"content": "three", "status": "completed"}]
    provider = CapturingProvider(
        scripted(
            {"tool_calls": [call(TOOL_NAME, todos=PLAN)]},
            {"tool_calls": [call(TOOL_NAME, todos=second)]},
            {"text": "done"},
        )
    )
    outcome, state, _ = await run_agent(agent(tools=[TOOL_NAME]), provider)
    assert outcome.status == "succeeded"
    assert state.todos == [Todo(content="three", status="completed")]  # replaced, not merged
    plan_block = provider.requests[1].system[1].text
    assert plan_block == (
        "Current todo list (maintained with write_todos; update it as you work):\n"
        "1. [~] one\n"
        "2. [ ] two"
    )
    assert provider.requests[2].system[1].text.endswith("\n1. [x] three")
    assert "three" in provider.requests[2].system[1].text
    assert "one" not in provider.requests[2].system[1].text
    confirmations = [r.content for r in results(state)]
    assert confirmations[0] == "Todo list updated: 2 items (1 in progress, 0 completed, 1 pending)."
    for m in state.messages:  # the list is never echoed into history as text
        for b in m.content:
            if isinstance(b, TextBlock | ToolResultBlock):
                assert "[~] one" not in (b.text if isinstance(b, TextBlock) else b.content)
    counts = spans.events("agent.todos_updated")
    assert [dict(e.attributes) for e in counts] == [
        {
            "hango.todos.total": 2,
            "hango.todos.pending": 1,
            "hango.todos.in_progress": 1,
            "hango.todos.completed": 0,
        },
        {
            "hango.todos.total": 1,
            "hango.todos.pending": 0,
            "hango.todos.in_progress": 0,
            "hango.todos.completed": 1,
        },
    ]
    assert all("one" not in str(dict(e.attributes)) for e in counts)  # never content
    turns = [
        s
        for s in spans.named("turn ")
        if "langfuse.observation.metadata.todos_total" in s.attributes
    ]
    assert turns and turns[-1].attributes["langfuse.observation.metadata.todos_completed"] == 1
    assert turns[-1].attributes["langfuse.observation.metadata.todos_total"] == 1


@pytest.mark.parametrize(
    ("todos", "expect"),
    [
        ([{"content": "x", "status": "done"}], "todos/0/status: 'done' is not one of"),
        ([{"status": "pending"}], "todos/0: 'content' is a required property"),
        ([{"content": "", "status": "pending"}], "todos/0/content: '' should be non-empty"),
        ("not a list", "todos: 'not a list' is not of type 'array'"),
    ],
)
async def test_invalid_todo_input_is_rejected_clearly(todos: Any, expect: str) -> None:
    _, state, _ = await run_agent(
        agent(tools=[TOOL_NAME]),
        scripted({"tool_calls": [call(TOOL_NAME, todos=todos)]}, {"text": "x"}),
    )
    (r,) = results(state)
    assert r.is_error and expect in r.content
    assert state.todos == []


async def test_two_write_todos_in_one_response_are_both_rejected() -> None:
    _, state, _ = await run_agent(
        agent(tools=[TOOL_NAME]),
        scripted(
            {"tool_calls": [call(TOOL_NAME, todos=PLAN), call(TOOL_NAME, todos=PLAN)]},
            {"text": "x"},
        ),
    )
    rs = results(state)
    assert len(rs) == 2 and all(
        r.is_error and "called 2 times in one response" in r.content for r in rs
    )
    assert state.todos == []


def test_write_todos_description_carries_the_policy() -> None:
    from hango_worker.agent.middlewares.todo import DESCRIPTION
    from hango_worker.agent.middlewares.todo import Todo as TodoMiddleware

    st = make_state(agent())
    (tool,) = TodoMiddleware().provide_tools(st)
    assert (tool.name, tool.description, tool.idempotent) == (TOOL_NAME, DESCRIPTION, True)

    for phrase in (
        "REPLACES the whole list",
        "three steps",
        "trivial",
        "one item in progress",
        "completed right after",
        "not an answer",
    ):
        assert phrase in DESCRIPTION


# -- repeat call ---------------------------------------------------------------------------


def test_fnv1a64_matches_the_reference_vectors() -> None:
    assert fnv1a64(b"") == 0xCBF29CE484222325
    assert fnv1a64(b"a") == 0xAF63DC4C8601EC8C
    assert fnv1a64(b"foobar") == 0x85944171F73967E8
    assert call_key("t", {"b": 1, "a": 2}) == call_key("t", {"a": 2, "b": 1})  # canonical JSON


async def test_the_third_identical_call_is_blocked_and_not_executed(spans: Any) -> None:
    tool, calls = recording_tool()
    same = call("echo", text="again")
    outcome, state, _ = await run_agent(
        agent(tools=["echo"]),
        scripted(
            {"tool_calls": [same]},
            {"tool_calls": [same]},
            {"tool_calls": [same]},
            {"tool_calls": [call("echo", text="different")]},
            {"text": "ok"},
        ),
        tools=[tool],
    )
    assert outcome.status == "succeeded"
    assert calls == [{"text": "again"}, {"text": "again"}, {"text": "different"}]
    rs = results(state)
    assert rs[2].is_error
    assert rs[2].content == (
        "this exact call was already made 2 times; use the previous result or change approach"
    )
    assert not rs[3].is_error  # different arguments are not blocked
    (ev,) = spans.events("middleware.repeat_call_blocked")
    assert dict(ev.attributes) == {
        "hango.middleware.name": "repeat_call",
        "hango.middleware.reason": "identical call",
        "gen_ai.tool.name": "echo",
        "hango.repeat.count": 3,
    }
    (short,) = spans.events("middleware.short_circuited")
    assert dict(short.attributes) == {
        "hango.middleware.name": "repeat_call",
        "hango.middleware.reason": "repeated identical call",
    }


async def test_repeat_counts_survive_a_resume_through_state_json() -> None:
    tool, calls = recording_tool()
    same = call("echo", text="again")
    a = agent(tools=["echo"])
    _, state, _ = await run_agent(
        a, scripted({"tool_calls": [same]}, {"tool_calls": [same]}, {"text": "x"}), tools=[tool]
    )
    raw = dump_state(state)
    resumed = load_state(
        raw,
        run_id="run-1",
        session_id="s",
        agent_id=a.id,
        tenant_id="t",
        messages=[*state.messages, Message("user", [TextBlock("once more")])],
    )
    history_turns = sum(1 for m in resumed.messages if m.role == "assistant")
    turns = [{}] * history_turns + [{"tool_calls": [same]}, {"text": "ok"}]
    _, state2, _ = await run_agent(a, scripted(*turns), tools=[tool], state=resumed)
    assert len(calls) == 2  # the third, after the resume, was blocked
    assert results(state2)[-1].is_error


async def test_agent_config_threshold_overrides_the_default() -> None:
    tool, calls = recording_tool()
    same = call("echo", text="x")
    await run_agent(
        agent(tools=["echo"], repeat_call_threshold=2),
        scripted({"tool_calls": [same]}, {"tool_calls": [same]}, {"text": "ok"}),
        tools=[tool],
    )
    assert len(calls) == 1


# -- repair --------------------------------------------------------------------------------


async def test_dangling_tool_use_is_repaired_before_the_first_model_call() -> None:
    dangling = [
        Message("user", [TextBlock("hi")]),
        Message("assistant", [ToolUseBlock("toolu_old", "echo", {"text": "1"})]),
    ]
    tool, calls = recording_tool()  # not idempotent: never re-run, repaired instead
    a = agent(tools=["echo"])
    state = make_state(a, text=None, history=dangling)
    provider = CapturingProvider(scripted({}, {"text": "recovered"}))
    info = RunInfo(persisted=2)  # the history is already in the store
    outcome, state, io = await run_agent(a, provider, state=state, tools=[tool], info=info)
    assert outcome.status == "succeeded"
    assert calls == []
    sent = provider.requests[0].messages
    cc = {"type": "ephemeral"}  # PromptCache's breakpoint on the newest message (a copy)
    assert sent[2].content == [ToolResultBlock("toolu_old", INTERRUPTED, True, cc)]
    assert dangling_tool_uses(sent) == []
    assert io.messages[0].content[0] == ToolResultBlock("toolu_old", INTERRUPTED, is_error=True)


async def test_a_repair_is_recorded_on_its_before_run_span(spans: Any) -> None:
    dangling = [
        Message("user", [TextBlock("hi")]),
        Message("assistant", [ToolUseBlock("toolu_a", "echo", {"text": "1"})]),
    ]
    tool, _ = recording_tool()
    a = agent(tools=["echo"])
    state = make_state(a, text=None, history=dangling)
    await run_agent(
        a, scripted({}, {"text": "ok"}), state=state, tools=[tool], info=RunInfo(persisted=2)
    )
    (hook,) = spans.named("agent.before_run repair_tool_calls")
    (ev,) = [e for e in hook.events if e.name == "middleware.request_rewritten"]
    assert dict(ev.attributes) == {
        "hango.middleware.name": "repair_tool_calls",
        "hango.middleware.reason": "dangling tool_use repaired",
        "hango.repair.count": 1,
    }


def test_repair_fills_gaps_in_the_middle_of_history_in_place() -> None:
    from hango_worker.agent.middlewares.repair import repair

    msgs = [
        Message("user", [TextBlock("q")]),
        Message("assistant", [ToolUseBlock("a", "x", {}), ToolUseBlock("b", "x", {})]),
        Message("user", [ToolResultBlock("a", "ok"), TextBlock("and then?")]),
        Message("assistant", [TextBlock("done")]),
    ]
    assert repair(msgs) == 1
    assert len(msgs) == 4
    assert [type(b).__name__ for b in msgs[2].content] == [
        "ToolResultBlock",
        "ToolResultBlock",
        "TextBlock",
    ]
    assert dangling_tool_uses(msgs) == []


async def test_repeat_state_stays_bounded_and_keeps_recent_calls() -> None:
    from hango_worker.agent.middlewares.repeat import MAX_TRACKED, RepeatState
    from hango_worker.agent.state import load_private

    tool, calls = recording_tool()
    n = MAX_TRACKED + 20
    turns = [{"tool_calls": [call("echo", text=f"t{i}")]} for i in range(n)]
    turns += [{"tool_calls": [call("echo", text=f"t{n - 1}")]}] * 2  # a recent call, twice more
    _, state, _ = await run_agent(
        agent(tools=["echo"]), scripted(*turns, {"text": "ok"}), tools=[tool], max_turns=n + 5
    )
    st, found = load_private(state, "repeat_call", RepeatState)
    assert found and len(st.recent) == MAX_TRACKED
    assert len(calls) == n + 1  # the third identical recent call was still blocked


async def test_repeat_window_order_survives_a_jsonb_round_trip(pool: Any) -> None:
    """jsonb reorders object keys; the window must still forget the oldest call."""
    from hango_worker.agent.middlewares.repeat import MAX_TRACKED, RepeatState

    st = RepeatState()
    for i in range(MAX_TRACKED):
        st.bump(f"k{i:03d}" if i else "zzz-oldest")
    raw = await pool.fetchval("SELECT $1::jsonb", st.model_dump(mode="json"))
    back = RepeatState.model_validate(raw)
    back.bump("new")
    assert "zzz-oldest" not in {k for k, _ in back.recent}
    assert back.recent[-1] == ("new", 1)


async def test_repeat_metric_labels_only_known_tools() -> None:
    from prometheus_client import REGISTRY

    def blocked(label: str) -> float:
        v = REGISTRY.get_sample_value(
            "hango_middleware_repeat_blocked_total", {"gen_ai_tool_name": label}
        )
        return v or 0.0

    made_up = call("made_up_tool_x9", q=1)
    before, calc_before = blocked("_unknown"), blocked("calculator")
    same = call("calculator", expression="1")
    await run_agent(
        agent(tools=["calculator"]), scripted(*[{"tool_calls": [same]}] * 3, {"text": "ok"})
    )
    assert blocked("calculator") == calc_before + 1  # a known tool keeps its name
    await run_agent(
        agent(tools=["calculator"]), scripted(*[{"tool_calls": [made_up]}] * 3, {"text": "ok"})
    )
    assert blocked("_unknown") == before + 1
    assert blocked("made_up_tool_x9") == 0.0


def _short_circuits(middleware: str) -> float:
    from prometheus_client import REGISTRY

    v = REGISTRY.get_sample_value(
        "hango_middleware_tool_short_circuits_total", {"middleware": middleware}
    )
    return v or 0.0


async def test_every_short_circuit_is_counted_by_the_middleware_that_made_it() -> None:
    tool, calls = recording_tool()
    same = call("echo", text="again")
    allow0, repeat0 = _short_circuits("tool_allowlist"), _short_circuits("repeat_call")
    await run_agent(
        agent(tools=["echo"]),
        scripted(
            {"tool_calls": [call("calculator", expression="1")]},  # not allowed
            {"tool_calls": [same]},
            {"tool_calls": [same]},
            {"tool_calls": [same]},  # third identical: blocked
            {"text": "ok"},
        ),
        tools=[tool],
    )
    assert len(calls) == 2
    assert _short_circuits("tool_allowlist") == allow0 + 1
    assert _short_circuits("repeat_call") == repeat0 + 1
