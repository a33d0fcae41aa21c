"""Benchmarks 2, 3 and 5: throughput, enqueue→first-model-call latency, worker memory.

Every side runs as separate worker processes against its own fresh database
on the same Postgres server. The clock starts when the enqueue transaction has
committed (the workers are idle, LISTENing) and stops when the client's poll
(every 10 ms) sees nothing left to do.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    database_name,
    listeners,
    percentile,
    postgres_cpu_seconds,
    summarize,
    wait_for,
)
from bench.procs import HANGO_RUN, Procs, cpu_seconds, hango_env, rss_bytes
from bench.workers import FLOOR_CHANNEL, FLOOR_ENQUEUE, FLOOR_SCHEMA
from hango_worker import service
from hango_worker.store import db, repo

AGENT = "bench"
ONE_TURN = [{"text": "Done."}]

HANGO_ENQUEUE = """
WITH s AS (
    INSERT INTO sessions (id, tenant_id, agent_id)
    SELECT gen_random_uuid(), $1::uuid, $2::uuid FROM generate_series(1, $3) RETURNING id
), r AS (
    INSERT INTO runs (id, tenant_id, session_id, agent_id, input)
    SELECT gen_random_uuid(), $1::uuid, s.id, $2::uuid, '{"text": "go"}'::jsonb FROM s
    RETURNING 1
)
SELECT count(*) FROM r
"""

# The drain polls: the first unfinished row, by the partial indexes over queued and over
# running runs (hango), or the first row of a scan that is not done (the floor, whose
# schema has no index over running jobs: its scan stops at the first one).
HANGO_ANY_LEFT = """SELECT EXISTS (SELECT 1 FROM runs WHERE status = 'queued')
    OR EXISTS (SELECT 1 FROM runs WHERE status = 'running')"""
FLOOR_ANY_LEFT = "SELECT EXISTS (SELECT 1 FROM bench_jobs WHERE status <> 'done')"


class Side:
    """One system under test: how to prepare its database, start it, feed it, see it done."""

    name = ""

    def __init__(self, dsn: str, tmp: Path) -> None:
        self.dsn = dsn
        self.tmp = tmp

    async def connect(self) -> asyncpg.Connection:
        return await asyncpg.connect(self.dsn)

    async def prepare(self, conn: asyncpg.Connection) -> None: ...

    async def start(self, procs: Procs) -> None: ...

    async def started(self, conn: asyncpg.Connection, procs: Procs, n: int) -> bool:
        return await _started(procs, n)

    async def enqueue(self, conn: asyncpg.Connection, n: int) -> None: ...

    async def any_left(self, conn: asyncpg.Connection) -> bool:
        """Is a job still queued or running? Asked every 10 ms while a burst drains, so
        each side answers with its first such row found, never by counting the table."""
        raise NotImplementedError


class Hango(Side):
    name = "hango-worker"
    tools: list[str] = []

    async def connect(self) -> asyncpg.Connection:
        return await db.connect(self.dsn)  # with the product's JSON codecs

    async def prepare(self, conn: asyncpg.Connection) -> None:
        self.agent_id = await repo.create_agent(
            conn,  # type: ignore[arg-type]
            tenant_id=repo.DEFAULT_TENANT_ID,
            name=AGENT,
            model="scripted",
            system=[],
            tools=self.tools,
            config={},
        )
        self.script = self.tmp / "one-turn.json"
        self.script.write_text(json.dumps(ONE_TURN))

    async def start(self, procs: Procs) -> None:
        await procs.start(HANGO_RUN, hango_env(self.dsn, self.script))

    async def started(self, conn: asyncpg.Connection, procs: Procs, n: int) -> bool:
        """`hango-worker run` prints nothing: count its LISTEN connections instead."""
        procs.check_alive()
        return await listeners(conn, database_name(self.dsn)) >= n

    async def enqueue(self, conn: asyncpg.Connection, n: int) -> None:
        async with conn.transaction():
            await conn.fetchval(HANGO_ENQUEUE, repo.DEFAULT_TENANT_ID, self.agent_id, n)
            await conn.execute("SELECT pg_notify('hango_runs', 'bench')")

    async def any_left(self, conn: asyncpg.Connection) -> bool:
        return bool(await conn.fetchval(HANGO_ANY_LEFT))


class Floor(Side):
    name = "asyncpg floor"

    async def prepare(self, conn: asyncpg.Connection) -> None:
        await conn.execute(FLOOR_SCHEMA)

    async def start(self, procs: Procs) -> None:
        await procs.start(["-m", "bench.workers", "floor", self.dsn])

    async def enqueue(self, conn: asyncpg.Connection, n: int) -> None:
        async with conn.transaction():
            await conn.fetchval(FLOOR_ENQUEUE, n)
            await conn.execute(f"NOTIFY {FLOOR_CHANNEL}")

    async def any_left(self, conn: asyncpg.Connection) -> bool:
        return bool(await conn.fetchval(FLOOR_ANY_LEFT))


class PgQueuer(Side):
    name = "pgqueuer"

    async def prepare(self, conn: asyncpg.Connection) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        await Queries(AsyncpgDriver(conn)).install()

    async def start(self, procs: Procs) -> None:
        await procs.start(["-m", "bench.workers", "pgq", self.dsn])

    async def enqueue(self, conn: asyncpg.Connection, n: int) -> None:
        from pgqueuer import AsyncpgDriver, Queries

        await Queries(AsyncpgDriver(conn)).enqueue(["noop"] * n, [None] * n, [0] * n)

    async def any_left(self, conn: asyncpg.Connection) -> bool:
        return bool(await conn.fetchval("SELECT EXISTS (SELECT 1 FROM pgqueuer)"))


SIDES: dict[str, type[Side]] = {"hango": Hango, "floor": Floor, "pgqueuer": PgQueuer}


async def _ready(side: Side, conn: asyncpg.Connection, procs: Procs, n: int) -> None:
    """All processes started, then a warm-up batch drained, then a moment of idleness."""
    await wait_for(lambda: side.started(conn, procs, n), 60, f"{side.name} workers to start")
    await asyncio.sleep(1.0)  # listeners up (their LISTEN follows "started")
    await side.enqueue(conn, 4 * n)
    await wait_for(lambda: _none_left(side, conn, procs), 60, f"{side.name} warm-up")
    await asyncio.sleep(0.5)


async def _started(procs: Procs, n: int) -> bool:
    procs.check_alive()
    return procs.started >= n


async def _none_left(side: Side, conn: asyncpg.Connection, procs: Procs) -> bool:
    procs.check_alive()
    return not await side.any_left(conn)


async def burst(side_key: str, dsn: str, n_procs: int, jobs: int) -> dict[str, float]:
    """Jobs per second, enqueue commit → all done, with `n_procs` idle workers."""
    tmp = Path(tempfile.mkdtemp(prefix="hango-bench-"))
    side = SIDES[side_key](dsn, tmp)
    conn = await side.connect()
    procs = Procs()
    try:
        await side.prepare(conn)
        for _ in range(n_procs):
            await side.start(procs)
        await _ready(side, conn, procs, n_procs)
        poll = [int(await conn.fetchval("SELECT pg_backend_pid()"))]  # the poll's backend
        cpu0, pg0 = cpu_seconds(procs.pids), postgres_cpu_seconds()
        await side.enqueue(conn, jobs)  # its Postgres CPU counts: the runs' own enqueue
        poll0 = cpu_seconds(poll)
        t0 = time.perf_counter()
        await wait_for(
            lambda: _none_left(side, conn, procs), 600, f"{side.name} to drain", interval=0.01
        )
        seconds = time.perf_counter() - t0
        cpu = cpu_seconds(procs.pids) - cpu0
        # Postgres CPU of the side, not of this client's own polling
        pg_cpu = postgres_cpu_seconds() - pg0 - (cpu_seconds(poll) - poll0)
    finally:
        await procs.stop()
        await conn.close()
    return {
        "per_s": jobs / seconds,
        "seconds": seconds,
        "cpu_ms_per_job": cpu * 1000 / jobs,
        "pg_cpu_ms_per_job": pg_cpu * 1000 / jobs,
    }


# -- latency ---------------------------------------------------------------------------------


async def latency(side_key: str, dsn: str, samples: int) -> dict[str, Any]:
    """Enqueue call → first model call (hango) / handler start (pgqueuer), idle workers.

    The clock starts when the enqueue call starts (its statements and commit included):
    timing its return instead would let the client's own scheduling delay make the
    latency look shorter, even negative."""
    stamps: dict[str, float] = {}
    procs = Procs(lambda _i, line: _stamp(stamps, line))
    conn = await (db.connect(dsn) if side_key == "hango" else asyncpg.connect(dsn))
    try:
        enqueue, close = await _latency_side(side_key, conn, dsn, procs)
        await wait_for(lambda: _started(procs, 1), 60, "latency worker to start")
        await asyncio.sleep(1.0)
        values = []
        for i in range(-3, samples):  # three warm-ups
            token = f"lat-{i}"
            t0 = await enqueue(token)
            await wait_for(lambda t=token: _seen(stamps, t, procs), 30, "first model call")
            if i >= 0:
                values.append((stamps[token] - t0) * 1000)
            await asyncio.sleep(random.uniform(0.05, 0.1))  # idle again
        await close()
    finally:
        await procs.stop()
        await conn.close()
    return {
        "p50_ms": percentile(values, 50),
        "p99_ms": percentile(values, 99),
        "min_ms": min(values),
        "max_ms": max(values),
        "n": len(values),
    }


def _stamp(stamps: dict[str, float], line: str) -> None:
    parts = line.split()
    if len(parts) == 3 and parts[0] == "T":
        stamps[parts[1]] = float(parts[2])


async def _seen(stamps: dict[str, float], token: str, procs: Procs) -> bool:
    procs.check_alive()
    return token in stamps


async def _latency_side(
    side_key: str, conn: asyncpg.Connection, dsn: str, procs: Procs
) -> tuple[Callable[[str], Awaitable[float]], Callable[[], Awaitable[None]]]:
    if side_key == "hango":
        await repo.create_agent(
            conn,  # type: ignore[arg-type]
            tenant_id=repo.DEFAULT_TENANT_ID,
            name=AGENT,
            model="scripted",
            system=[],
            tools=[],
            config={},
        )
        pool = await db.create_pool(dsn, min_size=1, max_size=2)
        await procs.start(["-m", "bench.workers", "hango-stamp", dsn])

        async def enqueue_hango(token: str) -> float:
            t0 = time.monotonic()
            await repo.enqueue(
                pool, tenant_id=repo.DEFAULT_TENANT_ID, agent=AGENT, input_text=token
            )
            return t0

        return enqueue_hango, pool.close
    from pgqueuer import AsyncpgDriver, Queries

    await Queries(AsyncpgDriver(conn)).install()
    await procs.start(["-m", "bench.workers", "pgq", dsn])
    queries = Queries(AsyncpgDriver(conn))

    async def enqueue_pgq(token: str) -> float:
        t0 = time.monotonic()
        await queries.enqueue("noop", token.encode())
        return t0

    async def nothing() -> None:
        return None

    return enqueue_pgq, nothing


# -- memory ----------------------------------------------------------------------------------


async def memory(dsn: str, runs: int, delay_s: float) -> dict[str, Any]:
    """RSS of one `hango-worker run` holding `runs` runs in flight (model sleeps delay_s)."""
    tmp = Path(tempfile.mkdtemp(prefix="hango-bench-"))
    side = Hango(dsn, tmp)
    side.tools = ["current_time"]
    conn = await side.connect()
    procs = Procs()
    script = [
        {"text": "Checking.", "delay_s": delay_s, "tool_calls": [{"name": "current_time"}]},
        {"text": "Done.", "delay_s": delay_s},
    ]
    try:
        await side.prepare(conn)
        side.script.write_text(json.dumps(script))
        env = hango_env(dsn, side.script, HANGO_WORKER_CONCURRENCY=str(runs))
        await procs.start(HANGO_RUN, env)
        pid = procs.pids[0]
        await wait_for(lambda: side.started(conn, procs, 1), 60, "memory worker to start")
        await side.enqueue(conn, 1)  # warm-up: every code path imported once
        await wait_for(lambda: _none_left(side, conn, procs), 60, "warm-up run")
        idle = rss_bytes(pid)
        await side.enqueue(conn, runs)
        await wait_for(lambda: _running(conn, runs), 60, f"{runs} runs in flight", 0.05)
        samples, conns = [], 0
        deadline = time.perf_counter() + delay_s * 1.5
        while time.perf_counter() < deadline and await _running(conn, runs):
            samples.append(rss_bytes(pid))
            conns = max(conns, await _backends(conn))
            await asyncio.sleep(0.1)
        await wait_for(lambda: _none_left(side, conn, procs), 120, "memory runs to finish")
        after = rss_bytes(pid)
    finally:
        await procs.stop()
        await conn.close()
    peak = max(samples) if samples else 0
    pool_size = getattr(service, "pool_size", None)  # absent before commit 6347935
    return {
        "runs": runs,
        "idle_mib": idle / 2**20,
        "in_flight_mib": peak / 2**20,
        "after_mib": after / 2**20,
        "per_run_kib": (peak - idle) / 1024 / runs,
        "pg_connections": conns,
        "samples": len(samples),
        "concurrency_setting": runs,
        "pool_max_size": pool_size(runs) if pool_size else None,
    }


async def _running(conn: asyncpg.Connection, n: int) -> bool:
    return int(await conn.fetchval("SELECT count(*) FROM runs WHERE status = 'running'")) >= n


async def _backends(conn: asyncpg.Connection) -> int:
    """Connections the worker holds to this database (excluding ours)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()"
        )
    )


def summarize_bursts(results: list[dict[str, float]]) -> dict[str, Any]:
    return {
        "per_s": summarize([r["per_s"] for r in results]),
        "seconds": summarize([r["seconds"] for r in results]),
        "cpu_ms_per_job": summarize([r["cpu_ms_per_job"] for r in results]),
        "pg_cpu_ms_per_job": summarize([r["pg_cpu_ms_per_job"] for r in results]),
    }
