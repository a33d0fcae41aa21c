"""Shared pieces: statistics, the Postgres server and databases, machine facts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from hango_worker.store import migrate

ROOT = Path(__file__).resolve().parent.parent

# Postgres settings reported next to every number (and checked: fsync and
# synchronous_commit must be on, or the comparison is not about durable work).
PG_SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "full_page_writes",
    "wal_sync_method",
    "shared_buffers",
    "max_connections",
    "data_checksums",
)

ALTERNATIVES = (
    "langchain",
    "langchain-core",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-postgres",
    "psycopg",
    "pgqueuer",
)


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark is. `full` is what `make bench` runs."""

    name: str
    turns: int  # per-turn benchmark: tool-calling turns per run
    reps: int  # repetitions of each side, alternating
    async_reps: int  # LangChain's default (async) durability: noted, fewer repetitions
    jobs: int  # throughput: runs / jobs per repetition
    procs: tuple[int, ...]  # throughput: worker processes
    latency_samples: int
    chain_calls: int  # chain overhead: turns timed per configuration and repetition
    chain_reps: int
    memory_runs: int
    memory_delay_s: float
    # per-turn variants to run (`--variants`); empty: all of them
    per_turn_variants: tuple[str, ...] = ()
    # per-turn `hango+attachment`: the bytes of the PDF its run input carries
    attachment_bytes: int = 5_000_000


FULL = Sizes("full", 500, 5, 2, 3000, (1, 2), 300, 200, 5, 200, 6.0)
QUICK = Sizes("quick", 100, 2, 1, 500, (1, 2), 60, 100, 3, 200, 4.0)
SMOKE = Sizes("smoke", 5, 1, 1, 5, (1,), 3, 5, 1, 5, 1.0, attachment_bytes=50_000)
SIZES = {s.name: s for s in (FULL, QUICK, SMOKE)}

# Turn windows reported for the per-turn benchmark (1-based, inclusive).
WINDOWS = ((1, 10), (91, 100), (491, 500))


