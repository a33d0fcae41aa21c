"""A turn's tool calls: the batch after a model answer, and the pending batch that a
resumed attempt finishes. Part of the loop (AgentLoop inherits it); kept apart so
`agent/loop.py` stays the turn's control flow.

Each call goes through `Chain.tool_call` and its result is recorded as soon as it
completes (docs/design.md §5.4). A call a middleware suspends (`SuspendRun`, e.g.
an approval) ends the attempt: the calls of the batch not started yet are kept in
the waiting record, and the attempt that resumes the run starts exactly those —
each marked started (`RunIO.mark_started`) by the base tool handler, right before
the tool itself runs, so a crash while one runs makes it "interrupted", never
executed twice, and a crash before it started leaves it to the next attempt.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, NoReturn

from hango_worker.agent.calls import RunCancelled, until_cancelled
from hango_worker.agent.chain import Chain
from hango_worker.agent.limits import Limits, ToolCounts
from hango_worker.agent.middleware import AwaitChild, SuspendRun, ToolCallRequest, ToolHandler
from hango_worker.agent.ports import Event, RunIO
from hango_worker.agent.state import State, load_private, store_private
from hango_worker.provider.sanitize import record_sanitized
from hango_worker.provider.types import Message, StopReason, ToolUseBlock
from hango_worker.telemetry import genai, metrics
from hango_worker.telemetry.tracing import turn_span
from hango_worker.tool.registry import View
from hango_worker.tool.types import Tool, ToolContext, ToolResult


class Waiting(Exception):
    """The batch stopped at a call that waits for a person; `record` is what the run
    waits for (`runs.waiting_for`)."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__(record.get("reason"))
        self.record = record


class ToolBatches:
    chain: Chain
    io: RunIO
    view: View
    settings: Any  # LoopSettings
    _tools: dict[str, Tool]
    _limits: Limits
    _counts: ToolCounts | None
    _base_tool_handler: ToolHandler
    _to_mark: set[str]  # calls to mark started just before their tool runs

    async def _tool_batch(self, state: State, uses: list[ToolUseBlock], stop: StopReason) -> None:
        results = []
        seen: set[str] = set()
        children: list[str] = []  # calls whose child runs are still running
        for i, call in enumerate(uses):
            result = _duplicate_id(call) if call.id in seen else self._not_executed(call, stop)
            if result is None:
                try:
                    result = self._over_limit(state, call) or await self._one_tool(state, call)
                except AwaitChild:
                    seen.add(call.id)
                    children.append(call.id)
                    continue
                except SuspendRun as s:
                    await self._suspend(state, uses[i:], seen, s, children)
            seen.add(call.id)
            await self.io.record_tool_result(state, call, result, self._tool_event(call, result))
            results.append(result.to_block(call.id))
        if children:
            metrics.RUNS_SUSPENDED.labels("children").inc()
            raise Waiting({"reason": "children", "not_started": children})
        state.messages.append(Message("user", list(results)))
        state.scratch.clear()

    async def _suspend(
        self,
        state: State,
        rest: Sequence[ToolUseBlock],
        seen: set[str],
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
                event = self._tool_event(call, refused)
                await self.io.record_tool_result(state, call, refused, event)
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
        if self.io.cancel_event.is_set():
            return ToolResult.error(
                "not executed: the run was cancelled before this call started", "cancelled"
            )
        return None

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
            return await until_cancelled(call, self.io.cancel_event)
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
        children: list[str] = []  # calls whose child runs are still running
        for i, call in enumerate(uses):
            if call.id in seen:
                blocks.append(_duplicate_id(call).to_block(call.id))
                continue
            if call.id in recorded:
                seen.add(call.id)
                blocks.append(recorded[call.id].to_block(call.id))
                continue
            tool = self._tools.get(call.name)
            start = call.id in not_started and not cancelling
            if start or (tool is not None and tool.idempotent and not cancelling):
                if start:  # marked started right before the tool runs (_base_tool)
                    self._to_mark.add(call.id)
                with turn_span("resume tool batch", {"hango.turn.index": turn}):
                    try:
                        result = self._over_limit(state, call) or await self._one_tool(state, call)
                    except AwaitChild:
                        children.append(call.id)
                        seen.add(call.id)
                        continue
                    except SuspendRun as s:
                        await self._suspend(state, uses[i:], seen, s, children)
                await self.io.record_tool_result(
                    state, call, result, self._tool_event(call, result)
                )
                blocks.append(result.to_block(call.id))
            seen.add(call.id)
        if children:
            metrics.RUNS_SUSPENDED.labels("children").inc()
            raise Waiting({"reason": "children", "not_started": children})
        if blocks:
            state.messages.append(Message("user", list(blocks)))


def _duplicate_id(call: ToolUseBlock) -> ToolResult:
    return ToolResult.error(
        f"not executed: tool_use id {call.id!r} appears more than once in this response; "
        "every tool call needs its own id"
    )
