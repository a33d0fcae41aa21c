"""The chain: onion order, retries, short-circuits, request rewriting, system blocks by index."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hango_worker.agent.chain import Chain
from hango_worker.agent.middleware import (
    ModelHandler,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
    ToolHandler,
)
from hango_worker.agent.state import State
from hango_worker.provider.types import (
    Message,
    ModelError,
    Request,
    Response,
    TextBlock,
    TextSink,
    ToolResultBlock,
)
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.testing.inmem import run_agent
from hango_worker.tool.types import ToolResult
from tests.helpers import agent, call, recording_tool, scripted


@dataclass
class Recorder:
    """Records entry and exit of every model and tool call."""

    name: str
    log: list[str]

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        self.log.append(f"{self.name}>model")
        resp = await next(req)
        self.log.append(f"{self.name}<model")
        return resp

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        self.log.append(f"{self.name}>tool")
        res = await next(req)
        self.log.append(f"{self.name}<tool")
        return res


class CapturingProvider:
    """Wraps a provider and keeps every request it was sent."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = "scripted"
        self.requests: list[Request] = []

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.requests.append(request)
        resp: Response = await self.inner.complete(request, on_text)
        return resp


async def test_index_zero_is_outermost_for_model_and_tool_calls() -> None:
    log: list[str] = []
    stack = [Recorder("a", log), Recorder("b", log), Recorder("c", log)]
    await run_agent(
        agent(),
        scripted({"tool_calls": [call("calculator", expression="1")]}, {"text": "1"}),
        stack=stack,
    )
    assert log[:6] == ["a>model", "b>model", "c>model", "c<model", "b<model", "a<model"]
    assert log[6:12] == ["a>tool", "b>tool", "c>tool", "c<tool", "b<tool", "a<tool"]


class RetryOnce:
    name = "retry_once"

    def __init__(self) -> None:
        self.attempts = 0

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        try:
            self.attempts += 1
            return await next(req)
        except ModelError as e:
            middleware_event("middleware.retried", self.name, e.type)
            self.attempts += 1
            return await next(req)


async def test_a_model_wrapper_can_retry_once(spans: Any) -> None:
    provider = scripted({"text": "fine", "error": {"type": "flaky", "retryable": False}})
    mw = RetryOnce()
    outcome, _, _ = await run_agent(agent(), provider, stack=[mw])
    assert outcome.status == "succeeded"
    assert (mw.attempts, provider.calls) == (2, 2)
    (ev,) = spans.events("middleware.retried")
    assert ev.attributes["hango.middleware.name"] == "retry_once"
    assert ev.attributes["hango.middleware.reason"] == "flaky"


class Canned:
    name = "canned"

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        middleware_event("middleware.short_circuited", self.name, "canned answer")
        return ToolResult("canned")


async def test_a_tool_wrapper_can_short_circuit(spans: Any) -> None:
    tool, calls = recording_tool()
    _, state, _ = await run_agent(
        agent(tools=["echo"]),
        scripted({"tool_calls": [call("echo", text="hi")]}, {"text": "ok"}),
        tools=[tool],
        stack=[Canned()],
    )
    assert calls == []
    assert state.messages[2].content == [ToolResultBlock("toolu_s0000_0", "canned")]
    turns = spans.named("turn ")
    marked = [
        s.name for s in turns if any(e.name == "middleware.short_circuited" for e in s.events)
    ]
    assert marked == ["turn 1"]  # the event lands on the enclosing turn span


class Rewriter:
    name = "rewriter"

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        extra = Message("user", [TextBlock("(injected for this call only)")])
        return await next(req.with_request(messages=[*req.request.messages, extra]))


async def test_rewriting_the_request_leaves_persisted_history_unchanged() -> None:
    provider = CapturingProvider(scripted({"text": "ok"}))
    _, state, io = await run_agent(agent(), provider, stack=[Rewriter()])
    assert provider.requests[0].messages[-1].content == [TextBlock("(injected for this call only)")]
    texts = [b.text for m in state.messages for b in m.content if isinstance(b, TextBlock)]
    assert "(injected for this call only)" not in texts
    assert "(injected for this call only)" not in str([m.to_dict() for m in io.messages])


@dataclass
class Contributor:
    name: str
    text: str

    def system_blocks(self, state: State) -> list[TextBlock]:
        return [TextBlock(self.text)]


