"""The agent loop: model call → tool calls → model call … until the model answers.

Every model call goes through `Chain.model_call` (base: `_base_model`), every
tool call through `Chain.tool_call` (base: `_base_tool`). With an empty chain
this is exactly the plain loop.

Durability (docs/system-architecture.md): one fenced commit per turn, made right
after the model answers (the previous turn's tool results + this assistant message +
state_json + events), plus one small fenced commit per completed tool call
(result + state_json). The final status rides on the last checkpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Link, SpanKind

from hango_worker.agent.calls import ModelCaller, RunCancelled, until_cancelled
from hango_worker.agent.chain import Chain
from hango_worker.agent.cost import RunCost
from hango_worker.agent.middleware import ModelRequest, ModelResponse, ToolCallRequest
from hango_worker.agent.ports import Event, Outcome, RunIO
from hango_worker.agent.spec import AgentSpec
from hango_worker.agent.state import State, StateError
from hango_worker.provider.prices import PriceTable
from hango_worker.provider.sanitize import record_sanitized
from hango_worker.provider.types import (
    Message,
    ModelError,
    Provider,
    Request,
    StopReason,
    TextSink,
    ToolUseBlock,
    Usage,
)
from hango_worker.telemetry import genai
from hango_worker.telemetry.tracing import mark_error, tracer, turn_span
from hango_worker.tool.registry import View
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from hango_worker.vocab import ErrorType


@dataclass(slots=True)
class LoopSettings:
    max_turns: int = 50
    model_retries: int = 4
    retry_base_s: float = 0.5
    retry_cap_s: float = 20.0
    provider_name: str = "anthropic"
    capture_content: bool = False
    prices: PriceTable = field(default_factory=PriceTable)


@dataclass(slots=True)
class RunInfo:
    """Who is running what, for spans and tool contexts."""

    attempt: int = 1
    turns_done: int = 0  # model turns this run completed in earlier attempts
    persisted: int | None = None  # messages already in the store (None: all of them)
    parent: Any = None  # OpenTelemetry context to start the attempt's span in
    # results recorded for the calls of the pending (last, unanswered) assistant message
    recorded: dict[str, ToolResult] = field(default_factory=dict)
    span_attributes: dict[str, Any] = field(default_factory=dict)
    links: Sequence[Link] = ()
    # what earlier attempts of this run used and cost (runs.usage; None cost: unknown)
    usage_before: Usage | None = None
    cost_before: float | None = 0.0


class AgentLoop:
    def __init__(
        self,
        agent: AgentSpec,
        chain: Chain,
        view: View,
        provider: Provider,
        io: RunIO,
        settings: LoopSettings | None = None,
        on_text: TextSink | None = None,
    ) -> None:
        self.agent = agent
        self.chain = chain
        self.view = view
        self.provider = provider
        self.io = io
        self.settings = settings or LoopSettings()
        self.on_text = on_text
        self._agent_blocks = agent.system_blocks()
        self._events: list[Event] = []
        self._tools: dict[str, Tool] = {}
        self._usage = Usage()
        self._cost = RunCost(self.settings.prices, agent.model)
        self._watermark = 0
        st = self.settings
        self._model = ModelCaller(
            provider,
            io.cancel_event,
            st.model_retries,
            st.retry_base_s,
            st.retry_cap_s,
            st.provider_name,
            st.capture_content,
        )
        # bound once, so the chain composes its onion once per run, not per call
        self._base_model_handler = self._base_model
        self._base_tool_handler = self._base_tool

    # -- the run ---------------------------------------------------------------------------

    async def run(self, state: State, info: RunInfo | None = None) -> Outcome:
        info = info or RunInfo()
        if info.usage_before is not None:  # the run's totals span its attempts
            self._usage.add(info.usage_before)
            self._cost.carry(info.cost_before)
        attrs = genai.agent_attributes(self.agent, state, self.settings.provider_name)
        attrs.update(info.span_attributes)
        name = f"invoke_agent {self.agent.name}"
        with tracer().start_as_current_span(
            name, context=info.parent, kind=SpanKind.INTERNAL, attributes=attrs, links=info.links
        ) as span:
            span.add_event("agent.middleware_stack", {"hango.middleware.names": self.chain.names})
            outcome = await self._run(state, info)
            if outcome.status == "failed" and outcome.error:
                mark_error(span, str(outcome.error.get("type")), str(outcome.error.get("message")))
            genai.set_usage(span, outcome.usage)
            if outcome.cost_usd is not None:
                span.set_attribute("hango.run.cost_usd", outcome.cost_usd)
            return outcome

    async def _run(self, state: State, info: RunInfo) -> Outcome:
        persisted = len(state.messages) if info.persisted is None else info.persisted
        last = state.messages[persisted - 1] if persisted else None
        try:
            await self._resume_pending(state, info)
            await self.chain.before_run(state)
        except StateError as e:
            return await self._finish(
                state, Outcome("failed", {"type": ErrorType.INVALID_STATE, "message": str(e)})
            )
        self._watermark = self._find_watermark(state, last)
        self._events.append(Event("run_started", {"attempt": info.attempt}))
        turn = info.turns_done
        while True:
            stop = self.io.stop_requested()
            if stop is not None:
                return await self._finish(
                    state, Outcome("cancelled" if stop == "cancel" else "released")
                )
            if turn >= self.settings.max_turns:
                msg = (
                    f"the run reached max_turns ({self.settings.max_turns}) without a final answer"
                )
                return await self._finish(
                    state, Outcome("failed", {"type": ErrorType.MAX_TURNS, "message": msg})
                )
            turn += 1
            try:
                done = await self._turn(state, turn)
            except RunCancelled:
                return await self._finish(state, Outcome("cancelled"))
            except ModelError as e:
                return await self._finish(state, Outcome("failed", e.to_dict()))
            except StateError as e:
                return await self._finish(
                    state, Outcome("failed", {"type": ErrorType.INVALID_STATE, "message": str(e)})
                )
            if done is not None:
                return await self._finish(state, done)

    @staticmethod
    def _find_watermark(state: State, last: Message | None) -> int:
        """Index after the last persisted message (hooks may only append or edit in place)."""
        if last is None:
            return 0
        for i in range(len(state.messages) - 1, -1, -1):
            if state.messages[i] is last:
                return i + 1
        return len(state.messages)

    async def _finish(self, state: State, outcome: Outcome) -> Outcome:
        outcome.usage = self._usage
        outcome.cost_usd = self._cost.usd
        self._events.append(
            Event("run_finished", {"status": outcome.status, "error": outcome.error})
        )
        await self._checkpoint(state, outcome)
        return outcome

    async def _checkpoint(self, state: State, outcome: Outcome | None) -> None:
        new = state.messages[self._watermark :]
        events, self._events = self._events, []
        await self.io.checkpoint(state, new, events, outcome)
        self._watermark = len(state.messages)

    # -- one turn --------------------------------------------------------------------------

    async def _turn(self, state: State, turn: int) -> Outcome | None:
        """One model call and its tool batch. Returns an Outcome when the run ends."""
        with turn_span(f"turn {turn}", {"hango.turn.index": turn}):
            tools = list(self.view) + self.chain.tools(state)
            self._tools = {t.name: t for t in tools}
            request = Request(
                model=self.agent.model,
                messages=list(state.messages),
                tools=[t.spec() for t in tools],
                max_tokens=self.agent.config.max_tokens,
                temperature=self.agent.config.temperature,
            )
            req = ModelRequest(request=request, state=state, on_text=self.on_text)
            resp = await self.chain.model_call(req, self._base_model_handler)
            self._usage.add(resp.usage)
            self._cost.add(resp.usage)
            state.messages.append(resp.message)
            self._events.append(Event("model_message", self._message_event(turn, resp)))
            uses = resp.message.tool_uses()
            if not uses:
                return self._final_outcome(resp)
            await self._checkpoint(state, None)
            await self._tool_batch(state, uses, resp.stop_reason)
            return None

    def _message_event(self, turn: int, resp: ModelResponse) -> dict[str, Any]:
        return {
            "turn": turn,
            "message": resp.message.to_dict(),
            "stop_reason": str(resp.stop_reason),
            "usage": resp.usage.to_dict(),
        }

    @staticmethod
    def _final_outcome(resp: ModelResponse) -> Outcome | None:
        if resp.stop_reason == StopReason.PAUSE_TURN:
            return None  # the API paused a long turn: send the history back to continue it
        if resp.stop_reason == StopReason.MAX_TOKENS:
            msg = (
                "the model hit max_tokens before finishing its answer; raise the agent's max_tokens"
            )
            return Outcome("failed", {"type": ErrorType.MAX_TOKENS, "message": msg})
        if resp.stop_reason in (StopReason.REFUSAL, StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED):
            return Outcome(
                "failed",
                {
                    "type": str(resp.stop_reason),
                    "message": "the model stopped: " + str(resp.stop_reason),
                },
            )
        return Outcome("succeeded")

    async def _tool_batch(self, state: State, uses: list[ToolUseBlock], stop: StopReason) -> None:
        results = []
        seen: set[str] = set()
        for call in uses:
            result = _duplicate_id(call) if call.id in seen else self._not_executed(call, stop)
            if result is None:
                result = await self._one_tool(state, call)
            seen.add(call.id)
            await self.io.record_tool_result(state, call, result, self._tool_event(call, result))
            results.append(result.to_block(call.id))
        state.messages.append(Message("user", list(results)))
        state.scratch.clear()

    def _not_executed(self, call: ToolUseBlock, stop: StopReason) -> ToolResult | None:
        """The error result for a call that must not run (None: run it)."""
        if stop == StopReason.MAX_TOKENS or (not call.complete and call.input_error is None):
            return ToolResult.error(
                "not executed: the response was cut off by max_tokens before this call's "
                "arguments were complete; send the call again"
            )
        if call.input_error is not None:
            return ToolResult.error(
                f"not executed: {call.input_error}; send the call again with its arguments "
                "as a JSON object",
                "invalid_arguments",
            )
        if self.io.cancel_event.is_set():
            return ToolResult.error(
                "not executed: the run was cancelled before this call started", "cancelled"
            )
        return None

    @staticmethod
    def _tool_event(call: ToolUseBlock, result: ToolResult) -> Event:
        return Event(
            "tool_result",
            {"tool_use_id": call.id, "name": call.name, "input": call.input, **result.to_dict()},
        )

    async def _one_tool(self, state: State, call: ToolUseBlock) -> ToolResult:
        ctx = ToolContext(run_id=state.run_id, tenant_id=state.tenant_id, tool_use_id=call.id)
        tool = self._tools.get(call.name)
        with genai.tool_span(call, tool, self.settings.capture_content) as span:
            result = await self._tool_or_cancel(
                self.chain.tool_call(
                    ToolCallRequest(call, state, ctx, tool), self._base_tool_handler
                )
            )
            if result.outcome in ("timeout", "cancelled"):
                limit = tool.limit_s if tool is not None else 0.0
                event = "tool.timeout" if result.outcome == "timeout" else "tool.cancelled"
                span.add_event(event, {"hango.tool.timeout_s": limit})
            record_sanitized("tool_result", result.sanitized, span)
            genai.end_tool_span(
                span,
                call.name if call.name in self._tools else "_unknown",
                result,
                self.settings.capture_content,
            )
        return result

    async def _tool_or_cancel(self, call: Awaitable[ToolResult]) -> ToolResult:
        """Run one tool call (through the chain), but stop it as soon as the run is
        cancelled: the call is then answered as interrupted, its outcome unknown."""
        try:
            return await until_cancelled(call, self.io.cancel_event)
        except RunCancelled:
            return ToolResult.error(
                "interrupted: the run was cancelled while this tool was running; "
                "its outcome is unknown",
                "cancelled",
            )

    # -- the two base handlers -----------------------------------------------------------

    async def _base_model(self, req: ModelRequest) -> ModelResponse:
        system, layout = self.chain.assemble_system(self._agent_blocks, req.state)
        for rewrite in req.system_rewrites:
            system = rewrite(system)
        request = req.request
        request = Request(
            model=request.model,
            messages=request.messages,
            system=system,
            tools=request.tools,
            max_tokens=request.max_tokens,
            tool_choice=request.tool_choice,
            temperature=request.temperature,
            thinking=request.thinking,
        )
        for final in req.final_rewrites:
            request = final(request, layout)
        return await self._model.call(request, req.on_text)

    async def _base_tool(self, req: ToolCallRequest) -> ToolResult:
        tool = self._tools.get(req.call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return ToolResult.error(f"unknown tool '{req.call.name}' (available: {known})")
        return await tool.invoke(req.call.input, req.context)

    # -- resume ----------------------------------------------------------------------------

    async def _resume_pending(self, state: State, info: RunInfo) -> None:
        """Answer the tool calls of an interrupted batch: recorded results (of this
        very turn: `info.recorded` holds only the pending assistant message's) are
        reused, idempotent tools re-run unless a cancel is pending, the rest left for
        RepairToolCalls. A repeated id in the batch gets the duplicate error again."""
        if not state.messages or state.messages[-1].role != "assistant":
            return
        uses = state.messages[-1].tool_uses()
        if not uses:
            return
        self._tools = {t.name: t for t in [*self.view, *self.chain.tools(state)]}
        cancelling = self.io.stop_requested() == "cancel"
        blocks = []
        seen: set[str] = set()
        for call in uses:
            duplicate = call.id in seen
            seen.add(call.id)
            if duplicate:
                blocks.append(_duplicate_id(call).to_block(call.id))
                continue
            if call.id in info.recorded:
                blocks.append(info.recorded[call.id].to_block(call.id))
                continue
            tool = self._tools.get(call.name)
            if tool is not None and tool.idempotent and not cancelling:
                with turn_span("resume tool batch", {"hango.turn.index": info.turns_done}):
                    result = await self._one_tool(state, call)
                await self.io.record_tool_result(
                    state, call, result, self._tool_event(call, result)
                )
                blocks.append(result.to_block(call.id))
        if blocks:
            state.messages.append(Message("user", list(blocks)))


def _duplicate_id(call: ToolUseBlock) -> ToolResult:
    return ToolResult.error(
        f"not executed: tool_use id {call.id!r} appears more than once in this response; "
        "every tool call needs its own id"
    )
