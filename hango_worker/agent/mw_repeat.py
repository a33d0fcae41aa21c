"""RepeatCall: block the Nth identical tool call within a run."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, Field

from hango_worker.agent.middleware import ToolCallRequest, ToolHandler
from hango_worker.agent.state import load_private, store_private
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


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def call_key(name: str, args: Any) -> str:
    return f"{fnv1a64((name + canonical_json(args)).encode()):016x}"


# Distinct calls remembered per run. Bounded so state_json stays small and a turn
# costs the same at turn 500 as at turn 5; the oldest distinct call is forgotten
# first (a loop repeats recent calls, not one from hundreds of calls ago).
MAX_TRACKED = 256


class RepeatState(BaseModel):
    """Documented default: no call seen yet. `counts` is ordered oldest → most recent."""

    counts: dict[str, int] = Field(default_factory=dict)


def _forget_oldest(counts: dict[str, int]) -> None:
    while len(counts) > MAX_TRACKED:
        del counts[next(iter(counts))]


class RepeatCall:
    name = "repeat_call"

    def __init__(self, threshold: int = 3) -> None:
        if threshold < 2:
            raise ValueError("repeat_call threshold must be at least 2")
        self.threshold = threshold

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        st, _ = load_private(req.state, self.name, RepeatState)
        key = call_key(req.call.name, req.call.input)
        prior = st.counts.pop(key, 0)
        st.counts[key] = prior + 1  # re-inserted: now the most recent
        _forget_oldest(st.counts)
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
            metrics.MW_REPEAT_BLOCKED.labels(tool).inc()
            metrics.MW_SHORT_CIRCUITS.labels(self.name).inc()
            return ToolResult.error(
                f"this exact call was already made {prior} times; "
                "use the previous result or change approach"
            )
        return await next(req)
