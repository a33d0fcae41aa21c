"""200 queued runs, two worker processes: every run succeeds, each claimed exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

import asyncpg

from tests.worker_helpers import enqueue, make_agent

RUNS = 200


async def test_two_worker_processes_drain_the_queue_exactly_once(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {
                    "text": "Adding.",
                    "tool_calls": [{"name": "calculator", "input": {"expression": "2+2"}}],
                    "delay_s": 0.05,
                },
                {"text": "It is 4.", "delay_s": 0.05},
            ]
        )
    )
    await make_agent(pool, tools=["calculator"])
    run_ids = [await enqueue(pool, f"run {i}") for i in range(RUNS)]
    env = {
        **os.environ,
        "HANGO_DATABASE_URL": dsn,
        "HANGO_MODEL_PROVIDER": "scripted",
        "HANGO_SCRIPT": str(script),
        "HANGO_WORKER_CONCURRENCY": "8",
        "HANGO_POLL_INTERVAL_S": "0.2",
        "HANGO_METRICS_PORT": "0",
        "HANGO_LOG_LEVEL": "WARNING",
    }
    started = time.perf_counter()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "hango_worker.cli",
            "run",
            "--until-idle",
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), timeout=240)
    elapsed = time.perf_counter() - started
    for p, (_out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err.decode()[-2000:]
    rows = await pool.fetch("SELECT id::text, status, attempt FROM runs")
    assert {r["status"] for r in rows} == {"succeeded"}
    assert {r["id"] for r in rows} == set(run_ids)
    assert {r["attempt"] for r in rows} == {1}
    claims = await pool.fetch(
        "SELECT run_id, count(*) AS n, count(DISTINCT worker_id) AS w FROM run_events "
        "WHERE type = 'run_started' GROUP BY run_id"
    )
    assert len(claims) == RUNS and all(r["n"] == 1 and r["w"] == 1 for r in claims)
    per_worker = await pool.fetch(
        "SELECT worker_id, count(*) AS n FROM run_events WHERE type = 'run_started' GROUP BY 1"
    )
    # each run waits 0.1 s on its model: one process alone would need ~2.5 s, far longer
    # than the other takes to start, so both must have taken a share
    assert len(per_worker) == 2, "both processes should have taken a share"
    stats = [json.loads(err.decode().strip().splitlines()[-1]) for _, err in outs]
    assert sum(s["claimed"] for s in stats) == RUNS
    print(
        f"\nqueue test: {RUNS} runs by 2 worker processes in {elapsed:.2f}s "
        f"= {RUNS / elapsed:.0f} runs/s (including process start-up)"
    )
