"""RepeatCall: block the Nth identical tool call within a run."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from hango_worker.agent.middleware import StackContext, SuspendRun, ToolCallRequest, ToolHandler
from hango_worker.agent.state import State, load_private, store_private
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.tool.types import ToolResult

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF


def fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


# json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False), from one
# encoder made once (json.dumps with options builds a new one per call).
canonical_json: Callable[[Any], str] = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False
).encode


def call_key(name: str, args: Any) -> str:
    return f"{fnv1a64((name + canonical_json(args)).encode()):016x}"


# Distinct calls remembered per run. Bounded so state_json stays small and a turn
# costs the same at turn 500 as at turn 5; the oldest distinct call is forgotten
# first (a loop repeats recent calls, not one from a hundred calls ago). A list,
# not a dict: jsonb does not keep object key order, so "oldest" must be explicit.
MAX_TRACKED = 64


class RepeatConfig(BaseModel):
    """The agent's setting (`agents.config`, a section of AgentConfig)."""

    # the Nth identical call is blocked (None: the worker's HANGO_REPEAT_CALL_THRESHOLD)
    repeat_call_threshold: int | None = Field(default=None, ge=2, le=1000)


class RepeatState(BaseModel):
    """Documented default: no call seen yet. `recent` is (key, count), oldest first.
    `calls` is (tool_use id, calls made before it) for the calls of the batch in
    progress: a call counted in an attempt that crashed (its count stored with a call
    that ran beside it) is judged the same, not counted again, when it runs after."""

    recent: list[tuple[str, int]] = Field(default_factory=list)
    calls: list[tuple[str, int]] = Field(default_factory=list)

    def count(self, key: str, call_id: str, batch: set[str]) -> int:
        """Count the call `call_id` of `key` once; returns how many were made before it."""
        for i, prior in self.calls:
            if i == call_id:
                return prior
        prior = self.bump(key)
        self.calls = [(i, n) for i, n in self.calls if i in batch] + [(call_id, prior)]
        return prior

    def bump(self, key: str) -> int:
        """Count one more call of `key`; returns how many were made before it."""
        prior = 0
        for i, (k, n) in enumerate(self.recent):
            if k == key:
                prior = n
                del self.recent[i]
                break
        self.recent.append((key, prior + 1))
        if len(self.recent) > MAX_TRACKED:
            del self.recent[: len(self.recent) - MAX_TRACKED]
        return prior

    def unbump(self, key: str) -> None:
        """Take back one call of `key` (one that was counted but not made)."""
        for i, (k, n) in enumerate(self.recent):
            if k == key:
                if n > 1:
                    self.recent[i] = (k, n - 1)
                else:
                    del self.recent[i]
                return


class RepeatCall:
    name = "repeat_call"

    def __init__(self, threshold: int = 3) -> None:
        if threshold < 2:
            raise ValueError("repeat_call threshold must be at least 2")
        self.threshold = threshold

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        st, _ = load_private(req.state, self.name, RepeatState)
        key = call_key(req.call.name, req.call.input)
        prior = st.count(key, req.call.id, _batch_ids(req.state))
        store_private(req.state, self.name, st)
        if prior + 1 >= self.threshold:
            tool = req.call.name
            middleware_event(
                "middleware.repeat_call_blocked",
                self.name,
                "identical call",
                **{"gen_ai.tool.name": tool, "hango.repeat.count": prior + 1},
            )
            middleware_event("middleware.short_circuited", self.name, "repeated identical call")
            # label only known tools: a model's made-up names must not grow the series
            metrics.MW_REPEAT_BLOCKED.labels(tool if req.tool is not None else "_unknown").inc()
            metrics.MW_SHORT_CIRCUITS.labels(self.name).inc()
            return ToolResult.error(
                f"this exact call was already made {prior} times; "
                "use the previous result or change approach"
            )
        try:
            return await next(req)
        except SuspendRun:  # the call waits for a person: it was not made, so not counted
            # taken back from the state as it is now, not restored from a copy made
            # before: calls running beside this one counted theirs meanwhile
            st, _ = load_private(req.state, self.name, RepeatState)
            st.unbump(key)
            st.calls = [(i, n) for i, n in st.calls if i != req.call.id]
            store_private(req.state, self.name, st)
            raise


def _batch_ids(state: State) -> set[str]:
    """The ids of the batch in progress: the calls of the newest assistant message."""
    for m in reversed(state.messages):
        if m.role == "assistant":
            return {u.id for u in m.tool_uses()}
    return set()


def build(ctx: StackContext) -> RepeatCall:
    own = ctx.settings(RepeatConfig).repeat_call_threshold
    return RepeatCall(threshold=own or ctx.repeat_call_threshold)