@dataclass
class CacheBreakpoint:
    """Placeholder for the prompt-cache middleware: marks the block at `index`."""

    name: str = "prompt_cache_placeholder"
    index: int = 1
    seen: list[list[str]] = field(default_factory=list)

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        def mark(blocks: list[TextBlock]) -> list[TextBlock]:
            self.seen.append([b.text for b in blocks])
            out = list(blocks)
            out[self.index] = TextBlock(out[self.index].text, {"type": "ephemeral"})
            return out

        return await next(req.rewrite_system(mark))


async def test_system_blocks_by_index_and_the_cache_breakpoint_contract() -> None:
    provider = CapturingProvider(scripted({"text": "ok"}))
    bp = CacheBreakpoint(index=1)
    stack = [Contributor("early", "EARLY"), bp, Contributor("memory_like", "MEMORY")]
    await run_agent(agent(), provider, stack=stack)
    system = provider.requests[0].system
    assert [b.text for b in system] == ["You are a test agent.", "EARLY", "MEMORY"]
    assert system[0].text == "You are a test agent."  # the agent's own blocks come first
    assert system[1].cache_control == {"type": "ephemeral"}  # breakpoint at index 1
    assert system[2].cache_control is None  # a later contributor lands after the breakpoint
    assert bp.seen == [["You are a test agent.", "EARLY", "MEMORY"]]  # saw the assembled blocks


async def test_system_is_assembled_on_every_model_call_from_current_state() -> None:
    provider = CapturingProvider(
        scripted(
            {"tool_calls": [call("write_todos", todos=[{"content": "a", "status": "pending"}])]},
            {"text": "done"},
        )
    )
    await run_agent(agent(tools=["write_todos"]), provider)
    first, second = (r.system for r in provider.requests)
    assert len(first) == 1  # no plan yet
    assert len(second) == 2 and "1. [ ] a" in second[1].text


class ScratchProbe:
    name = "scratch_probe"

    def __init__(self) -> None:
        self.at_batch_start: list[dict[str, Any]] = []
        self._batch_seen: set[int] = set()

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        batch = id(req.state.messages[-1])
        if batch not in self._batch_seen:
            self._batch_seen.add(batch)
            self.at_batch_start.append(dict(req.state.scratch))
        req.state.scratch["touched"] = req.state.scratch.get("touched", 0) + 1
        return await next(req)


async def test_scratch_is_empty_at_the_start_of_every_batch() -> None:
    probe = ScratchProbe()
    two = [call("calculator", expression="1"), call("calculator", expression="2")]
    _, state, _ = await run_agent(
        agent(), scripted({"tool_calls": two}, {"tool_calls": two}, {"text": "done"}), stack=[probe]
    )
    assert probe.at_batch_start == [{}, {}]
    assert state.scratch == {}


def test_chain_partitions_once_and_rejects_duplicate_names() -> None:
    log: list[str] = []
    chain = Chain([Recorder("a", log), None, Contributor("c", "x")])
    assert chain.names == ["a", "c"]
    assert [m.name for m in chain.model_wrappers] == ["a"]
    assert [m.name for m in chain.contributors] == ["c"]
    try:
        Chain([Recorder("a", log), Recorder("a", log)])
    except ValueError as e:
        assert "appears twice" in str(e)
    else:
        raise AssertionError("duplicate middleware names must be rejected")


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


class Hook:
    name = "probe_hook"

    def __init__(self) -> None:
        self.calls = 0

    async def before_run(self, state: State) -> None:
        self.calls += 1


async def test_before_run_hooks_run_once_under_spans_and_are_timed(spans: Any) -> None:
    hook = Hook()
    count = "hango_middleware_before_run_duration_seconds_count"
    before = _sample(count, middleware="probe_hook")
    await run_agent(
        agent(),
        scripted({"tool_calls": [call("calculator", expression="1")]}, {"text": "ok"}),
        stack=[hook],
    )
    assert hook.calls == 1  # once per run attempt, not per turn
    assert _sample(count, middleware="probe_hook") == before + 1
    (child,) = spans.named("agent.before_run probe_hook")
    assert child.attributes["hango.middleware.name"] == "probe_hook"
    (parent,) = [s for s in spans.named("agent.before_run") if s.name == "agent.before_run"]
    assert child.parent is not None and child.parent.span_id == parent.context.span_id


async def test_a_chain_without_hooks_opens_no_before_run_span(spans: Any) -> None:
    await run_agent(agent(), scripted({"text": "ok"}), stack=[])
    assert spans.named("agent.before_run") == []
