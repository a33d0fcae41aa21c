"""Benchmark 4: what the middleware chain costs per model call and per tool call.

In process, no database (testing/inmem.py's MemoryRunIO): the real AgentLoop
with the empty stack or the default stack, tracing off (no SDK provider: the
API's no-op tracer) or on (SDK TracerProvider + BatchSpanProcessor + an
exporter that drops spans), at a history of about 10 or 1,000 messages. The
history is made by running the same loop first, so middleware state (e.g.
RepeatCall's window) is what a run of that length really carries.

Measured per call, minus the model's and the tool's own time:
- model call: `chain.model_call` (wrappers + base handler: system assembly,
  chat span, metrics, cancel race);
- tool call: `_one_tool` (tool span + `chain.tool_call` wrappers + base);
- turn: everything between two model calls, in-memory checkpoint included.
"""

from __future__ import annotations

import copy
import gc
import statistics
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from bench.common import summarize
from hango_worker.agent.chain import Chain
from hango_worker.agent.loop import AgentLoop, LoopSettings, RunInfo
from hango_worker.agent.middleware import ModelHandler, ModelRequest, ModelResponse
from hango_worker.agent.spec import AgentConfig, AgentSpec
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.agent.state import State
from hango_worker.provider.types import (
    Message,
    Request,
    Response,
    StopReason,
    TextBlock,
    TextSink,
    ToolUseBlock,
    Usage,
)
from hango_worker.telemetry.setup import setup_tracing
from hango_worker.testing.inmem import MemoryRunIO, make_state
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult

AGENT = AgentSpec(
    id="agent-bench",
    name="bench",
    model="scripted",
    system=["You are a benchmark agent."],
    tools=["step", "write_todos"],
    config=AgentConfig(),
)
ns = time.perf_counter_ns


class DropExporter(SpanExporter):
    """Accepts every batch and keeps nothing (the cost of export itself is not ours)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.model: list[int] = []  # chain.model_call, ns
        self.provider: list[int] = []
        self.tool_path: list[int] = []  # _one_tool, ns
        self.tool_fn: list[int] = []
        self.turn: list[int] = []


class CannedProvider:
    """Answers at once: one `step` call with a fresh argument (never a repeat)."""

    name = "scripted"

    def __init__(self, clock: Clock, start: int = 0) -> None:
        self.clock = clock
        self.n = start

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        t = ns()
        self.n += 1
        msg = Message(
            "assistant",
            [
                TextBlock(text=f"Turn {self.n}."),
                ToolUseBlock(id=f"toolu_{self.n:06d}", name="step", input={"n": self.n}),
            ],
        )
        resp = Response(msg, StopReason.TOOL_USE, Usage(input_tokens=10, output_tokens=3))
        self.clock.provider.append(ns() - t)
        return resp


def step_tool(clock: Clock) -> Tool:
    async def step(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        t = ns()
        r = ToolResult(f"step {args['n']} done")
        clock.tool_fn.append(ns() - t)
        return r

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    return Tool("step", "Does step n.", schema, step, idempotent=True)


class TimedChain(Chain):
    clock: Clock

    async def model_call(self, req: ModelRequest, base: ModelHandler) -> ModelResponse:
        t = ns()
        r = await super().model_call(req, base)
        self.clock.model.append(ns() - t)
        return r


class TimedLoop(AgentLoop):
    clock: Clock

    async def _turn(self, state: State, turn: int) -> Any:
        t = ns()
        r = await super()._turn(state, turn)
        self.clock.turn.append(ns() - t)
        return r

    async def _one_tool(self, state: State, call: ToolUseBlock) -> ToolResult:
        t = ns()
        r = await super()._one_tool(state, call)
        self.clock.tool_path.append(ns() - t)
        return r


def _stack(kind: str) -> list[Any]:
    return default_stack(StackConfig(tuple(AGENT.tools))) if kind == "default" else []


async def _drive(state: State, kind: str, turns: int, clock: Clock, start: int) -> None:
    chain = TimedChain(_stack(kind))
    chain.clock = clock
    registry = Registry([step_tool(clock)])
    settings = LoopSettings(max_turns=turns, provider_name="scripted")
    loop = TimedLoop(
        AGENT,
        chain,
        registry.view(AGENT.tools),
        CannedProvider(clock, start),
        MemoryRunIO(),
        settings,
    )
    loop.clock = clock
    await loop.run(state, RunInfo(persisted=len(state.messages)))


async def history_state(kind: str, messages: int) -> State:
    """A state ~`messages` long, made by the same loop and stack (middleware state included)."""
    state = make_state(AGENT, "go")
    await _drive(state, kind, max(1, messages // 2), Clock(), start=10_000_000)
    return state


def _per_call_us(total: list[int], inner: list[int]) -> float:
    return statistics.median((a - b) / 1000 for a, b in zip(total, inner, strict=False))


async def measure(kind: str, tracing: bool, base: State, calls: int) -> dict[str, float]:
    """One batch of `calls` turns from a copy of `base`; per-call medians in µs."""
    handle = setup_tracing(exporter=DropExporter()) if tracing else None
    try:
        state = copy.deepcopy(base)
        clock = Clock()
        gc.collect()
        await _drive(state, kind, calls, clock, start=0)
        if handle is not None:
            handle.force_flush()
    finally:
        if handle is not None:
            handle.shutdown()
    turn_inner = [p + f for p, f in zip(clock.provider, clock.tool_fn, strict=False)]
    return {
        "model_call_us": _per_call_us(clock.model, clock.provider),
        "tool_call_us": _per_call_us(clock.tool_path, clock.tool_fn),
        "turn_us": _per_call_us(clock.turn, turn_inner),
    }


CONFIGS = [
    (h, kind, tracing)
    for h in (10, 1000)
    for tracing in (False, True)
    for kind in ("empty", "default")
]


async def chain_overhead(calls: int, reps: int) -> dict[str, Any]:
    """Every configuration, alternating within each repetition."""
    bases = {(h, k): await history_state(k, h) for h in (10, 1000) for k in ("empty", "default")}
    raw: dict[str, list[dict[str, float]]] = {}
    for _ in range(reps):
        for h, kind, tracing in CONFIGS:
            key = f"h{h}/{kind}/{'tracing' if tracing else 'no-tracing'}"
            raw.setdefault(key, []).append(await measure(kind, tracing, bases[(h, kind)], calls))
    out: dict[str, Any] = {"configs": {}, "middlewares": _names()}
    for key, runs in raw.items():
        out["configs"][key] = {m: summarize([r[m] for r in runs]) for m in runs[0]}
    out["history_messages"] = {str(h): len(bases[(h, "default")].messages) for h in (10, 1000)}
    return out


def _names() -> list[str]:
    return [m.name for m in _stack("default") if m is not None]


def per_middleware(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """(default - empty) per call, and that divided by the number of middlewares."""
    n = len(result["middlewares"]) or 1
    out: dict[str, dict[str, float]] = {}
    for h in (10, 1000):
        for tr in ("no-tracing", "tracing"):
            d = result["configs"][f"h{h}/default/{tr}"]
            e = result["configs"][f"h{h}/empty/{tr}"]
            row = {}
            for m in ("model_call_us", "tool_call_us", "turn_us"):
                row[m] = d[m]["median"] - e[m]["median"]
                row[m + "_per_mw"] = row[m] / n
            out[f"h{h}/{tr}"] = row
    return out
