"""`python -m bench.turn_counts [--turns N] [--top K] [--callgrind]`: work per turn, counted.

Wall and CPU clocks are unreliable on a busy machine; counts are not. This runs the
per-turn benchmark's hango side (bench/per_turn.py: one run of N tool-calling turns,
default stack, zero-latency scripted model, `serve(until_idle=True)` checkpointing every
turn into an embedded Postgres) and reports:

- **Python calls per turn**: cProfile is switched on at the 3rd model call and off at
  the last one, so the count covers whole turns in the steady state (the checkpoint,
  the tool call and its recorded result, the loop, the chain, spans and metrics), not
  the claim, the load or the final commit. `--top K` lists the functions called most.
- **instructions per turn** (`--callgrind`, needs valgrind): the same run without
  cProfile, twice, in a child process under `valgrind --tool=callgrind` (Postgres runs
  outside it), with N and 2N turns; the difference of the two totals divided by N.

A warm-up run of a few turns goes first in the same process (imports, statement
caches, the middleware partition cache), so neither count includes first-use costs.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, create_database, drop_database, start_server
from bench.per_turn import STEP_TOOL, script
from bench.scripted_run import bench_agent, drain, enqueue_go, run_status
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import Request, Response, TextSink
from hango_worker.store import db
from hango_worker.tool.registry import Registry

FIRST = 3  # model call at which counting starts (turns before it: warm-up of the run)


class CountingProvider:
    """The scripted model; cProfile (if any) on from call FIRST to the last call."""

    def __init__(self, turns: int, profiler: cProfile.Profile | None) -> None:
        self.inner = ScriptedProvider(script(turns))
        self.name = self.inner.name
        self.profiler = profiler
        self.calls = 0
        self.last = turns + 1  # the closing answer's call

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.calls += 1
        if self.profiler is not None:
            if self.calls == FIRST:
                self.profiler.enable()
            elif self.calls == self.last:
                self.profiler.disable()
        return await self.inner.complete(request, on_text)


async def one_run(dsn: str, turns: int, profiler: cProfile.Profile | None = None) -> None:
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    try:
        name = await bench_agent(pool, ["step"], {})
        run_id = await enqueue_go(pool, name)
        provider = CountingProvider(turns, profiler)
        await drain(dsn, provider, Registry([STEP_TOOL]), max_turns=turns + 10)
        status = await run_status(pool, run_id)
    finally:
        await pool.close()
    if status != "succeeded" or provider.calls != turns + 1:
        raise SystemExit(f"run ended {status} after {provider.calls} model calls")


def group(path: str) -> str:
    """Who a profiled function belongs to: hango_worker, the event loop, asyncpg, other."""
    if "hango_worker/" in path:
        return "hango_worker"
    if "/asyncio/" in path or path.endswith("selectors.py"):
        return "event loop"
    if "/asyncpg/" in path:
        return "asyncpg"
    return "other"


def calls_per_turn(profiler: cProfile.Profile, turns: int, top: int) -> dict[str, Any]:
    """Calls per counted turn, in total and by group (a built-in function's calls, and
    a frozen module's, count for the group of the function that called it)."""
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    counted = turns + 1 - FIRST  # whole turns between the two switches
    total = sum(v[1] for v in raw.values())  # primitive + recursive calls
    groups: dict[str, float] = {}
    for (path, _, _), v in raw.items():
        if path.startswith(("~", "<")):  # built-in or frozen: charged to its callers
            for (cpath, _, _), cv in v[4].items():
                g = group(cpath)
                groups[g] = groups.get(g, 0) + cv[1] / counted
        else:
            g = group(path)
            groups[g] = groups.get(g, 0) + v[1] / counted
    rows = sorted(raw.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "turns_counted": counted,
        "calls_per_turn": total / counted,
        "by_group": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "top": [
            (f"{os.path.relpath(f, ROOT) if f.startswith('/') else f}:{line}({fn})", v[1] / counted)
            for (f, line, fn), v in rows
        ],
    }


async def child(dsn: str, turns: int) -> None:
    """The run a callgrind child does (the warm-up first, like the parent's)."""
    await one_run(dsn, 5)
    await one_run(dsn, turns)


def callgrind_total(dsn: str, turns: int, code: Path = ROOT) -> int:
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        "bench.turn_counts",
        "--child",
        dsn,
        "--turns",
        str(turns),
    ]
    env = dict(os.environ, PYTHONMALLOC="malloc")
    out = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"callgrind child failed:\n{out.stderr[-2000:]}")
    found = re.search(r"Collected\s*:\s*([\d,]+)", out.stderr)
    if found is None:
        raise SystemExit(f"no callgrind total in:\n{out.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


async def instructions(admin: str, turns: int, code: Path) -> tuple[int, int]:
    """Callgrind totals of runs of `turns` and 2 x `turns` turns (concurrently: counts,
    not clocks), on the code in `code`; each in a database of its own (a worker drains
    every run its database holds, so two children must not share one)."""
    dsns = [await create_database(admin, "tcg", migrated=True) for _ in range(2)]
    try:
        a, b = await asyncio.gather(
            asyncio.to_thread(callgrind_total, dsns[0], turns, code),
            asyncio.to_thread(callgrind_total, dsns[1], 2 * turns, code),
        )
    finally:
        for dsn in dsns:
            await drop_database(admin, dsn)
    return a, b


async def main_async(
    turns: int, top: int, with_callgrind: bool, dump: str | None, codes: list[Path]
) -> None:
    with tempfile.TemporaryDirectory(prefix="hango-tc-pg-") as data:
        server, admin = start_server(data)
        try:
            dsn = await create_database(admin, "tc", migrated=True)
            try:
                await one_run(dsn, 5)  # warm-up
                profiler = cProfile.Profile()
                await one_run(dsn, turns, profiler)
                res = calls_per_turn(profiler, turns, top)
                if dump:
                    profiler.dump_stats(dump)
                print(
                    f"Python calls per turn: {res['calls_per_turn']:.1f} "
                    f"(cProfile, {res['turns_counted']} turns)"
                )
                print(
                    "  by group: " + ", ".join(f"{g} {n:.1f}" for g, n in res["by_group"].items())
                )
                for fn, n in res["top"]:
                    print(f"  {n:7.2f}  {fn}")
                if with_callgrind:
                    found = await asyncio.gather(*(instructions(admin, turns, c) for c in codes))
                    for code, (a, b) in zip(codes, found, strict=True):
                        print(
                            f"instructions per turn: {(b - a) / turns:,.0f} (callgrind, runs of "
                            f"{turns} and {2 * turns} turns: {a:,} / {b:,}; code in {code})"
                        )
            finally:
                await drop_database(admin, dsn)
        finally:
            server.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--dump", metavar="FILE", help="write the cProfile stats (pstats format)")
    ap.add_argument(
        "--code",
        action="append",
        type=Path,
        help="callgrind the code in this directory (e.g. `git archive` of another commit) "
        "instead of this checkout; repeatable, measured side by side",
    )
    ap.add_argument("--child", metavar="DSN", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        asyncio.run(child(a.child, a.turns))
    else:
        asyncio.run(main_async(a.turns, a.top, a.callgrind, a.dump, a.code or [ROOT]))


if __name__ == "__main__":
    main()
