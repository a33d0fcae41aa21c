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

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Link, SpanKind

from hango_worker.agent import stops
from hango_worker.agent.batch import ToolBatches, Waiting
from hango_worker.agent.calls import ModelCaller, RunCancelled, RunReleased
from hango_worker.agent.chain import Chain
from hango_worker.agent.control import RunFailed
from hango_worker.agent.cost import RunCost
from hango_worker.agent.limits import (
    Budget,
    Limits,
    NextCall,
    OnLimit,
    Reached,
    ToolCounts,
    ask_for_answer,
)
from hango_worker.agent.middleware import Answer, ModelRequest, ModelResponse, ToolCallRequest
from hango_worker.agent.ports import Event, Outcome, RunIO
from hango_worker.agent.spec import AgentSpec
from hango_worker.agent.state import State, StateError, dump_state
from hango_worker.provider.fingerprint import Fingerprints, fingerprint
from hango_worker.provider.prices import PriceTable
from hango_worker.provider.types import (
    FileIds,
    Message,
    ModelError,
    Provider,
    Request,
    StopReason,
    TextSink,
    Usage,
    compact_json,
    evolve,
)
from hango_worker.telemetry import genai
from hango_worker.telemetry.tracing import mark_error, tracer, turn_span
from hango_worker.tool.mcp_client import McpTools
from hango_worker.tool.registry import View
from hango_worker.tool.types import Tool, ToolResult
from hango_worker.vocab import ErrorType


@dataclass(slots=True)
class LoopSettings:
    """What the run may do (limits) and how it is observed; what may stop it and the
    bounds of its calls are its RunControl (agent/control.py, `RunIO.control`)."""

    max_turns: int = 50
    provider_name: str = "anthropic"
    capture_content: bool = False
    on_limit: OnLimit = "answer"
    budget: Budget = field(default_factory=Budget)
    deadline: float | None = None  # epoch seconds (agent/limits.py:deadline_of)
    prices: PriceTable = field(default_factory=PriceTable)
    # `files_api: true`: where the Files API ids of stored blocks are kept (Request.files)
    files: FileIds | None = None


@dataclass(slots=True)
class RunInfo:
    """Who is running what, for spans and tool contexts."""

    attempt: int = 1
    turns_done: int = 0  # model turns this run completed in earlier attempts
    persisted: int | None = None  # messages already in the store (None: all of them)
    parent: Any = None  # OpenTelemetry context to start the attempt's span in
    # results recorded for the calls of the pending (last, unanswered) assistant message
    recorded: dict[str, ToolResult] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)  # used by this run's earlier attempts
    cost_before: float | None = 0.0  # what they cost (None: unknown)
    unpriced_before: str | None = None  # cost None: the units that had no price
    # calls of the pending batch a wait left unstarted (runs.waiting_for): run them now
    not_started: frozenset[str] = frozenset()
    span_attributes: dict[str, Any] = field(default_factory=dict)
    links: Sequence[Link] = ()


