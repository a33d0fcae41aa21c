"""Benchmark 1: per-turn cost against history length, hango-worker side.

One run of `turns` tool-calling turns (one tool call each, zero-latency
scripted model) through the real worker path: `serve(until_idle=True)` claims
it, loads it, and the real loop checkpoints every turn through PgRunIO into
Postgres. The model records the wall clock and the process CPU clock at each
call; a turn's cost is the gap between two consecutive model calls (the
checkpoint, the tool call and its recorded result, the loop and the chain).
Table sizes are sampled at a few calls; the sampling time is subtracted.
"""

from __future__ import annotations

import base64
import os
import random
import statistics
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from prometheus_client import REGISTRY

from bench.common import live_bytes, relation_bytes, summarize, windows_for
from bench.scripted_run import bench_agent, drain, enqueue_go, run_status
from hango_worker.agent.compaction import RUNGS, SUMMARY_SYSTEM
from hango_worker.agent.context import messages_chars
from hango_worker.provider.scripted import ScriptedProvider
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
from hango_worker.store import db
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult

HANGO_TABLES = ("messages", "run_events", "tool_calls", "runs", "sessions")
TODO_EVERY = 10  # write_todos on turns 1, 11, 21, … (both sides)


# -- the script both sides play -------------------------------------------------------------


def todo_list(i: int) -> list[dict[str, str]]:
    """Five items; the one in progress moves along as the run goes."""
    cur = (i // TODO_EVERY) % 5
    return [
        {
            "content": f"part {j} of the work",
            "status": "completed" if j < cur else ("in_progress" if j == cur else "pending"),
        }
        for j in range(5)
    ]


def turn_call(i: int, todo: bool) -> tuple[str, dict[str, Any]]:
    """Tool call of turn i (0-based): `step`, or `write_todos` every TODO_EVERY turns."""
    if todo and i % TODO_EVERY == 0:
        return "write_todos", {"todos": todo_list(i)}
    return "step", {"n": i}


def script(turns: int, todo: bool = False, thinking: bool = False) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(turns):
        name, args = turn_call(i, todo)
        turn: dict[str, Any] = {"text": f"Turn {i}.", "tool_calls": [{"name": name, "input": args}]}
        if thinking:
            turn["blocks"] = [thinking_block(i)]
        out.append(turn)
    out.append({"text": "All steps done.", "blocks": [thinking_block(turns)] if thinking else []})
    return out


async def _step(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    return ToolResult(f"step {args['n']} done")


STEP_TOOL = Tool(
    "step",
    "Does step n.",
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    _step,
    idempotent=True,
)


# -- the thinking variant: every response starts with a thinking block and its signature --

THINKING_CHARS = 1_500  # a few hundred tokens of thinking per turn
# an opaque signature of the size the API sends (base64 of a few hundred bytes)
SIGNATURE = base64.b64encode(random.Random(11).randbytes(420)).decode()
THINKING_CONFIG = {"thinking": {"type": "enabled", "budget_tokens": 2048}, "max_tokens": 8000}


def thinking_block(i: int) -> dict[str, Any]:
    """The thinking block of turn i, as the API returns it (kept and sent back whole)."""
    start = (i * 4099) % (len(_POOL) - THINKING_CHARS)
    text = f"Turn {i}: " + _POOL[start : start + THINKING_CHARS]
    return {"type": "thinking", "thinking": text, "signature": SIGNATURE}


# -- the compaction variant: ~8 KB results, a window the run outgrows -----------------------

COMPACT_RESULT_CHARS = 8_000
COMPACT_WINDOW = 30_000  # tokens (the agent's context_window); defaults for the rest


def _text_pool(chars: int = 65_536) -> str:
    """Deterministic prose-like text that Postgres cannot compress away."""
    rnd = random.Random(7)
    words = ["".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 9))) for _ in range(4096)]
    out: list[str] = []
    size = 0
    while size < chars:
        w = rnd.choice(words)
        out.append(w)
        size += len(w) + 1
    return " ".join(out)


_POOL = _text_pool()


