"""Durable runs under fire: kill -9, SIGSTOP past the lease, SIGTERM hand-off."""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import asyncpg

from tests.procs import (
    attempts_shared_by_workers,
    executed_after_recorded,
    kill_worker,
    setup_runs,
    start_worker,
    stderr_of,
    stop_worker,
    transcript,
    wait_all_finished,
    wait_exit,
    worker_env,
)
from tests.worker_helpers import enqueue


async def test_kill_9_loses_nothing_and_never_reruns_a_completed_call(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    path, ids = await setup_runs(pool, tmp_path, n=1, turns=6)
    env = worker_env(dsn, path)
    ref = await start_worker(env, until_idle=True)
    assert await wait_exit(ref) == 0, stderr_of(ref)
    reference = await transcript(pool, ids[0])
    assert len(reference) == 14
    ids = [await enqueue(pool, "do the steps") for _ in range(24)]
    rng = random.Random(7)
    workers = [await start_worker(env) for _ in range(2)]
    kills = 0
    try:
        for _ in range(6):
            await asyncio.sleep(rng.uniform(0.3, 0.9))
            victim = workers.pop(rng.randrange(len(workers)))
            await kill_worker(victim)
            kills += 1
            workers.append(await start_worker(env))
        rows = await wait_all_finished(pool, ids, timeout=120)
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            await wait_exit(w)
    assert {r["status"] for r in rows} == {"succeeded"}
    for run_id in ids:
        assert await transcript(pool, run_id) == reference, run_id
    assert await executed_after_recorded(pool) == 0
    assert await attempts_shared_by_workers(pool) == 0
    resumed = await pool.fetchval(
        "SELECT count(*) FROM runs WHERE id = ANY($1::uuid[]) AND attempt > 1", ids
    )
    print(f"\nkill -9: {kills} kills, {resumed} of {len(ids)} runs resumed on another worker")


async def test_a_paused_worker_writes_nothing_after_takeover(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    path, ids = await setup_runs(pool, tmp_path, n=1, turns=3, tool="pause")
    (run_id,) = ids
    env = worker_env(dsn, path)
    a = await start_worker(env)
    try:
        async with asyncio.timeout(30):  # until A is inside its first tool call
            while not await pool.fetchval("SELECT count(*) FROM chaos_exec"):
                await asyncio.sleep(0.05)
        a.send_signal(signal.SIGSTOP)
        owner_a = await pool.fetchval("SELECT lease_owner FROM runs WHERE id = $1", run_id)
        snapshot = await _rows_by(pool, run_id, owner_a)
        assert [m[1] for m in snapshot[2]] == ["user", "assistant"]  # A's first turn
        b = await start_worker(env, until_idle=False)
        try:
            await wait_all_finished(pool, ids, timeout=60)
            a.send_signal(signal.SIGCONT)
            await asyncio.sleep(3)  # A wakes, finishes its tool, tries to write
            assert await _rows_by(pool, run_id, owner_a) == snapshot
            run = await pool.fetchrow(
                "SELECT status, attempt, lease_owner FROM runs WHERE id = $1", run_id
            )
            assert run["status"] == "succeeded" and run["attempt"] == 2
            assert await attempts_shared_by_workers(pool) == 0
        finally:
            await stop_worker(b)
    finally:
        a.send_signal(signal.SIGCONT)
        await stop_worker(a)


async def _rows_by(pool: asyncpg.Pool, run_id: str, worker: str) -> list[object]:
    events = await pool.fetch(
        "SELECT seq, type FROM run_events WHERE run_id = $1 AND worker_id = $2 ORDER BY seq",
        run_id,
        worker,
    )
    tools = await pool.fetch(
        "SELECT tool_use_id FROM tool_calls WHERE run_id = $1 AND attempt = 1 ORDER BY 1", run_id
    )
    # messages have no worker column: a checkpoint writes its messages and its events in
    # one statement, so they share the transaction's created_at — A's messages are the
    # ones written at the time of one of A's events
    msgs = await pool.fetch(
        "SELECT seq, role, content::text FROM messages WHERE run_id = $1 AND created_at IN "
        "(SELECT created_at FROM run_events WHERE run_id = $1 AND worker_id = $2) ORDER BY seq",
        run_id,
        worker,
    )
    return [list(map(tuple, events)), list(map(tuple, tools)), list(map(tuple, msgs))]


async def test_sigterm_hands_runs_back_and_another_worker_finishes_them(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    path, ids = await setup_runs(pool, tmp_path, n=4, turns=4, max_sleep_s=0.3)
    env = worker_env(dsn, path, HANGO_LEASE_S="30")
    a = await start_worker(env)
    async with asyncio.timeout(30):
        while await pool.fetchval("SELECT count(*) FROM chaos_exec") < 4:
            await asyncio.sleep(0.05)
    assert await stop_worker(a) == 0, stderr_of(a)
    rows = await pool.fetch("SELECT status, lease_owner FROM runs WHERE id = ANY($1::uuid[])", ids)
    assert {r["status"] for r in rows} <= {"queued", "succeeded"}
    assert "queued" in {r["status"] for r in rows}, "runs in flight are handed back"
    assert all(r["lease_owner"] is None for r in rows)
    b = await start_worker(env, until_idle=True)
    assert await wait_exit(b) == 0, stderr_of(b)
    rows = await wait_all_finished(pool, ids, timeout=5)
    assert {r["status"] for r in rows} == {"succeeded"}
    assert await executed_after_recorded(pool) == 0
    dup = await pool.fetchval(
        "SELECT count(*) FROM (SELECT tool_use_id FROM chaos_exec GROUP BY run_id, tool_use_id "
        "HAVING count(*) > 1) x"
    )
    assert dup == 0, "a graceful hand-off never runs a tool twice"
    assert await attempts_shared_by_workers(pool) == 0
