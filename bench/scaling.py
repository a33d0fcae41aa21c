"""`python -m bench.scaling`: what one run and one turn cost the database (docs/scaling.md).

One embedded PostgreSQL 18 (durable settings, checked), a fresh database per
measurement, `hango-worker run` processes as in production with the scripted model.
Each workload drains `runs` runs of `turns` turns (every turn but the last calls the
`current_time` tool) and records, from enqueue commit to drained:

- Postgres CPU: the benchmark server's processes only (bench.common.postgres_cpu_seconds);
- WAL bytes: `pg_current_wal_lsn()` before and after (nothing else writes on this server);
- commits: `pg_stat_database.xact_commit` of the database (read-only transactions
  included, as Postgres counts them; the benchmark's own polls left out);
- WAL fsyncs: `pg_stat_io` (object 'wal'), every process of the server: the flushes
  the disk must absorb.

The workers are stopped before the counters are read again (a backend reports its
counters when it exits; otherwise at most once a second), and the CPU they spent
stopping is the only thing counted beyond the drain.

The model (docs/scaling.md) is `cost = runs * per_run + turns * per_turn`, fitted on the
first two workloads and checked against the third. Results go to
bench/results/scaling-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    check_durable,
    create_database,
    drop_database,
    log,
    machine,
    pg_settings,
    postgres_cpu_seconds,
    start_server,
    wait_for,
)
from bench.procs import HANGO_RUN, Procs, cpu_seconds, hango_env
from bench.throughput import AGENT, HANGO_ANY_LEFT, HANGO_ENQUEUE, Floor, _ready
from hango_worker.store import db, repo

RESULTS = Path(__file__).resolve().parent / "results"
# (runs, turns per run, worker processes): two to fit, the third to check the model
WORKLOADS = [(1000, 1, 1), (400, 4, 1), (500, 2, 2)]


def script(turns: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = [
        {"text": "Checking.", "tool_calls": [{"name": "current_time"}]} for _ in range(turns - 1)
    ]
    return [*steps, {"text": "Done."}]


COUNTERS = """
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::float8 AS wal,
    (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()) AS commits,
    (SELECT sum(fsyncs) FROM pg_stat_io WHERE object = 'wal' AND context = 'normal')::float8
        AS fsyncs
"""
STATS_FLUSH_S = 1.5  # backends report their counters at most once a second


class Own:
    """Transactions of the benchmark's own connection (polls), left out of `commits`."""

    n = 0


async def _counters(conn: asyncpg.Connection) -> tuple[float, int, int, int]:
    """(server CPU s, WAL bytes, commits, WAL fsyncs) so far. Call when the counters
    have settled: workers stopped (a backend reports at exit) or STATS_FLUSH_S idle."""
    await asyncio.sleep(STATS_FLUSH_S)
    r = await conn.fetchrow(COUNTERS)
    Own.n = 0  # this read's own transaction is counted from here on
    return postgres_cpu_seconds(), int(r["wal"]), int(r["commits"]), int(r["fsyncs"] or 0)


async def _any_left(conn: asyncpg.Connection) -> bool:
    Own.n += 1
    return bool(await conn.fetchval(HANGO_ANY_LEFT))


async def hango(admin: str, runs: int, turns: int, procs_n: int) -> dict[str, Any]:
    dsn = await create_database(admin, "sc_hango", migrated=True)
    tmp = Path(tempfile.mkdtemp(prefix="hango-scaling-"))
    path = tmp / "script.json"
    path.write_text(json.dumps(script(turns)))
    conn = await db.connect(dsn)
    procs = Procs()
    try:
        agent_id = await repo.create_agent(
            conn,  # type: ignore[arg-type]
            tenant_id=repo.DEFAULT_TENANT_ID,
            name=AGENT,
            model="scripted",
            system=[],
            tools=["current_time"],
            config={},
        )

        async def enqueue(n: int) -> None:
            async with conn.transaction():
                await conn.fetchval(HANGO_ENQUEUE, repo.DEFAULT_TENANT_ID, agent_id, n)
                await conn.execute("SELECT pg_notify('hango_runs', 'bench')")

        for _ in range(procs_n):
            await procs.start(HANGO_RUN, hango_env(dsn, path))
        await asyncio.sleep(3.0)  # started and LISTENing
        await enqueue(4 * procs_n)  # warm-up
        await wait_for(lambda: _drained(conn, procs), 60, "warm-up")
        await asyncio.sleep(0.5)
        before, cpu0 = await _counters(conn), cpu_seconds(procs.pids)
        await enqueue(runs)
        t0 = time.perf_counter()
        await wait_for(lambda: _drained(conn, procs), 600, "drain", interval=0.02)
        seconds = time.perf_counter() - t0
        cpu1 = cpu_seconds(procs.pids)
        await procs.stop()
        own = Own.n + 2  # the polls, the enqueue, the first read
        after = await _counters(conn)
    finally:
        await procs.stop()
        await conn.close()
        await drop_database(admin, dsn)
    return _row("hango", runs, turns, procs_n, seconds, before, after, cpu1 - cpu0, own)