async def _big_step(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    start = (int(args["n"]) * 7919) % (len(_POOL) - COMPACT_RESULT_CHARS)
    return ToolResult(f"step {args['n']}: " + _POOL[start : start + COMPACT_RESULT_CHARS])


BIG_STEP_TOOL = Tool(
    "step",
    "Does step n and reports at length.",
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    _big_step,
    idempotent=True,
)


class CountingModel:
    """Zero-latency model for the compaction variant: its k-th turn call plays turn k
    whatever the (compacted) history holds; summary requests get a short summary.
    Reports input tokens as the fake Anthropic server counts them (chars / 4)."""

    name = "scripted"

    def __init__(self, turns: int, rec: TurnRecorder) -> None:
        self.turns, self.rec = turns, rec
        self.calls = 0
        self.summaries = 0

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        tokens = Usage(input_tokens=max(1, messages_chars(request.messages) // 4), output_tokens=8)
        if request.system and request.system[0].text == SUMMARY_SYSTEM:
            self.summaries += 1
            summary = Message("assistant", [TextBlock(f"Steps 0-{self.calls} were done.")])
            return Response(summary, StopReason.END_TURN, tokens)
        await self.rec.on_call()
        i, self.calls = self.calls, self.calls + 1
        if i >= self.turns:
            return Response(
                Message("assistant", [TextBlock("All steps done.")]), StopReason.END_TURN, tokens
            )
        call = ToolUseBlock(f"toolu_b{i:05d}", "step", {"n": i})
        msg = Message("assistant", [TextBlock(f"Turn {i}."), call])
        return Response(msg, StopReason.TOOL_USE, tokens)


def compactions() -> dict[str, float]:
    return {
        r: REGISTRY.get_sample_value("hango_compactions_total", {"rung": r}) or 0.0 for r in RUNGS
    }


# -- recording ------------------------------------------------------------------------------


@dataclass
class TurnRecorder:
    """Clocks at every model call; optional table-size samples at chosen calls."""

    conn: asyncpg.Connection | None = None
    tables: Sequence[str] = ()
    sample_at: frozenset[int] = frozenset()
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    sizes: dict[int, int] = field(default_factory=dict)
    last_raw: float = 0.0  # unadjusted perf_counter at the latest call
    _hook_wall: float = 0.0
    _hook_cpu: float = 0.0

    async def on_call(self) -> None:
        t, c = time.perf_counter(), time.process_time()
        k = len(self.wall) + 1
        self.last_raw = t
        self.wall.append(t - self._hook_wall)
        self.cpu.append(c - self._hook_cpu)
        if self.conn is not None and k in self.sample_at:
            self.sizes[k] = await relation_bytes(self.conn, self.tables)
            self._hook_wall += time.perf_counter() - t
            self._hook_cpu += time.process_time() - c

    def per_turn_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.wall, self.wall[1:], strict=False)]

    def cpu_per_turn_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.cpu, self.cpu[1:], strict=False)]


