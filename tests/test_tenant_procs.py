"""max_running across the fleet: three worker processes drain a limited tenant's runs
and never run more than its limit at once; another tenant's runs are unaffected."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg

from tests.procs import start_worker, stop_worker, wait_all_finished, wait_listening, worker_env
from tests.tenant_helpers import bulk_enqueue, tenant_with_agent

LIMITED_RUNS = 50
FREE_RUNS = 30


async def _sample(pool: asyncpg.Pool, tenant: str, stop: asyncio.Event) -> list[int]:
    seen: list[int] = []
    while not stop.is_set():
        seen.append(
            await pool.fetchval(
                "SELECT count(*) FROM runs WHERE tenant_id = $1 AND status = 'running'", tenant
            )
        )
        await asyncio.sleep(0.003)
    return seen


async def test_three_workers_never_run_more_than_a_tenants_max_running(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "done", "delay_s": 0.2}]))
    limited = await tenant_with_agent(pool, "limited", max_running=2)
    free = await tenant_with_agent(pool, "free")
    env = worker_env(dsn, script, HANGO_WORKER_CONCURRENCY="4", HANGO_POLL_INTERVAL_S="0.05")
    procs = [await start_worker(env) for _ in range(3)]
    stop = asyncio.Event()
    sampling = None
    try:
        # all three ready before the work arrives: on a busy machine the first one up
        # could otherwise drain the limited tenant alone before the others start
        await wait_listening(pool, 3)
        await bulk_enqueue(pool, limited, LIMITED_RUNS)
        await bulk_enqueue(pool, free, FREE_RUNS)
        ids = [r["id"] for r in await pool.fetch("SELECT id::text FROM runs")]
        sampling = asyncio.gather(_sample(pool, limited, stop), _sample(pool, free, stop))
        rows = await wait_all_finished(pool, ids, timeout=120)
    finally:
        stop.set()
        await asyncio.gather(*(stop_worker(p) for p in procs))
    assert sampling is not None
    seen_limited, seen_free = await sampling
    assert {r["status"] for r in rows} == {"succeeded"}
    print(f"max running: limited {max(seen_limited)} (of 2), free {max(seen_free)}")
    assert max(seen_limited) == 2, "the limit was exceeded, or never reached"
    assert max(seen_free) > 2, "the other tenant must not be held to the limit"
    workers = await pool.fetchval(
        "SELECT count(DISTINCT e.worker_id) FROM run_events e JOIN runs r ON r.id = e.run_id "
        "WHERE r.tenant_id = $1 AND e.type = 'run_started'",
        limited,
    )
    # Which worker claims a run is not promised: the worker that just finished one is
    # often first to claim the next, and once one worker took every limited run (seen
    # on an idle machine). The count is printed, not asserted; the fleet-wide bound is
    # the sampled maximum above. Making the spread deterministic is an open task.
    print(f"limited tenant's runs started by {workers} worker(s)")


async def test_the_limit_is_fleet_wide_between_workers_that_run_one_run_each(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    """Each worker runs one run at a time: two of the tenant's runs running at once are on
    two workers, and the third worker, free, is held back by the fleet-wide count alone
    (a limit kept per worker would let all three run)."""
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "done", "delay_s": 0.3}]))
    limited = await tenant_with_agent(pool, "limited", max_running=2)
    env = worker_env(dsn, script, HANGO_WORKER_CONCURRENCY="1", HANGO_POLL_INTERVAL_S="0.05")
    procs = [await start_worker(env) for _ in range(3)]
    stop = asyncio.Event()
    sampling = None
    try:
        await wait_listening(pool, 3)
        await bulk_enqueue(pool, limited, 9)
        ids = [r["id"] for r in await pool.fetch("SELECT id::text FROM runs")]
        sampling = asyncio.ensure_future(_sample(pool, limited, stop))
        rows = await wait_all_finished(pool, ids, timeout=120)
    finally:
        stop.set()
        await asyncio.gather(*(stop_worker(p) for p in procs))
    assert sampling is not None
    seen = await sampling
    assert {r["status"] for r in rows} == {"succeeded"}
    assert max(seen) == 2, "the limit was exceeded, or never reached"
    workers = await pool.fetchval(
        "SELECT count(DISTINCT worker_id) FROM run_events WHERE type = 'run_started'"
    )
    assert workers >= 2  # two at once, one run per worker
