"""A turn's tool calls: the batch after a model answer, and the pending batch that a
resumed attempt finishes. Part of the loop (AgentLoop inherits it); kept apart so
`agent/loop.py` stays the turn's control flow.

Each call goes through `Chain.tool_call` and its result is recorded as soon as it
completes (docs/design.md §5.4). Consecutive calls run side by side, at most
`max_parallel_tools` at once; a call of a `sequential` tool, or one a middleware
needs in order (an approval), runs alone, after the calls before it and before the
calls after it. The model gets the results in call order (docs/design.md §5.5).

A call a middleware suspends (`SuspendRun`, e.g. an approval) ends the attempt: the
calls of the batch not started yet are kept in the waiting record, and the attempt
that resumes the run starts exactly those —
each marked started (`RunIO.mark_started`) by the base tool handler, right before
the tool itself runs, so a crash while one runs makes it "interrupted", never
executed twice, and a crash before it started leaves it to the next attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from hango_worker.agent.calls import RunCancelled, until_cancelled
from hango_worker.agent.chain import Chain
from hango_worker.agent.control import RunControl
from hango_worker.agent.limits import Limits, ToolCounts
from hango_worker.agent.middleware import AwaitChild, SuspendRun, ToolCallRequest, ToolHandler
from hango_worker.agent.ports import Event, RunIO
from hango_worker.agent.state import State, load_private, store_private
from hango_worker.provider.sanitize import record_sanitized
from hango_worker.provider.types import Message, StopReason, ToolUseBlock
from hango_worker.telemetry import genai, metrics
from hango_worker.telemetry.tracing import current_turn_span, turn_span
from hango_worker.tool.registry import View
from hango_worker.tool.types import STOP_GRACE_S, Tool, ToolContext, ToolResult


class Waiting(Exception):
    """The batch stopped at a call that waits for a person; `record` is what the run
    waits for (`runs.waiting_for`)."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record.get("reason"))
        self.record = record


@dataclass(slots=True)
class _Batch:
    """One batch's calls on their way to answers: results by position (the model gets
    them in call order), the group of calls waiting to run side by side, the `task`
    calls whose children still run, and the calls a middleware suspended."""

    uses: list[ToolUseBlock]
    resume_turn: int | None = None  # a resumed batch: groups run under a span of their own
    results: dict[int, ToolResult] = field(default_factory=dict)
    group: list[int] = field(default_factory=list)
    children: list[int] = field(default_factory=list)
    suspended: list[tuple[int, SuspendRun]] = field(default_factory=list)
    # ids a wait must not list as not started: answered, waiting on a child, left alone
    handled: set[str] = field(default_factory=set)

    def answer(self, i: int, result: ToolResult, answered: bool = True) -> None:
        self.results[i] = result
        if answered:
            self.handled.add(self.uses[i].id)

    def blocks(self) -> list[Any]:
        return [self.results[i].to_block(self.uses[i].id) for i in sorted(self.results)]

    def children_ids(self) -> list[str]:
        return [self.uses[i].id for i in sorted(self.children)]