def sample_points(turns: int) -> tuple[int, int, int, int]:
    """Model calls at which sizes are sampled: two windows of w turns, first and last."""
    w = min(50, max(1, turns // 2))
    return 1, 1 + w, turns + 1 - w, turns + 1


def bytes_windows(rec: TurnRecorder, turns: int) -> dict[str, float]:
    a, b, c, d = sample_points(turns)
    s = rec.sizes
    if not all(k in s for k in (a, b, c, d)):
        return {}
    return {
        f"turns {a}-{b - 1}": (s[b] - s[a]) / (b - a),
        f"turns {c}-{d - 1}": (s[d] - s[c]) / (d - c),
    }


class StampingProvider:
    """The scripted model, with the recorder's clock read first at every call."""

    def __init__(self, inner: ScriptedProvider, rec: TurnRecorder) -> None:
        self.inner = inner
        self.rec = rec
        self.name = inner.name

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        await self.rec.on_call()
        return await self.inner.complete(request, on_text)


# -- one hango run --------------------------------------------------------------------------


# -- the attachment variant: the run's input carries a PDF (stored once, sent every turn) --


def attachment(size: int) -> list[dict[str, Any]]:
    """A one-page PDF of `size` bytes (incompressible padding) as the run's content."""
    head = b"%PDF-1.7\n1 0 obj << /Type /Page >> endobj\n"
    data = head + os.urandom(max(0, size - len(head)))
    source = {"type": "base64", "media_type": "application/pdf"}
    source["data"] = base64.b64encode(data).decode("ascii")
    return [{"type": "document", "source": source, "title": "attachment.pdf"}]


async def hango_run(
    dsn: str,
    turns: int,
    *,
    todo: bool = False,
    compact: bool = False,
    thinking: bool = False,
    attach: int = 0,
) -> dict[str, Any]:
    """One `turns`-turn run through serve(); per-turn wall/CPU and bytes stored.
    `compact`: ~8 KB tool results and a window the run outgrows (the ladder at work).
    `thinking`: every response starts with a ~1.5 KB thinking block and its signature
    (the agent has thinking on), so the history carries them all.
    `attach`: the run's input carries a PDF of this many bytes (stored once by sha256,
    its bytes put back in every request), beside the same text."""
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    conn = await asyncpg.connect(dsn)
    try:
        tools = ["step", "write_todos"] if todo else ["step"]
        config: dict[str, Any] = {"context_window": COMPACT_WINDOW} if compact else {}
        if thinking:
            config.update(THINKING_CONFIG)
        name = await bench_agent(pool, tools, config)
        rec = TurnRecorder(conn, HANGO_TABLES, frozenset(sample_points(turns)))
        model = CountingModel(turns, rec)
        provider = (
            model
            if compact
            else StampingProvider(ScriptedProvider(script(turns, todo, thinking)), rec)
        )
        rungs_before = compactions()
        before = await relation_bytes(conn, HANGO_TABLES)
        live_before = await live_bytes(conn, HANGO_TABLES)
        run_id = await enqueue_go(pool, name, attachment(attach) if attach else None)
        registry = Registry([BIG_STEP_TOOL if compact else STEP_TOOL])
        started = time.perf_counter()
        await drain(dsn, provider, registry, max_turns=turns + 10)
        total_s = time.perf_counter() - started
        after = await relation_bytes(conn, HANGO_TABLES)
        live = await live_bytes(conn, HANGO_TABLES) - live_before
        status = await run_status(conn, run_id)
    finally:
        await conn.close()
        await pool.close()
    if status != "succeeded":
        raise RuntimeError(f"hango per-turn run ended {status}")
    out = run_result(rec, turns, total_s, after - before, live)
    if compact:
        out["summary_calls"] = model.summaries
        out["compactions"] = {r: n - rungs_before[r] for r, n in compactions().items()}
    return out


def run_result(
    rec: TurnRecorder, turns: int, total_s: float, stored: int, live: int
) -> dict[str, Any]:
    """What one run of either side reports (same shape, so aggregation is shared)."""
    wall = rec.per_turn_ms()[:turns]
    cpu = rec.cpu_per_turn_ms()[:turns]
    if len(wall) != turns:
        raise RuntimeError(f"expected {turns} turns, recorded {len(wall)}")
    return {
        "per_turn_ms": wall,
        "cpu_per_turn_ms": cpu,
        "total_s": total_s,
        "bytes_total": stored,
        "bytes_per_turn": stored / turns,
        "live_bytes_per_turn": live / turns,
        "bytes_windows": bytes_windows(rec, turns),
    }


def aggregate(runs: list[dict[str, Any]], turns: int) -> dict[str, Any]:
    """Across repetitions: each window's per-run median, then median and min-max."""
    out: dict[str, Any] = {"reps": len(runs), "windows": {}, "cpu_windows": {}}
    for a, b in windows_for(turns):
        key = f"{a}-{b}"
        out["windows"][key] = summarize(
            [statistics.median(r["per_turn_ms"][a - 1 : b]) for r in runs]
        )
        out["cpu_windows"][key] = summarize(
            [statistics.median(r["cpu_per_turn_ms"][a - 1 : b]) for r in runs]
        )
    out["mean_turn_ms"] = summarize([statistics.fmean(r["per_turn_ms"]) for r in runs])
    out["cpu_mean_turn_ms"] = summarize([statistics.fmean(r["cpu_per_turn_ms"]) for r in runs])
    out["bytes_per_turn"] = summarize([r["bytes_per_turn"] for r in runs])
    out["live_bytes_per_turn"] = summarize([r["live_bytes_per_turn"] for r in runs])
    keys = runs[0]["bytes_windows"].keys() if runs else []
    out["bytes_windows"] = {k: summarize([r["bytes_windows"][k] for r in runs]) for k in keys}
    out["total_s"] = summarize([r["total_s"] for r in runs])
    out["series_ms"] = [statistics.median(r["per_turn_ms"][i] for r in runs) for i in range(turns)]
    if runs and "summary_calls" in runs[0]:
        out["summary_calls"] = summarize([r["summary_calls"] for r in runs])
        out["compactions"] = {k: summarize([r["compactions"][k] for r in runs]) for k in RUNGS}
    if runs and "lag_s" in runs[0]:
        out["lag_s"] = summarize([r["lag_s"] for r in runs])
    return out