async def _drained(conn: asyncpg.Connection, procs: Procs) -> bool:
    procs.check_alive()
    return not await _any_left(conn)


async def floor(admin: str, jobs: int) -> dict[str, Any]:
    """The raw asyncpg claim-and-complete floor (bench/workers.py), same counters."""
    dsn = await create_database(admin, "sc_floor", migrated=False)
    side = Floor(dsn, Path(tempfile.mkdtemp(prefix="hango-scaling-")))
    conn = await side.connect()
    procs = Procs()
    try:
        await side.prepare(conn)
        await side.start(procs)
        await _ready(side, conn, procs, 1)
        before, cpu0 = await _counters(conn), cpu_seconds(procs.pids)
        await side.enqueue(conn, jobs)
        t0 = time.perf_counter()
        await wait_for(lambda: _floor_done(side, conn), 600, "floor drain", interval=0.02)
        seconds = time.perf_counter() - t0
        cpu1 = cpu_seconds(procs.pids)
        await procs.stop()
        own = Own.n + 2
        after = await _counters(conn)
    finally:
        await procs.stop()
        await conn.close()
        await drop_database(admin, dsn)
    return _row("floor", jobs, 1, 1, seconds, before, after, cpu1 - cpu0, own)


async def _floor_done(side: Floor, conn: asyncpg.Connection) -> bool:
    Own.n += 1
    return not await side.any_left(conn)


def _row(
    side: str,
    runs: int,
    turns: int,
    procs_n: int,
    seconds: float,
    before: tuple[float, int, int, int],
    after: tuple[float, int, int, int],
    worker_cpu: float,
    own: int,
) -> dict[str, Any]:
    return {
        "side": side,
        "runs": runs,
        "turns_per_run": turns,
        "procs": procs_n,
        "seconds": seconds,
        "runs_per_s": runs / seconds,
        "pg_cpu_s": after[0] - before[0],
        "wal_bytes": after[1] - before[1],
        "commits": after[2] - before[2] - own,
        "wal_fsyncs": after[3] - before[3],
        "worker_cpu_s": worker_cpu,
    }


def fit(a: dict[str, Any], b: dict[str, Any], key: str) -> tuple[float, float]:
    """(per_run, per_turn) solving runs * per_run + turns * per_turn = key for a and b."""
    r1, t1 = a["runs"], a["runs"] * a["turns_per_run"]
    r2, t2 = b["runs"], b["runs"] * b["turns_per_run"]
    det = r1 * t2 - r2 * t1
    per_run = (a[key] * t2 - b[key] * t1) / det
    per_turn = (r1 * b[key] - r2 * a[key]) / det
    return per_run, per_turn


def model(rows: list[dict[str, Any]]) -> dict[str, Any]:
    a, b, c = rows
    out: dict[str, Any] = {}
    for key in ("pg_cpu_s", "wal_bytes", "commits", "wal_fsyncs", "worker_cpu_s"):
        per_run, per_turn = fit(a, b, key)
        predicted = c["runs"] * per_run + c["runs"] * c["turns_per_run"] * per_turn
        out[key] = {
            "per_run": per_run,
            "per_turn": per_turn,
            "predicted": predicted,
            "measured": c[key],
            "error": (predicted - c[key]) / c[key] if c[key] else None,
        }
    return out


async def run(admin: str, workloads: list[tuple[int, int, int]], floor_jobs: int) -> dict[str, Any]:
    rows = []
    for runs, turns, procs_n in workloads:
        rows.append(await hango(admin, runs, turns, procs_n))
        log(f"scaling: {json.dumps(rows[-1])}")
    reference = await floor(admin, floor_jobs)
    log(f"scaling: {json.dumps(reference)}")
    return {"workloads": rows, "floor": reference, "model": model(rows[:3])}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="a tenth of the runs")
    a = ap.parse_args()
    scale = 10 if a.quick else 1
    workloads = [(r // scale, t, p) for r, t, p in WORKLOADS]
    with tempfile.TemporaryDirectory(prefix="hango-scaling-pg-") as data:
        server, admin = start_server(data)
        try:
            check_durable(asyncio.run(pg_settings(admin)))
            res = asyncio.run(run(admin, workloads, 1000 // scale))
        finally:
            server.cleanup()
    res["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    res["machine"] = machine()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"scaling-{res['date'][:10]}.json"
    out.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    print(json.dumps(res["model"], indent=1))
    print(f"written to {out}")


if __name__ == "__main__":
    main()
