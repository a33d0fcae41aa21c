"""7. Parallel tool calls: a turn whose response asks for three slow tool calls, run one
after another (`max_parallel_tools: 1`) and side by side (the default), on durable
Postgres through serve() — every result recorded in its own fenced commit as it
completes, as in production (docs/design.md §5.5).

Each turn: one scripted model call (instant) and three calls of a tool that sleeps
SLOW_S. A turn's wall time is the time from one model call to the next: the batch,
its three recorded results and the turn's checkpoint. The ideal is 3 x SLOW_S one
after another and 1 x SLOW_S side by side; what is above it is the loop's own cost.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import DASH, create_database, drop_database, log, ratio, summarize
from bench.scripted_run import bench_agent, drain, enqueue_go, run_status
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import Request, Response, TextSink
from hango_worker.store import db
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult

SLOW_S = 0.25  # each tool call's own time
CALLS = 3  # tool calls per response
MAX_TURNS = 5
VARIANTS = {"one after another (max_parallel_tools: 1)": 1, "side by side (default)": None}


async def _slow(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    await asyncio.sleep(SLOW_S)
    return ToolResult(f"page {args.get('page')} fetched")


SLOW_TOOL = Tool(
    "fetch_page",
    "Fetches a page (slowly).",
    {"type": "object", "properties": {"page": {"type": "integer"}}, "required": ["page"]},
    _slow,
    idempotent=True,
)


def script(turns: int) -> list[dict[str, Any]]:
    return [
        {
            "text": f"Fetching three pages ({t}).",
            "tool_calls": [
                {"name": "fetch_page", "input": {"page": t * CALLS + i}} for i in range(CALLS)
            ],
        }
        for t in range(turns)
    ] + [{"text": "All pages read."}]


class Stamps:
    """The scripted model, with the clock read at every call."""

    def __init__(self, inner: ScriptedProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.at: list[float] = []

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.at.append(time.perf_counter())
        return await self.inner.complete(request, on_text)


async def one_run(dsn: str, turns: int, limit: int | None) -> list[float]:
    """One run of `turns` three-call turns; each turn's wall time in seconds."""
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    try:
        config = {} if limit is None else {"max_parallel_tools": limit}
        run_id = await enqueue_go(pool, await bench_agent(pool, ["fetch_page"], config))
        provider = Stamps(ScriptedProvider(script(turns)))
        await drain(dsn, provider, Registry([SLOW_TOOL]), max_turns=turns + 5)
        status = await run_status(pool, run_id)
    finally:
        await pool.close()
    if status != "succeeded":
        raise RuntimeError(f"parallel-tools run ended {status}")
    return [b - a for a, b in zip(provider.at, provider.at[1:], strict=False)]


async def compare(admin: str, turns: int, reps: int) -> dict[str, Any]:
    turns = min(MAX_TURNS, turns)
    out: dict[str, Any] = {"turns": turns, "calls": CALLS, "slow_s": SLOW_S, "variants": {}}
    per: dict[str, list[float]] = {v: [] for v in VARIANTS}
    dsn = await create_database(admin, "par", migrated=True)
    try:
        for rep in range(reps):
            order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
            for label in order:
                per[label] += await one_run(dsn, turns, VARIANTS[label])
                log(f"parallel tools {label} rep {rep + 1}")
    finally:
        await drop_database(admin, dsn)
    for label, values in per.items():
        ideal = SLOW_S * (CALLS if VARIANTS[label] == 1 else 1)
        s = summarize(values)
        out["variants"][label] = {
            "turn_s": s,
            "ideal_s": ideal,
            "over_ideal_ms": {k: (v - ideal) * 1000 if k != "n" else v for k, v in s.items()},
        }
    seq, par = (out["variants"][k]["turn_s"]["median"] for k in VARIANTS)
    out["speedup"] = ratio(seq, par)
    return out


def section(r: dict[str, Any]) -> str:
    """docs/benchmarks.md's parallel-tools section (empty when not measured)."""
    pt = r.get("parallel_tools")
    if not pt:
        return ""
    rows = []
    for label, v in pt["variants"].items():
        t, over = v["turn_s"], v["over_ideal_ms"]
        rows.append(
            f"| {label} | {t['median']:.3f} s ({t['min']:.3f}{DASH}{t['max']:.3f}) "
            f"| {v['ideal_s']:.2f} s | {over['median']:.1f} ms |"
        )
    return "\n".join(
        [
            "## 7. Parallel tool calls",
            "",
            f"One response asking for {pt['calls']} calls of a tool that takes "
            f"{pt['slow_s']:g} s, {pt['turns']} turns per run, through `serve()` on durable "
            "Postgres (each result its own fenced commit). Wall time per turn: model call "
            "(scripted, instant), the batch, its recorded results and the checkpoint "
            "(`bench/parallel_tools.py`).",
            "",
            f"| calls | wall per turn, median (min{DASH}max) | ideal | above the ideal |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Side by side, a turn takes **{pt['speedup']:.2f}x less** time.",
            "",
        ]
    )
