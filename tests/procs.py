"""Worker processes for crash tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

from hango_worker.testing.chaos_tools import ensure_table, script
from tests.worker_helpers import enqueue, make_agent


def worker_env(dsn: str, script_path: Path, **over: str) -> dict[str, str]:
    env = {
        **os.environ,
        "HANGO_DATABASE_URL": dsn,
        "HANGO_MODEL_PROVIDER": "scripted",
        "HANGO_SCRIPT": str(script_path),
        "HANGO_TOOL_MODULES": "hango_worker.testing.chaos_tools:TOOLS",
        "HANGO_LEASE_S": "2",
        "HANGO_POLL_INTERVAL_S": "0.2",
        "HANGO_MAX_ATTEMPTS": "50",
        "HANGO_WORKER_CONCURRENCY": "4",
        "HANGO_METRICS_PORT": "0",
        "HANGO_LOG_LEVEL": "WARNING",
        "HANGO_SHUTDOWN_GRACE_S": "10",
    }
    env.update(over)
    return env


# The longest a test waits for a worker process to exit once told to (its shutdown is
# bounded by HANGO_SHUTDOWN_GRACE_S plus run/worker.py STOP_BOUND_S; this is a backstop
# that turns a worker that never exits into a failure naming it, not a hung suite).
PROC_WAIT_S = 60.0
_STDERR: dict[int, tempfile._TemporaryFileWrapper[bytes]] = {}
# every worker process a test started: what is still running when the test ends is
# killed (`reap_workers`, conftest.py), so a test that fails half-way leaves none behind
_STARTED: list[asyncio.subprocess.Process] = []


async def start_worker(
    env: dict[str, str],
    *,
    until_idle: bool = False,
    cwd: Path | None = None,
    logs: bool = False,
) -> asyncio.subprocess.Process:
    """`hango-worker run` as a process. Its stderr goes to a file (`stderr_of`): a pipe
    nobody reads fills up and blocks the worker on its next write. `logs`: its log
    lines (stdout) go to that file too."""
    args = ["-m", "hango_worker.cli", "run"] + (["--until-idle"] if until_idle else [])
    err = tempfile.NamedTemporaryFile(prefix="hango-worker-stderr-")  # noqa: SIM115 - kept open
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        env=env,
        cwd=cwd,
        stdout=err if logs else asyncio.subprocess.DEVNULL,
        stderr=err,
    )
    _STDERR[proc.pid] = err
    _STARTED.append(proc)
    return proc


async def reap_workers() -> list[int]:
    """Kill the worker processes still running (a test that failed before stopping
    them); their pids."""
    left = [p for p in _STARTED if p.returncode is None]
    _STARTED.clear()
    for p in left:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    await asyncio.gather(*(wait_exit(p, 10) for p in left), return_exceptions=True)
    return [p.pid for p in left]


def stderr_of(proc: asyncio.subprocess.Process) -> str:
    err = _STDERR.get(proc.pid)
    if err is None:
        return ""
    with open(err.name, "rb") as f:
        return f.read().decode(errors="replace")[-4000:]


async def wait_exit(proc: asyncio.subprocess.Process, timeout: float = PROC_WAIT_S) -> int:
    """The exit code, within `timeout`; a process still alive then is killed and the test
    fails naming it, with the end of its stderr."""
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.wait_for(proc.wait(), 10)
        raise AssertionError(
            f"worker process {proc.pid} did not exit within {timeout:g}s; its stderr:\n"
            + stderr_of(proc)
        ) from None


async def stop_worker(
    proc: asyncio.subprocess.Process,
    sig: signal.Signals = signal.SIGTERM,
    timeout: float = PROC_WAIT_S,
) -> int:
    """Send `sig` (if it still runs) and wait for it to exit, bounded (`wait_exit`)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
    return await wait_exit(proc, timeout)


async def kill_worker(proc: asyncio.subprocess.Process) -> int:
    return await stop_worker(proc, signal.SIGKILL, 10)


async def setup_runs(
    pool: asyncpg.Pool, tmp: Path, n: int, turns: int, tool: str = "step", max_sleep_s: float = 0.05
) -> tuple[Path, list[str]]:
    await ensure_table(pool)
    path = tmp / "script.json"
    path.write_text(json.dumps(script(turns, tool, max_sleep_s)))
    await make_agent(pool, tools=[tool, "pause"])
    ids = [await enqueue(pool, "do the steps") for _ in range(n)]
    return path, ids


async def wait_listening(pool: asyncpg.Pool, n: int, timeout: float = PROC_WAIT_S) -> None:
    """Until `n` workers listen for new runs (each one's LISTEN connection): started
    processes are ready at different moments, most of all on a busy machine."""
    async with asyncio.timeout(timeout):
        while (
            await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN %'"
            )
            < n
        ):
            await asyncio.sleep(0.05)


async def wait_all_finished(pool: asyncpg.Pool, ids: list[str], timeout: float) -> list[Any]:
    async with asyncio.timeout(timeout):
        while True:
            rows = await pool.fetch(
                "SELECT id::text, status FROM runs WHERE id = ANY($1::uuid[])", ids
            )
            if all(r["status"] in ("succeeded", "failed", "cancelled") for r in rows):
                return rows
            await asyncio.sleep(0.2)


async def transcript(pool: asyncpg.Pool, run_id: str) -> list[Any]:
    rows = await pool.fetch(
        "SELECT m.role, m.content FROM messages m JOIN runs r ON r.session_id = m.session_id "
        "WHERE r.id = $1 ORDER BY m.seq",
        run_id,
    )
    return [(r["role"], r["content"]) for r in rows]


async def executed_after_recorded(pool: asyncpg.Pool) -> int:
    """Real executions that started after the call's result was already recorded."""
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM chaos_exec e JOIN tool_calls t "
            "ON t.run_id = e.run_id AND t.tool_use_id = e.tool_use_id WHERE e.started_at > t.created_at"
        )
    )


async def attempts_shared_by_workers(pool: asyncpg.Pool) -> int:
    return int(
        await pool.fetchval(
            "SELECT count(*) FROM (SELECT run_id, attempt FROM run_events GROUP BY 1, 2 "
            "HAVING count(DISTINCT worker_id) > 1) x"
        )
    )
