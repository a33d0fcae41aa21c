"""Tools for crash tests: each real execution is recorded in a side table.

Load them into a worker with HANGO_TOOL_MODULES=hango_worker.testing.chaos_tools:TOOLS.
They write to `chaos_exec` in the worker's own database (HANGO_DATABASE_URL),
so a test can count real executions and compare them with `tool_calls`.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

import asyncpg

from hango_worker.tool.types import Tool, ToolContext, ToolResult

CREATE = """
CREATE TABLE IF NOT EXISTS chaos_exec (
    id bigserial PRIMARY KEY,
    run_id uuid NOT NULL,
    tool_use_id text NOT NULL,
    tool text NOT NULL,
    pid int NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

_pool: asyncpg.Pool | None = None


async def _db() -> asyncpg.Pool:
    global _pool
    if _pool is None:
        _pool = await asyncpg.create_pool(os.environ["HANGO_DATABASE_URL"], min_size=1, max_size=4)
    return _pool


async def ensure_table(conn: asyncpg.Connection | asyncpg.Pool) -> None:
    await conn.execute(CREATE)


async def _record(tool: str, ctx: ToolContext) -> None:
    pool = await _db()
    await pool.execute(
        "INSERT INTO chaos_exec (run_id, tool_use_id, tool, pid) VALUES ($1, $2, $3, $4)",
        ctx.run_id,
        ctx.tool_use_id,
        tool,
        os.getpid(),
    )


def _step_tool(name: str, idempotent: bool) -> Tool:
    async def step(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await _record(name, ctx)
        await asyncio.sleep(random.uniform(0, float(args.get("max_sleep_s", 0.05))))
        return ToolResult(f"step {args['n']} done")

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "max_sleep_s": {"type": "number"}},
        "required": ["n"],
    }
    return Tool(name, "Does step n (records each real execution).", schema, step, idempotent)


async def _pause(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Records its execution, then sleeps: a window for a test to stop the worker."""
    await _record("pause", ctx)
    await asyncio.sleep(float(args.get("seconds", 1.0)))
    return ToolResult("paused")


def _hang(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """A plain (sync) tool stuck in its thread: it touches `marker` (a file the test
    watches), then blocks for `seconds` (default an hour), as on a dead socket."""
    Path(str(args["marker"])).touch()
    time.sleep(float(args.get("seconds", 3600.0)))
    return ToolResult("woke up")


async def _gate(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """Touches `<dir>/started-<n>`, then waits until `<dir>/go-<n>` exists: a test
    decides when the call ends (a call in flight at the moment it chooses)."""
    await _record("gate", ctx)
    folder, n = Path(str(args["dir"])), int(args["n"])
    (folder / f"started-{n}").touch()
    while not (folder / f"go-{n}").exists():  # noqa: ASYNC110 - another process's file
        await asyncio.sleep(0.02)
    return ToolResult(f"gate {n} passed")


def gated_script(turns: int, folder: Path) -> list[dict[str, Any]]:
    """`turns` turns each calling `gate` (n = 0, 1, …), then a final answer."""
    out: list[dict[str, Any]] = [
        {
            "text": f"Turn {i}.",
            "tool_calls": [{"name": "gate", "input": {"dir": str(folder), "n": i}}],
        }
        for i in range(turns)
    ]
    out.append({"text": "All gates passed."})
    return out


def big_text(size: int, width: int = 200) -> str:
    """Exactly `size` bytes of numbered ASCII lines of `width` bytes (newline included):
    the same text every time, so a test can rebuild what a tool returned."""
    out: list[str] = []
    total = i = 0
    while total < size:
        line = (f"{i:08d} " + "abcdefghij" * (width // 10))[: width - 1]
        rest = size - total
        if len(line) >= rest:
            out.append(line[:rest])
            break
        out.append(line + "\n")
        total += len(line) + 1
        i += 1
    return "".join(out)


async def _big(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    """A large result (`bytes` long, default 5 MB): what the filesystem middleware offloads."""
    await _record("big", ctx)
    return ToolResult(big_text(int(args.get("bytes", 5_000_000))))


TOOLS = [
    _step_tool("step", idempotent=True),
    _step_tool("step_once", idempotent=False),
    Tool(
        "pause",
        "Sleeps.",
        {"type": "object", "properties": {"seconds": {"type": "number"}}},
        _pause,
        idempotent=True,
    ),
    # not idempotent: after a crash it is answered as interrupted, never slept again
    Tool(
        "pause_once",
        "Sleeps; never re-run after a crash.",
        {"type": "object", "properties": {"seconds": {"type": "number"}}},
        _pause,
        idempotent=False,
    ),
    Tool(
        "hang",
        "Blocks its thread.",
        {
            "type": "object",
            "properties": {"marker": {"type": "string"}, "seconds": {"type": "number"}},
            "required": ["marker"],
        },
        _hang,
        idempotent=False,
    ),
    # not idempotent: a call cut off by a crash is answered as interrupted, never re-run
    Tool(
        "gate",
        "Waits for the test's go.",
        {
            "type": "object",
            "properties": {"dir": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["dir", "n"],
        },
        _gate,
        idempotent=False,
    ),
    Tool(
        "big",
        "Returns a large text.",
        {"type": "object", "properties": {"bytes": {"type": "integer"}}},
        _big,
        idempotent=True,
    ),
]


def script(turns: int, tool: str = "step", max_sleep_s: float = 0.05) -> list[dict[str, Any]]:
    """`turns` tool-calling turns, then a final answer."""
    out: list[dict[str, Any]] = [
        {
            "text": f"Turn {i}.",
            "tool_calls": [{"name": tool, "input": {"n": i, "max_sleep_s": max_sleep_s}}],
        }
        for i in range(turns)
    ]
    out.append({"text": "All steps done."})
    return out
