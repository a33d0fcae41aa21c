"""`make chaos`: workers killed with SIGKILL every ~2 s while runs are in flight.

3 worker processes, 300 runs of 6 tool-calling turns on a fresh embedded
Postgres (or HANGO_DATABASE_URL); one worker is killed every 1-3 s and a new
one started. Prints runs finished, runs lost, tool calls executed twice,
stale writes after takeover and the wall time; exits 1 if any is non-zero.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from hango_worker.store import db, embedded, migrate, repo
from hango_worker.testing.chaos_tools import ensure_table, script

CHECKS = {
    "tool calls executed twice": (
        "SELECT count(*) FROM chaos_exec e JOIN tool_calls t ON t.run_id = e.run_id "
        "AND t.tool_use_id = e.tool_use_id WHERE e.started_at > t.created_at"
    ),
    "stale writes after takeover": (
        "SELECT count(*) FROM run_events old JOIN run_events new ON new.run_id = old.run_id "
        "AND new.type = 'run_started' AND new.attempt > old.attempt "
        "WHERE old.created_at > new.created_at"
    ),
    "attempts run by two workers": (
        "SELECT count(*) FROM (SELECT run_id, attempt FROM run_events GROUP BY 1, 2 "
        "HAVING count(DISTINCT worker_id) > 1) x"
    ),
}


def _env(dsn: str, script_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HANGO_DATABASE_URL": dsn,
        "HANGO_MODEL_PROVIDER": "scripted",
        "HANGO_SCRIPT": str(script_path),
        "HANGO_LEASE_S": "3",
        "HANGO_MAX_ATTEMPTS": "100",
        "HANGO_TOOL_MODULES": "hango_worker.testing.chaos_tools:TOOLS",
        "HANGO_WORKER_CONCURRENCY": "8",
        "HANGO_POLL_INTERVAL_S": "0.5",
        "HANGO_METRICS_PORT": "0",
        "HANGO_LOG_LEVEL": "ERROR",
    }


async def _spawn(env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hango_worker.cli",
        "run",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _prepare(
    pool: asyncpg.Pool, runs: int, turns: int, tmp: Path, sleep_s: float
) -> tuple[Path, list[str]]:
    await repo.ensure_default_tenant(pool)
    await ensure_table(pool)
    path = tmp / "script.json"
    path.write_text(json.dumps(script(turns, "step", sleep_s)))
    await repo.create_agent(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        name="chaos",
        model="chaos",
        system=[],
        tools=["step"],
        config={},
    )
    ids = [
        (
            await repo.enqueue(
                pool, tenant_id=repo.DEFAULT_TENANT_ID, agent="chaos", input_text=f"chaos {i}"
            )
        )["run_id"]
        for i in range(runs)
    ]
    return path, ids


async def _storm(pool: asyncpg.Pool, env: dict[str, str], workers: int, deadline: float) -> int:
    procs = [await _spawn(env) for _ in range(workers)]
    kills = 0
    try:
        while time.monotonic() < deadline:
            left = await pool.fetchval(
                "SELECT count(*) FROM runs WHERE status IN ('queued', 'running')"
            )
            if left == 0:
                break
            await asyncio.sleep(random.uniform(1.0, 3.0))
            victim = procs.pop(random.randrange(len(procs)))
            victim.kill()
            await victim.wait()
            kills += 1
            procs.append(await _spawn(env))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            await p.wait()
    return kills


async def chaos(
    dsn: str, runs: int, turns: int, workers: int, limit_s: float, sleep_s: float = 0.5
) -> dict[str, Any]:
    await migrate.upgrade(dsn, "head")
    pool = await db.create_pool(dsn, min_size=1, max_size=4)
    tmp = Path(tempfile.mkdtemp(prefix="hango-chaos-"))
    try:
        path, ids = await _prepare(pool, runs, turns, tmp, sleep_s)
        started = time.monotonic()
        kills = await _storm(pool, _env(dsn, path), workers, started + limit_s)
        wall = time.monotonic() - started
        rows = await pool.fetch("SELECT status, count(*) AS n FROM runs GROUP BY 1")
        by_status = {r["status"]: r["n"] for r in rows}
        report: dict[str, Any] = {
            "runs": len(ids),
            "turns per run": turns,
            "workers": workers,
            "kills": kills,
            "runs finished": by_status.get("succeeded", 0),
            "runs lost": len(ids) - by_status.get("succeeded", 0),
            "wall time s": round(wall, 1),
        }
        for name, query in CHECKS.items():
            report[name] = int(await pool.fetchval(query))
        return report
    finally:
        await pool.close()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hango-chaos", description=__doc__)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--limit-s", type=float, default=900)
    ap.add_argument("--tool-sleep-s", type=float, default=0.5, help="max sleep per tool call")
    a = ap.parse_args(argv)
    server = None
    dsn = os.environ.get("HANGO_DATABASE_URL")
    root = tempfile.mkdtemp(prefix="hango-chaos-pg-")
    if not dsn:
        server, dsn = embedded.start(root)
    try:
        report = asyncio.run(chaos(dsn, a.runs, a.turns, a.workers, a.limit_s, a.tool_sleep_s))
    finally:
        if server is not None:
            embedded.stop(server)
        shutil.rmtree(root, ignore_errors=True)
    for k, v in report.items():
        print(f"{k:>30}: {v}")
    bad = report["runs lost"] + sum(report[k] for k in CHECKS)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
