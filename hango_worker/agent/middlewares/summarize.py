"""Summarization: the compaction ladder, as a view of history (docs/design.md §12).

Before each model call the next request's size is estimated (agent/context.py).
Past `compact_trigger` x the window, rungs are applied in order until the estimate
is under `compact_target` x the window, each recorded as `middleware.request_rewritten`
with reason `compaction:<rung>` and `hango_compactions_total{rung}`:

(a) `clear_tool_results` — tool results older than the newest `keep_tool_results`
    become one-line notes (agent/compaction.py);
(b) `sliding_window` — the oldest turns before those results are dropped, whole;
(c) `summary` — one model call (through `ModelRequest.call_model`: retried, traced,
    cancelled and counted like any model call) summarises everything dropped, and the
    newest turns may then be dropped too, down to the newest one.

Only a copy of the request is rewritten; the boundaries and the summary live in the
private state, so resumes and the prompt cache see the same bytes until the next
compaction. `hango_context_tokens` gets each request's reported size / window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import BaseModel, Field, model_validator

from hango_worker.agent import compaction as cp
from hango_worker.agent.context import (
    context_window,
    message_chars,
    messages_chars,
    request_tokens,
    system_chars,
    tools_chars,
)
from hango_worker.agent.middleware import (
    ModelHandler,
    ModelRequest,
    ModelResponse,
    StackContext,
    SystemRewrite,
)
from hango_worker.agent.state import load_private, store_private
from hango_worker.provider.types import Message, ModelError, Request, StopReason, TextBlock, Usage
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.vocab import ErrorType

SUMMARY_MAX_TOKENS = 2048
SUMMARY_INPUT_FRACTION = 0.5  # of the summary model's window, for the transcript
NOTE_CHARS = 160  # about what the head note adds when turns are dropped


class SummarizeConfig(BaseModel):
    """The agent's compaction settings (`agents.config`, a section of AgentConfig);
    unset: the model's window, 0.8, 0.5, 5, the agent's model."""

    context_window: int | None = Field(default=None, ge=1024, le=10_000_000)
    compact_trigger: float | None = Field(default=None, gt=0, le=1)
    compact_target: float | None = Field(default=None, gt=0, lt=1)
    keep_tool_results: int | None = Field(default=None, ge=1, le=10_000)
    summary_model: str | None = Field(default=None, min_length=1, max_length=200)

    @model_validator(mode="after")
    def _target_below_trigger(self) -> SummarizeConfig:
        trigger = cp.DEFAULT_TRIGGER if self.compact_trigger is None else self.compact_trigger
        target = cp.DEFAULT_TARGET if self.compact_target is None else self.compact_target
        if target >= trigger:
            raise ValueError(f"compact_target ({target}) must be below compact_trigger ({trigger})")
        return self

    def compaction(self) -> cp.CompactionConfig:
        """These settings, each unset one at its default."""
        return cp.CompactionConfig(
            context_window=self.context_window,
            compact_trigger=self.compact_trigger or cp.DEFAULT_TRIGGER,
            compact_target=self.compact_target or cp.DEFAULT_TARGET,
            keep_tool_results=self.keep_tool_results or cp.DEFAULT_KEEP_TOOL_RESULTS,
            summary_model=self.summary_model,
        )


@dataclass(slots=True)
class _View:
    """The view of the last call, extended in place while the state is unchanged."""

    run_id: str = ""
    key: tuple[object, ...] = ()
    first: Message | None = None
    upto: int = 0
    messages: list[Message] = field(default_factory=list)


@dataclass(slots=True)
class _Plan:
    """One compaction in progress: the state being moved, the estimate as it goes."""

    st: cp.CompactionState
    msgs: Sequence[Message]
    tokens: int
    goal: int  # compact_target x window


class Summarization:
    name = "summarization"

    def __init__(self, cfg: cp.CompactionConfig | None = None) -> None:
        self.cfg = cfg or cp.CompactionConfig()
        if not 0 < self.cfg.compact_target < self.cfg.compact_trigger <= 1:
            raise ValueError("compaction needs 0 < compact_target < compact_trigger <= 1")
        if self.cfg.keep_tool_results < 1:
            raise ValueError("keep_tool_results must be at least 1")
        self._view = _View()
        self._system_chars = 0  # of the last request (estimates with no usage to build on)
        self._tools: tuple[tuple[str, ...], int] = ((), 0)  # tool names → their size

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        st, _ = load_private(req.state, self.name, cp.CompactionState)
        msgs = req.request.messages
        if not st.fits(msgs):  # not this history's boundaries: start afresh
            st = cp.CompactionState()
        window = context_window(req.request.model, self.cfg.context_window)
        tokens, added = st.estimate.next_tokens(
            msgs, lambda: self._fixed(req.request) + messages_chars(cp.view(msgs, st))
        )
        if tokens > self.cfg.compact_trigger * window:
            plan = _Plan(st, msgs, tokens, int(self.cfg.compact_target * window))
            await self._compact(req, plan)
            tokens, added = plan.tokens, None
            st.estimate.forget()
            store_private(req.state, self.name, st)
        resp = await next(self._viewed(req, msgs, st, window))
        if resp.stop_reason == StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED:
            resp = await self._make_room(req, next, msgs, st, max(tokens, window), resp)
            tokens, added = window, None
        reported = request_tokens(resp.usage) or tokens  # a provider without usage: ours
        metrics.CONTEXT_TOKENS.observe(reported / window)
        st.estimate.observe(len(msgs), reported, added)
        store_private(req.state, self.name, st)
        return resp

    def _viewed(
        self, req: ModelRequest, msgs: list[Message], st: cp.CompactionState, window: int
    ) -> ModelRequest:
        req = req.with_request(messages=self._view_of(req.state.run_id, msgs, st))
        return req.rewrite_system(self._fits_check(req.request, st, window))

    async def _make_room(
        self,
        req: ModelRequest,
        next: ModelHandler,
        msgs: list[Message],
        st: cp.CompactionState,
        tokens: int,
        cut: ModelResponse,
    ) -> ModelResponse:
        """The API stopped the answer at the context window (model_context_window_exceeded):
        compact down to the target now and ask once more. The cut answer is dropped; its
        usage is added to the new answer's (`hango_model_stops_total`, then=compacted)."""
        window = context_window(req.request.model, self.cfg.context_window)
        plan = _Plan(st, msgs, tokens, int(self.cfg.compact_target * window))
        await self._compact(req, plan)
        st.estimate.forget()
        store_private(req.state, self.name, st)
        metrics.child(
            metrics.MODEL_STOPS, StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED, "compacted"
        ).inc()
        resp = await next(self._viewed(req, msgs, st, window))
        resp.usage = dropped_plus(cut.usage, resp.usage)
        return resp

    # -- the ladder ----------------------------------------------------------------------

    async def _compact(self, req: ModelRequest, p: _Plan) -> None:
        """Apply rungs until the estimate is under the goal (or none is left)."""
        msgs, st = p.msgs, p.st
        keep = cp.keep_from(msgs, st.dropped_upto, self.cfg.keep_tool_results)
        saved = cp.clear_saving(msgs, st, keep) if keep > st.clear_before else 0
        if saved > 0:
            st.clear_before = keep
            self._applied("clear_tool_results", p, p.tokens - st.estimate.tokens(saved))
            if p.tokens <= p.goal:
                return
        if self._drop(p, min(cp.last_cut(msgs), keep - 1)) and p.tokens <= p.goal:
            return
        await self._summarise(req, p)

    def _drop(self, p: _Plan, hi: int, extra_chars: int = 0) -> bool:
        """Move the cut (≤ hi) as far as the goal needs, the head gaining about
        `extra_chars` (a summary); True when it moved."""
        st, est = p.st, p.st.estimate
        before_note = len(cp.head_note(st) or "")
        cut = cp.plan_cut(p.msgs, st, hi, p.tokens - p.goal, extra_chars + NOTE_CHARS)
        if cut <= st.dropped_upto:
            return False
        removed = cp.dropped_chars(p.msgs, st, cut)
        st.dropped_upto = cut
        st.clear_before = max(st.clear_before, cut)
        note = len(cp.head_note(st) or "") - before_note
        after = p.tokens - est.tokens(removed) + est.tokens(max(0, note))
        if extra_chars == 0:
            self._applied("sliding_window", p, after)
        else:
            p.tokens = after
        return True

    async def _summarise(self, req: ModelRequest, p: _Plan) -> None:
        """One model call: the previous summary plus everything dropped since, after
        the cut is moved as far as the goal needs (the newest turn always stays)."""
        st, msgs = p.st, p.msgs
        if req.call_model is None:
            return
        start = p.tokens
        summary_chars = int(SUMMARY_MAX_TOKENS * st.estimate.chars_per_token)
        if not self._drop(p, cp.last_cut(msgs), extra_chars=summary_chars):
            return
        unsummarised_note = len(cp.head_note(st) or "")
        model = self.cfg.summary_model or req.request.model
        window = context_window(
            model, self.cfg.context_window if model == req.request.model else None
        )
        budget = int(window * SUMMARY_INPUT_FRACTION * st.estimate.chars_per_token)
        prompt = cp.summary_prompt(st.summary, msgs[st.summary_upto : st.dropped_upto], budget)
        resp = await req.call_model(
            Request(
                model=model,
                messages=[Message("user", [TextBlock(prompt)])],
                system=[TextBlock(cp.SUMMARY_SYSTEM)],
                max_tokens=SUMMARY_MAX_TOKENS,
            )
        )
        st.summary = resp.message.text().strip() or "(the summariser returned nothing)"
        st.summary_upto = st.dropped_upto
        st.summary_calls += 1
        added = len(cp.head_note(st) or "") - unsummarised_note
        after = p.tokens + st.estimate.tokens(added)
        p.tokens = start
        self._applied("summary", p, after)

    def _applied(self, rung: str, p: _Plan, after: int) -> None:
        middleware_event(
            "middleware.request_rewritten",
            self.name,
            f"compaction:{rung}",
            **{"hango.context.tokens_before": p.tokens, "hango.context.tokens_after": after},
        )
        metrics.COMPACTIONS.labels(rung).inc()
        p.tokens = after

    # -- the view and the size check -----------------------------------------------------

    def _view_of(
        self, run_id: str, msgs: Sequence[Message], st: cp.CompactionState
    ) -> list[Message]:
        """`cp.view(msgs, st)`, extended from the last call's when nothing moved."""
        v = self._view
        first = msgs[0] if msgs else None
        if v.run_id != run_id or v.key != st.key() or v.upto > len(msgs) or v.first is not first:
            v.run_id, v.key, v.first = run_id, st.key(), first
            v.messages, v.upto = cp.view(msgs, st), len(msgs)
            return list(v.messages)
        start = max(v.upto, st.dropped_upto)
        v.messages.extend(cp.shown(msgs, i, st) for i in range(start, len(msgs)))
        v.upto = len(msgs)
        return list(v.messages)

    def _tools_chars(self, request: Request) -> int:
        key = tuple(t.name for t in request.tools)
        if self._tools[0] != key:
            self._tools = (key, tools_chars(request.tools))
        return self._tools[1]

    def _fixed(self, request: Request) -> int:
        """System prompt + tools in characters (the system as measured last call)."""
        return self._system_chars + self._tools_chars(request)

    def _fits_check(self, request: Request, st: cp.CompactionState, window: int) -> SystemRewrite:
        """Measures the assembled system prompt (for estimates with no usage yet) and
        fails the run, before the call, when even the system prompt, the tools and the
        first message cannot fit the window: no compaction could ever help."""
        tools = self._tools_chars(request)
        first = message_chars(request.messages[0]) if request.messages else 0
        setting = (
            f"the agent's context_window ({window} tokens)"
            if self.cfg.context_window is not None
            else f"the context window of {request.model} ({window} tokens; "
            "set the agent's context_window to change it)"
        )

        def check(system: list[TextBlock]) -> list[TextBlock]:
            self._system_chars = system_chars(system)
            need = st.estimate.tokens(self._system_chars + tools + first)
            if need > window:
                raise ModelError(
                    ErrorType.CONTEXT_WINDOW_TOO_SMALL,
                    f"{setting} is smaller than the system prompt, tools and first message "
                    f"(about {need} tokens): no compaction can make the request fit",
                    retryable=False,
                )
            return system

        return check


def dropped_plus(dropped: Usage, kept: Usage) -> Usage:
    """`kept` with a dropped response's counts added (its tier, speed and geography
    stay the kept response's: both calls are priced as it)."""
    total = Usage.from_dict(dropped.to_dict())
    total.service_tiers = None
    total.add(kept)
    for key in ("service_tier", "speed", "inference_geo", "extra"):
        setattr(total, key, getattr(kept, key))
    total.service_tiers = None
    return total


def build(ctx: StackContext) -> Summarization:
    return Summarization(ctx.settings(SummarizeConfig).compaction())
