"""`python -m bench.cpu_per_run [RUNS] [--reps N] [--profile]`: worker CPU per one-turn run.

A focused view of the throughput benchmark's hango side (docs/benchmarks.md, section 2)
without subprocesses: RUNS one-turn runs are enqueued in one transaction, then drained
in this process by `serve(until_idle=True)` (defaults, the scripted model answering at
once, no metrics endpoint, tracing as configured by the environment). Reported per
run: this process's CPU (`time.process_time`), Postgres CPU (the benchmark server's
processes, when psutil is installed), transactions (`xact_commit`) and the wall rate.
Each repetition gets a fresh database on one embedded server.

With `--profile`, the last repetition runs under cProfile and the functions with the
most own time are printed (where the CPU goes).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
import time
from typing import Any

import asyncpg

from bench.common import create_database, drop_database, postgres_cpu_seconds, start_server
from bench.profile import drain
from bench.throughput import HANGO_ENQUEUE
from hango_worker.store import db, repo


async def _enqueue(dsn: str, runs: int) -> None:
    conn = await db.connect(dsn)
    try:
        agent_id = await repo.create_agent(
            conn,  # type: ignore[arg-type]
            tenant_id=repo.DEFAULT_TENANT_ID,
            name="bench",
            model="scripted",
            system=[],
            tools=[],
            config={},
        )
        await conn.fetchval(HANGO_ENQUEUE, repo.DEFAULT_TENANT_ID, agent_id, runs)
    finally:
        await conn.close()


async def _xacts(conn: asyncpg.Connection) -> int:
    return int(
        await conn.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
    )


async def one(admin: str, runs: int, profiler: cProfile.Profile | None) -> dict[str, float]:
    dsn = await create_database(admin, "cpr", migrated=True)
    try:
        await _enqueue(dsn, runs)
        conn = await asyncpg.connect(dsn)
        x0 = await _xacts(conn)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        t, cpu, pg = time.perf_counter(), time.process_time(), postgres_cpu_seconds()
        if profiler is not None:
            profiler.enable()
        await drain(dsn)
        if profiler is not None:
            profiler.disable()
        wall = time.perf_counter() - t
        cpu = time.process_time() - cpu
        pg = postgres_cpu_seconds() - pg
        await asyncio.sleep(0.6)  # pg_stat_database is flushed by backends every ~0.5 s
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        x1 = await _xacts(conn)
        left = await conn.fetchval("SELECT count(*) FROM runs WHERE status <> 'succeeded'")
        await conn.close()
    finally:
        await drop_database(admin, dsn)
    if left:
        raise SystemExit(f"{left} runs did not succeed")
    return {
        "per_s": runs / wall,
        "cpu_ms_per_run": cpu * 1000 / runs,
        "pg_cpu_ms_per_run": pg * 1000 / runs,
        "xacts_per_run": (x1 - x0) / runs,
    }


async def main_async(runs: int, reps: int, profile: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="hango-cpr-pg-") as data:
        server, admin = start_server(data)
        try:
            results: list[dict[str, Any]] = []
            profiler = cProfile.Profile(time.process_time) if profile else None
            for rep in range(reps):
                last = rep == reps - 1
                r = await one(admin, runs, profiler if last else None)
                results.append(r)
                print(
                    f"rep {rep + 1}: {r['per_s']:.0f} runs/s, worker CPU "
                    f"{r['cpu_ms_per_run']:.2f} ms/run, Postgres CPU "
                    f"{r['pg_cpu_ms_per_run']:.2f} ms/run, {r['xacts_per_run']:.2f} xacts/run",
                    flush=True,
                )
            if profiler is not None:
                stats = pstats.Stats(profiler)
                stats.sort_stats("tottime").print_stats(45)
                stats.sort_stats("cumulative").print_stats(60)
        finally:
            server.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    asyncio.run(main_async(a.runs, a.reps, a.profile))


if __name__ == "__main__":
    main()
