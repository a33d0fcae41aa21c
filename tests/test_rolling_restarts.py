"""Rolling restarts during one busy run: at each, a tool call is in flight when the
worker is told to stop. The stopping worker lets the call finish, hands the run back at
the turn boundary, and the next worker resumes it. The run succeeds with no lease lost,
no call cut off or run twice, and one attempt that counts: `attempt - handed_back`
(docs/operations.md, "Crashes, deploys and what happens to runs")."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import asyncpg

from hango_worker.testing.chaos_tools import ensure_table, gated_script
from tests.procs import (
    executed_after_recorded,
    start_worker,
    stderr_of,
    stop_worker,
    wait_all_finished,
    wait_exit,
    wait_listening,
    worker_env,
)
from tests.worker_helpers import enqueue, make_agent

RESTARTS = 10
TURNS = 2 * RESTARTS + 2  # a restart every other turn


async def _until_file(path: Path, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while not await asyncio.to_thread(path.exists):
            await asyncio.sleep(0.02)


async def _until_logged(proc: asyncio.subprocess.Process, line: str, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while line not in stderr_of(proc):
            await asyncio.sleep(0.02)


async def test_ten_rolling_restarts_leave_one_attempt_and_nothing_lost(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    await ensure_table(pool)
    gates = tmp_path / "gates"
    gates.mkdir()
    script = tmp_path / "script.json"
    script.write_text(json.dumps(gated_script(TURNS, gates)))
    await make_agent(pool, tools=["gate"])
    run_id = await enqueue(pool, "pass the gates")
    env = worker_env(dsn, script, HANGO_WORKER_CONCURRENCY="1", HANGO_LOG_LEVEL="INFO")
    old = await start_worker(env, logs=True)
    started = [old]  # every process, stopped at the end even when a step fails
    try:
        for k in range(RESTARTS):
            n = 2 * k + 1
            (gates / f"go-{n - 1}").touch()
            await _until_file(gates / f"started-{n}")  # call n is in flight on `old`
            new = await start_worker(env, logs=True)
            started.append(new)
            await wait_listening(pool, 2)
            old.send_signal(signal.SIGTERM)
            await _until_logged(old, "shutdown requested")
            (gates / f"go-{n}").touch()  # the call finishes within the grace
            assert await wait_exit(old) == 0, stderr_of(old)
            old = new
        for n in range(2 * RESTARTS, TURNS):
            (gates / f"go-{n}").touch()
        (row,) = await wait_all_finished(pool, [run_id], timeout=120)
    finally:
        await asyncio.gather(*(stop_worker(p) for p in started))
    run = await pool.fetchrow(
        "SELECT attempt, handed_back, lost_count, limit_reached FROM runs WHERE id = $1", run_id
    )
    assert (row["status"], run["limit_reached"]) == ("succeeded", None), stderr_of(old)
    assert run["lost_count"] == 0
    assert run["handed_back"] == RESTARTS
    assert run["attempt"] - run["handed_back"] == 1
    results = await pool.fetch(
        "SELECT result->>'content' AS text FROM tool_calls WHERE run_id = $1", run_id
    )
    assert sorted(r["text"] for r in results) == sorted(f"gate {n} passed" for n in range(TURNS))
    assert await executed_after_recorded(pool) == 0  # no call ran twice