def windows_for(turns: int) -> list[tuple[int, int]]:
    """The standard windows that fit in `turns` (smaller runs: first and last 10%)."""
    fit = [w for w in WINDOWS if w[1] <= turns]
    if len(fit) >= 2:
        return fit
    k = max(1, turns // 10)
    return [(1, k), (turns - k + 1, turns)]


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median and min-max (what every table prints)."""
    vals = [float(v) for v in values]
    if not vals:
        return {"median": 0.0, "min": 0.0, "max": 0.0, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def percentile(values: Sequence[float], p: float) -> float:
    vals = sorted(values)
    if not vals:
        return 0.0
    k = (len(vals) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


DASH = "\u2013"


def fmt(s: dict[str, float], unit: str = "", digits: int = 2) -> str:
    return f"{s['median']:.{digits}f}{unit} ({s['min']:.{digits}f}{DASH}{s['max']:.{digits}f})"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- Postgres -------------------------------------------------------------------------------


def with_database(dsn: str, name: str) -> str:
    p = urlsplit(dsn)
    return urlunsplit((p.scheme, p.netloc, "/" + name, p.query, p.fragment))


# The postmaster of the benchmark's own server: its CPU (and its backends') is the
# server-side cost. Other Postgres servers on the machine are not counted.
_postmaster_pid: int | None = None


def start_server(data_dir: str) -> tuple[Any, str]:
    """The embedded Postgres 18, its settings as they come (durable defaults,
    max_connections included: a worker's pool no longer grows with its runs)."""
    from hango_worker.store import embedded

    global _postmaster_pid
    server, dsn = embedded.start(data_dir)
    _postmaster_pid = server.get_pid()
    return server, dsn


async def pg_settings(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {s: str(await conn.fetchval(f"SHOW {s}")) for s in PG_SETTINGS}
    finally:
        await conn.close()


def check_durable(settings: dict[str, str]) -> None:
    if settings.get("fsync") != "on" or settings.get("synchronous_commit") != "on":
        raise SystemExit(
            f"refusing to benchmark a non-durable Postgres: fsync={settings.get('fsync')} "
            f"synchronous_commit={settings.get('synchronous_commit')}"
        )


async def create_database(admin_dsn: str, prefix: str, *, migrated: bool) -> str:
    """A new database on the one server; migrated (hango schema + tenant) or empty."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    dsn = with_database(admin_dsn, name)
    if migrated:
        await migrate.upgrade_and_seed(dsn)
    return dsn


async def drop_database(admin_dsn: str, dsn: str) -> None:
    name = urlsplit(dsn).path.lstrip("/")
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def relation_bytes(conn: asyncpg.Connection, tables: Sequence[str]) -> int:
    """pg_total_relation_size (heap + TOAST + indexes) summed over `tables`."""
    total = 0
    for t in tables:
        v = await conn.fetchval("SELECT pg_total_relation_size(to_regclass($1))", t)
        total += int(v or 0)
    return total


async def live_bytes(conn: asyncpg.Connection, tables: Sequence[str]) -> int:
    """Bytes of the live rows (pg_column_size of each row), without dead versions or indexes."""
    total = 0
    for t in tables:
        if await conn.fetchval("SELECT to_regclass($1)", t) is None:
            continue
        v = await conn.fetchval(f"SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM {t} t")
        total += int(v or 0)
    return total


def postgres_cpu_seconds() -> float:
    """User + system CPU of the benchmark's Postgres server: its postmaster, the backends
    alive now, and (in the postmaster's children times) the backends that have exited.
    Before the server is known: every `postgres` process on this machine."""
    try:
        import psutil
    except ImportError:
        return 0.0
    if _postmaster_pid is not None:
        pm = psutil.Process(_postmaster_pid)
        t = pm.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in pm.children():
            with contextlib.suppress(psutil.Error):  # exited meanwhile: in children times
                c = child.cpu_times()
                total += c.user + c.system
        return total
    total = 0.0
    for p in psutil.process_iter(["name", "cpu_times"]):
        if p.info["name"] == "postgres" and p.info["cpu_times"] is not None:
            total += p.info["cpu_times"].user + p.info["cpu_times"].system
    return total


def window_key(key: str) -> int:
    """Sort "491-500" after "91-100" (and "turns 451-500" likewise)."""
    digits = "".join(ch if ch.isdigit() else " " for ch in key).split()
    return int(digits[0]) if digits else 0


async def wait_for(
    check: Callable[[], Awaitable[bool]], limit_s: float, what: str, interval: float = 0.02
) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + limit_s
    while not await check():
        if loop.time() > until:
            raise TimeoutError(f"timed out after {limit_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


async def listeners(conn: asyncpg.Connection, database: str, channel_like: str = "%") -> int:
    """Backends of `database` that are idle after a LISTEN (a worker waiting for work)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
            "AND query ILIKE 'LISTEN%' AND query ILIKE $2",
            database,
            channel_like,
        )
    )


def database_name(dsn: str) -> str:
    return urlsplit(dsn).path.lstrip("/")


# -- machine and versions -------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    ram = 0
    try:
        with open("/proc/meminfo") as f:
            ram = int(f.readline().split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count() or 0,
        "ram_gib": round(ram / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": sys.version.split()[0],
    }


def versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("hango-worker", "asyncpg", "opentelemetry-sdk", *ALTERNATIVES):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    out["git"] = git_commit()
    return out


def git_commit() -> str:
    """HEAD's short id, "+dirty" when hango_worker/ has uncommitted changes (measured too)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, check=False, cwd=ROOT
        ).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "hango_worker")
    except OSError:
        return "unknown"
    return head + ("+dirty" if dirty else "") if head else "unknown"


def have(module: str) -> bool:
    """True when an optional module (an alternative) can be imported."""
    import importlib.util

    return importlib.util.find_spec(module) is not None