class AgentLoop(ToolBatches):
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
        self.control = io.control
        self.settings = settings or LoopSettings()
        self.on_text = on_text
        self._agent_blocks = agent.system_blocks()
        self._api_params = agent.config.api_params() or None  # once per run, not per call
        self._events: list[Event] = []
        self.mcp: McpTools | None = None  # the attempt's MCP tools (agent/assemble.py)
        self._tools: dict[str, Tool] = {}
        self._usage = Usage()
        self._cost = RunCost(self.settings.prices, agent.model)
        self._watermark = 0
        st = self.settings
        self._model = ModelCaller(provider, io.control, st.provider_name, st.capture_content)
        self._limits = Limits(st.max_turns, st.on_limit, st.budget, st.deadline)
        self._next = NextCall(max_tokens=agent.config.max_tokens)
        self._counts: ToolCounts | None = None
        self._to_mark: set[str] = set()
        self._record_lock = asyncio.Lock()
        self._used_ids, self._used_from = None, None
        self._done = 0  # model turns completed by this run (all attempts)
        self._states: list[tuple[int, str]] = []  # (turn, state at its end, as JSON)
        self._last_state: str | None = None
        # the fingerprint of the request the turn's response answers (provider/fingerprint.py)
        self._fingerprints = Fingerprints()
        self._sent: dict[str, Any] | None = None
        # bound once, so the chain composes its onion once per run, not per call
        self._side_call_handler = self._side_call
        self._base_model_handler = self._base_model
        self._base_tool_handler = self._base_tool

    # -- the run ---------------------------------------------------------------------------

    async def run(self, state: State, info: RunInfo | None = None) -> Outcome:
        info = info or RunInfo()
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
            if outcome.limit is not None:
                span.set_attribute("hango.run.limit", outcome.limit)
            if outcome.cost_usd is not None:
                span.set_attribute("hango.run.cost_usd", outcome.cost_usd)
            elif outcome.unpriced:
                span.set_attribute("hango.run.cost_unpriced", outcome.unpriced)
            return outcome

    async def _run(self, state: State, info: RunInfo) -> Outcome:
        persisted = len(state.messages) if info.persisted is None else info.persisted
        self._done = info.turns_done
        # as loaded: kept already, or the run's start (not worth a row)
        self._last_state = compact_json(dump_state(state))
        self._usage.add(info.usage)
        self._cost.carry(info.cost_before, info.unpriced_before)
        self._next.spent_usd = self._cost.usd
        last = state.messages[persisted - 1] if persisted else None
        # what is stored already: a run that ends (waits, fails) before its first turn
        # writes only what came after it, never the history again
        self._watermark = persisted
        try:
            await self._resume_pending(state, info.recorded, info.not_started, info.turns_done)
            await self.chain.before_run(state)
            self._load_counts(state)
        except Waiting as w:
            return await self._finish(state, Outcome("waiting", waiting=w.record))
        except StateError as e:
            return await self._finish(
                state, Outcome("failed", {"type": ErrorType.INVALID_STATE, "message": str(e)})
            )
        self._watermark = self._find_watermark(state, last)
        self._events.append(Event("run_started", {"attempt": info.attempt}))
        if self.mcp is not None:  # what each MCP server listed, and whether it changed
            self._events.append(Event("mcp_tools", self.mcp.record(state.private)))
        turn = info.turns_done
        while True:
            stop = self.control.stop_requested()
            if stop is not None:
                return await self._finish(
                    state, Outcome("cancelled" if stop == "cancel" else "released")
                )
            reached = self._limits.reached(turn, self._usage, self._next, self._counts, time.time())
            if reached is not None and (self._limits.on_limit == "fail" or not reached.room):
                genai.record_limit(reached.limit, "fail")
                return await self._finish(
                    state, Outcome("failed", reached.error(), limit=reached.limit)
                )
            turn += 1
            try:
                done = await (
                    self._wind_up(state, turn, reached) if reached else self._turn(state, turn)
                )
            except RunCancelled:
                return await self._finish(state, Outcome("cancelled"))
            except RunReleased:  # a shutdown during a wait before a model call
                return await self._finish(state, Outcome("released"))
            except RunFailed as e:  # a gate before a model call (a spent budget)
                return await self._finish(state, Outcome("failed", e.error))
            except Waiting as w:
                return await self._finish(state, Outcome("waiting", waiting=w.record))
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
        self._so_far(outcome)
        if outcome.waiting is not None:
            self._events.append(Event("run_waiting", outcome.waiting))
        else:
            self._events.append(
                Event("run_finished", {"status": outcome.status, "error": outcome.error})
            )
        self._keep_state(state)
        await self._checkpoint(state, outcome)
        return outcome

    async def _checkpoint(self, state: State, outcome: Outcome | None) -> None:
        new = state.messages[self._watermark :]
        events, self._events = self._events, []
        usage = self._so_far(Outcome("released")).usage_dict()  # the run's record so far
        states, self._states = self._states, []
        await self.io.checkpoint(state, new, events, outcome, usage, states)
        self._watermark = len(state.messages)

    def _so_far(self, outcome: Outcome) -> Outcome:
        """`outcome` with the run's usage, cost and rate-limit wait so far."""
        outcome.usage, outcome.cost_usd = self._usage, self._cost.usd
        outcome.unpriced = self._cost.unpriced
        outcome.rate_wait_s = self.control.rate_wait()
        return outcome

    def _keep_state(self, state: State) -> None:
        """The state at the end of turn `self._done`, kept (run_states, for forks) with
        the next checkpoint when it differs from the one kept before."""
        now = compact_json(dump_state(state))
        if now != self._last_state:
            self._states.append((self._done, now))
            self._last_state = now

    # -- one turn --------------------------------------------------------------------------

    async def _turn(self, state: State, turn: int) -> Outcome | None:
        """One model call and its tool batch. Returns an Outcome when the run ends."""
        with turn_span(f"turn {turn}", {"hango.turn.index": turn}):
            self._keep_state(state)  # the previous turn's end, kept with this checkpoint
            resp = await self._model_turn(state, turn)
            if self.chain.answer_checks:  # an output_schema (agent/middlewares/output.py)
                answer = self.chain.check_answer(state, resp, False)
                if answer is not None:
                    return self._answered(state, answer)
            uses = resp.message.tool_uses()
            if not uses or resp.stop_reason in stops.ENDS_RUN:
                return self._final_outcome(resp)
            await self._checkpoint(state, None)
            await self._tool_batch(state, uses, resp.stop_reason)
            return None

    async def _model_turn(
        self, state: State, turn: int, tool_choice: dict[str, Any] | None = None
    ) -> ModelResponse:
        """The model call of a turn, through the chain; its message joins the history."""
        tools = list(self.view) + self.chain.tools(state)
        self._tools = {t.name: t for t in tools}
        request = Request(
            model=self.agent.model,
            messages=list(state.messages),
            tools=[t.spec() for t in tools],
            max_tokens=self.agent.config.max_tokens,
            tool_choice=tool_choice,
            temperature=self.agent.config.temperature,
            params=self._api_params,
            server_tools=self.agent.config.server_tools,
            files=self.settings.files,
        )
        req = ModelRequest(
            request=request, state=state, on_text=self.on_text, call_model=self._side_call_handler
        )
        self._sent = None
        resp = await self.chain.model_call(req, self._base_model_handler)
        if stops.cut_tool_call(resp):  # cut off in a tool call: once more, with more room
            cap, used = self._limits.budget.max_output_tokens, self._usage.output_tokens
            room = None if cap is None else cap - used - resp.usage.output_tokens
            resp = await stops.retry_cut_tool_call(req, resp, self._chain_call, self._count, room)
        self._usage.add(resp.usage)
        self._next.cost_usd = self._cost.add(resp.usage)
        self._next.spent_usd = self._cost.usd
        self._done += 1
        u = resp.usage
        self._next.input_tokens = (
            u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
        )
        state.messages.append(resp.message)
        self._events.append(Event("model_message", self._message_event(turn, resp)))
        return resp

    async def _wind_up(self, state: State, turn: int, reached: Reached) -> Outcome:
        """A limit was reached: one last model call, tools not allowed, for the final
        answer (agent/limits.py). The run ends with the limit recorded."""
        genai.record_limit(reached.limit, "answer")
        self._events.append(Event("limit_reached", {"limit": reached.limit, "turn": turn}))
        ask_for_answer(state.messages, self._watermark, reached)
        with turn_span(
            f"turn {turn}", {"hango.turn.index": turn, "hango.run.limit": reached.limit}
        ) as span:
            span.add_event("agent.limit_reached", {"hango.run.limit": reached.limit})
            resp = await self._model_turn(state, turn, {"type": "none"})
            answer = self.chain.check_answer(state, resp, True)
        if answer is not None:
            done = self._answered(state, answer) or Outcome("failed", reached.error())
            done.limit = reached.limit
            return done
        if resp.message.tool_uses():  # a model that ignored tool_choice: none
            error = reached.error()
            error["message"] += "; the wind-up answer called tools instead of answering"
            return Outcome("failed", error, limit=reached.limit)
        outcome = self._final_outcome(resp) or Outcome("succeeded")
        outcome.limit = reached.limit
        return outcome

    def _message_event(self, turn: int, resp: ModelResponse) -> dict[str, Any]:
        event = {
            "turn": turn,
            "message": resp.message.to_dict(),
            "stop_reason": str(resp.stop_reason),
            "usage": resp.usage.to_dict(),
        }
        if self._sent is not None:  # what was sent for it (hango-worker replay compares)
            event["request"] = self._sent
        return event

    @staticmethod
    def _answered(state: State, answer: Answer) -> Outcome | None:
        """An answer check's verdict (agent/middleware.py:Answer): None, another turn."""
        if answer.reply is not None:
            state.messages.append(answer.reply)
        if answer.error is not None:
            return Outcome("failed", answer.error)
        if not answer.accepted:
            return None
        return Outcome("succeeded", output=answer.output, has_output=True)

    @staticmethod
    def _final_outcome(resp: ModelResponse) -> Outcome | None:
        """How a response without tool calls to run ends the run (agent/stops.py);
        None: a paused turn, continued by sending it back."""
        error = stops.final_error(resp)
        if error is not None:
            return Outcome("failed", error)
        return None if resp.stop_reason == StopReason.PAUSE_TURN else Outcome("succeeded")

    def _chain_call(self, req: ModelRequest) -> Awaitable[ModelResponse]:
        return self.chain.model_call(req, self._base_model_handler)

    def _count(self, usage: Usage, model: str | None = None) -> None:
        """The usage of a side call, or of a response a retry replaced."""
        self._usage.add(usage)
        self._cost.add(usage, model)

    # -- the two base handlers -----------------------------------------------------------

    async def _base_model(self, req: ModelRequest) -> ModelResponse:
        system, layout = self.chain.assemble_system(self._agent_blocks, req.state)
        for rewrite in req.system_rewrites:
            system = rewrite(system)
        request = evolve(req.request, system=system)  # every other field as it is
        for final in req.final_rewrites:
            request = final(request, layout)
        self._sent = fingerprint(request, self._fingerprints)
        return await self._model.call(request, req.on_text)

    async def _side_call(self, request: Request) -> ModelResponse:
        """A middleware's own model call (ModelRequest.call_model): the run's retries,
        cancel and `chat` span; its usage is the run's."""
        resp = await self._model.call(request, None)
        self._count(resp.usage, request.model)  # at its own model's prices
        return resp

    async def _base_tool(self, req: ToolCallRequest) -> ToolResult:
        tool = self._tools.get(req.call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            return ToolResult.error(f"unknown tool '{req.call.name}' (available: {known})")
        if req.call.id in self._to_mark:  # resumed after a wait: never run it twice
            self._to_mark.discard(req.call.id)
            await self.io.mark_started(req.call.id)
        return await tool.invoke(req.call.input, req.context)