class ToolBatches:
    chain: Chain
    io: RunIO
    control: RunControl
    view: View
    settings: Any  # LoopSettings
    _tools: dict[str, Tool]
    _limits: Limits
    _counts: ToolCounts | None
    _base_tool_handler: ToolHandler
    _to_mark: set[str]  # calls to mark started just before their tool runs
    _record_lock: asyncio.Lock  # one result recorded at a time (each its own commit)
    _used_ids: set[str] | None  # tool_use ids of the history's earlier turns (built once)
    _used_from: object  # the history's first message when the set was built

    def _reused_ids(self, state: State, uses: list[ToolUseBlock]) -> set[str]:
        """The ids of `uses` (the last message's calls) that an earlier assistant message
        of the history already used. The set is built once per attempt (again only after
        compaction cut the history's head), then grows by each turn's ids."""
        if self._used_ids is None or state.messages[0] is not self._used_from:
            self._used_from = state.messages[0]
            self._used_ids = {
                u.id for m in state.messages[:-1] if m.role == "assistant" for u in m.tool_uses()
            }
        reused = {u.id for u in uses if u.id in self._used_ids}
        self._used_ids.update(u.id for u in uses)
        for tool_use_id in sorted(reused):
            current_turn_span().add_event("tool.id_reused", {"hango.tool.use_id": tool_use_id})
        return reused

    async def _tool_batch(self, state: State, uses: list[ToolUseBlock], stop: StopReason) -> None:
        b = _Batch(uses)
        seen: set[str] = set()
        reused = self._reused_ids(state, uses)
        for i, call in enumerate(uses):
            # a repeated id waits too: the call that owns the id is recorded first
            alone = self._runs_alone(call) or call.id in seen
            if alone:  # the calls before it finish first
                await self._flush(state, b)
            if call.id in seen:
                result: ToolResult | None = _duplicate_id(call)
            elif call.id in reused:
                result = _reused_id(call)
            else:
                result = self._not_executed(call, stop)
            seen.add(call.id)
            await self._enqueue(state, b, i, alone, result)
        await self._last_group(state, b)
        state.messages.append(Message("user", b.blocks()))
        state.scratch.clear()

    async def _suspend(
        self,
        state: State,
        rest: Sequence[ToolUseBlock],
        seen: Collection[str],
        s: SuspendRun,
        children: Sequence[str] = (),
    ) -> NoReturn:
        """Stop the batch at `rest[0]`: answer now the later calls that could never run
        (bad arguments), and raise Waiting with the calls not started (in order; the
        `task` calls whose children still run come first)."""
        not_started = [*children, rest[0].id]
        ids = {*seen, rest[0].id}
        for call in rest[1:]:
            if call.id in ids:
                continue  # a repeated id: the resumed batch answers it again
            ids.add(call.id)
            refused = self._not_executed(call, StopReason.TOOL_USE)
            if refused is None:
                not_started.append(call.id)
            else:
                await self._record(state, call, refused)
        detail = dict(s.detail)
        record: dict[str, Any] = {"reason": s.reason, "not_started": not_started}
        for key in ("timeout_s", "on_timeout"):
            if key in detail:
                record[key] = detail.pop(key)
        record["call"] = detail
        raise Waiting(record)

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
        if self.control.cancel.is_set():
            return _cancelled_before()
        return None

    # -- running the calls: alone, or side by side -------------------------------------

    def _runs_alone(self, call: ToolUseBlock) -> bool:
        """A call of a `sequential` tool, or one a middleware needs in order (an
        approval), runs alone: after the calls before it, before the calls after it."""
        if self.control.max_parallel_tools <= 1:
            return True
        tool = self._tools.get(call.name)
        return (tool is not None and tool.sequential) or self.chain.runs_alone(call)

    async def _enqueue(
        self, state: State, b: _Batch, i: int, alone: bool, refused: ToolResult | None
    ) -> None:
        """Call `i`: refused (or over a tool limit), answered and recorded now; else it
        joins the group to run, which a call that runs alone flushes at once."""
        call = b.uses[i]
        refused = refused or self._over_limit(state, call)
        if refused is not None:
            await self._record(state, call, refused)
            b.answer(i, refused)
            return
        b.group.append(i)
        if alone:
            await self._flush(state, b)

    async def _last_group(self, state: State, b: _Batch) -> None:
        """Run the last group; a batch that started child runs then waits for them."""
        await self._flush(state, b)
        if b.children:
            metrics.RUNS_SUSPENDED.labels("children").inc()
            raise Waiting({"reason": "children", "not_started": b.children_ids()})

    async def _flush(self, state: State, b: _Batch) -> None:
        """Run the calls waiting in `b.group` and record each as it completes. A call a
        middleware suspended ends the batch there (`_suspend`), once the others of its
        group have finished; the first such call in call order is the one waited for."""
        group, b.group = b.group, []
        if not group:
            return
        if b.resume_turn is None:
            await self._run_group(state, b, group)
        else:
            with turn_span("resume tool batch", {"hango.turn.index": b.resume_turn}):
                await self._run_group(state, b, group)
        if b.suspended:
            i, s = min(b.suspended, key=lambda x: x[0])
            await self._suspend(state, b.uses[i:], b.handled, s, b.children_ids())

    async def _run_group(self, state: State, b: _Batch, group: list[int]) -> None:
        """One call: run it. Several: run them side by side, at most `max_parallel_tools`
        at once, each in its own task (its `execute_tool` span a sibling of the others')."""
        if len(group) == 1:
            await self._run_call(state, b, group[0], None)
            return
        limit = self.control.max_parallel_tools
        current_turn_span().add_event(
            "tool.parallel_group",
            {"hango.tool.parallel.calls": len(group), "hango.tool.parallel.limit": limit},
        )
        metrics.TOOL_PARALLEL_CALLS.observe(len(group))
        gate = asyncio.Semaphore(limit)
        tasks = [asyncio.ensure_future(self._run_call(state, b, i, gate)) for i in group]
        try:
            await asyncio.gather(*tasks)
        except BaseException:  # a failed record (fenced), or the attempt itself cancelled
            for t in tasks:
                t.cancel()
            # each call stops within its tool's grace (tool.types.stop_task); bounded all
            # the same, so a stopping worker is never held here
            await asyncio.wait(tasks, timeout=2 * STOP_GRACE_S)
            raise

    async def _run_call(
        self, state: State, b: _Batch, i: int, gate: asyncio.Semaphore | None
    ) -> None:
        call = b.uses[i]
        async with gate or contextlib.nullcontext():
            if gate is not None and self.control.cancel.is_set():
                result = _cancelled_before()  # cancelled while it waited for a free slot
            else:
                try:
                    result = await self._one_tool(state, call)
                except AwaitChild:
                    b.children.append(i)
                    b.handled.add(call.id)
                    return
                except SuspendRun as s:
                    b.suspended.append((i, s))
                    return
        await self._record(state, call, result)
        b.answer(i, result)

    async def _record(self, state: State, call: ToolUseBlock, result: ToolResult) -> None:
        async with self._record_lock:
            await self.io.record_tool_result(state, call, result, self._tool_event(call, result))

    def _load_counts(self, state: State) -> None:
        """Tool-call counts, kept (private state `limits`) only when a tool limit is set."""
        if self.settings.budget.counts_tools():
            self._counts = load_private(state, "limits", ToolCounts)[0]

    def _over_limit(self, state: State, call: ToolUseBlock) -> ToolResult | None:
        """Count the call against the run's tool limits; refuse it when one is used up.
        The counts are stored with the call's result (or refusal)."""
        if self._counts is None:
            return None
        why = self._limits.refuse_tool(call.name, self._counts)
        store_private(state, "limits", self._counts)
        if why is None:
            return None
        return ToolResult.error(f"not executed: {why}; give your final answer now", "denied")

    @staticmethod
    def _tool_event(call: ToolUseBlock, result: ToolResult) -> Event:
        return Event(
            "tool_result",
            {"tool_use_id": call.id, "name": call.name, "input": call.input, **result.to_dict()},
        )

    async def _one_tool(self, state: State, call: ToolUseBlock) -> ToolResult:
        ctx = ToolContext(run_id=state.run_id, tenant_id=state.tenant_id, tool_use_id=call.id)
        tool = self._tools.get(call.name)
        suspended: SuspendRun | None = None
        with genai.tool_span(call, tool, self.settings.capture_content) as span:
            try:
                result = await self._tool_or_cancel(
                    self.chain.tool_call(
                        ToolCallRequest(call, state, ctx, tool), self._base_tool_handler
                    )
                )
            except SuspendRun as s:  # not an error: the call waits for a person
                suspended = s
                event = "subagent.waiting" if isinstance(s, AwaitChild) else "hitl.suspended"
                span.add_event(event, {"hango.wait.reason": s.reason})
            else:
                self._end_tool_span(span, call, tool, result)
        if suspended is not None:
            raise suspended
        return result

    def _end_tool_span(
        self, span: Any, call: ToolUseBlock, tool: Tool | None, r: ToolResult
    ) -> None:
        if r.outcome in ("timeout", "cancelled"):
            limit = tool.limit_s if tool is not None else 0.0
            event = "tool.timeout" if r.outcome == "timeout" else "tool.cancelled"
            span.add_event(event, {"hango.tool.timeout_s": limit})
        record_sanitized("tool_result", r.sanitized, span)
        name = call.name if call.name in self._tools else "_unknown"
        genai.end_tool_span(span, name, r, self.settings.capture_content)

    async def _tool_or_cancel(self, call: Awaitable[ToolResult]) -> ToolResult:
        """Run one tool call (through the chain), but stop it as soon as the run is
        cancelled: the call is then answered as interrupted, its outcome unknown."""
        try:
            return await until_cancelled(call, self.control.cancel)
        except RunCancelled:
            return ToolResult.error(
                "interrupted: the run was cancelled while this tool was running; "
                "its outcome is unknown",
                "cancelled",
            )

    # -- resume ----------------------------------------------------------------------------

    async def _resume_pending(
        self,
        state: State,
        recorded: dict[str, ToolResult],
        not_started: frozenset[str],
        turn: int,
    ) -> None:
        """Answer the tool calls of an interrupted batch: recorded results (of this
        very turn: `recorded` holds only the pending assistant message's) are reused;
        calls a wait left `not_started` run now (marked started first); idempotent
        tools re-run unless a cancel is pending; the rest are left for
        RepairToolCalls. A repeated id in the batch gets the duplicate error again.
        The calls that run are grouped as in a fresh batch (`_flush`)."""
        if not state.messages or state.messages[-1].role != "assistant":
            return
        uses = state.messages[-1].tool_uses()
        if not uses:
            return
        self._tools = {t.name: t for t in [*self.view, *self.chain.tools(state)]}
        cancelling = self.control.stop_requested() == "cancel"
        b = _Batch(uses, resume_turn=turn)
        seen: set[str] = set()
        reused = self._reused_ids(state, uses)
        for i, call in enumerate(uses):
            if call.id in seen:
                b.answer(i, _duplicate_id(call), answered=False)
                continue
            seen.add(call.id)
            if call.id in reused:  # refused as in the first attempt, never run
                b.answer(i, _reused_id(call))
                continue
            if call.id in recorded:
                b.answer(i, recorded[call.id])
                continue
            tool = self._tools.get(call.name)
            start = call.id in not_started and not cancelling
            if not (start or (tool is not None and tool.idempotent and not cancelling)):
                b.handled.add(call.id)
                continue  # left for RepairToolCalls
            alone = self._runs_alone(call)
            if alone:
                await self._flush(state, b)
            if start:  # marked started right before the tool runs (_base_tool)
                self._to_mark.add(call.id)
            await self._enqueue(state, b, i, alone, None)
        await self._last_group(state, b)
        if b.results:
            state.messages.append(Message("user", b.blocks()))


def _cancelled_before() -> ToolResult:
    return ToolResult.error(
        "not executed: the run was cancelled before this call started", "cancelled"
    )


def _reused_id(call: ToolUseBlock) -> ToolResult:
    """A call whose id an earlier turn of the history used (a model or proxy that
    repeats itself, e.g. replaying a response after a resume): never executed, so no
    earlier call's record (its result, its approval, its subagent run) answers it."""
    return ToolResult.error(
        f"not executed: tool_use id {call.id!r} was already used by an earlier call in this "
        "conversation; every tool call needs its own id"
    )


def _duplicate_id(call: ToolUseBlock) -> ToolResult:
    return ToolResult.error(
        f"not executed: tool_use id {call.id!r} appears more than once in this response; "
        "every tool call needs its own id"
    )
