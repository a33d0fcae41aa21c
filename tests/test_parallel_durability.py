"""kill -9 in the middle of a parallel tool batch (docs/design.md §5.5): the calls
that had finished are recorded and never run again; the others run on resume; the
model gets every result, in call order."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import asyncpg

from hango_worker.testing.chaos_tools import ensure_table
from tests.procs import (
    kill_worker,
    start_worker,
    stop_worker,
    transcript,
    wait_all_finished,
    worker_env,
)
from tests.worker_helpers import enqueue, make_agent

SCRIPT = [
    {
        "text": "Three at once.",
        "tool_calls": [
            {"name": "pause", "input": {"seconds": 0.05}},  # finishes before the kill
            {"name": "pause", "input": {"seconds": 1.5}},
            {"name": "pause", "input": {"seconds": 1.5}},  # identical: a repeat, counted once
        ],
    },
    {"text": "All done."},
]


async def _executions(pool: asyncpg.Pool, run_id: str) -> dict[str, int]:
    rows = await pool.fetch(
        "SELECT tool_use_id, count(*) AS n FROM chaos_exec WHERE run_id = $1 GROUP BY 1", run_id
    )
    return {r["tool_use_id"]: int(r["n"]) for r in rows}


async def _recorded(pool: asyncpg.Pool, run_id: str) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM tool_calls WHERE run_id = $1", run_id))


async def test_kill_9_mid_parallel_batch_reruns_only_the_unfinished_calls(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    await ensure_table(pool)
    path = tmp_path / "script.json"
    path.write_text(json.dumps(SCRIPT))
    await make_agent(pool, tools=["pause"])
    run_id = await enqueue(pool, "three pauses")
    env = worker_env(dsn, path)
    victim = await start_worker(env)
    try:
        async with asyncio.timeout(60):  # all three started, only the first one recorded
            while len(await _executions(pool, run_id)) < 3 or await _recorded(pool, run_id) < 1:
                await asyncio.sleep(0.05)
    finally:
        await kill_worker(victim)
    ids = [f"toolu_s0000_{i}" for i in range(3)]
    assert await _executions(pool, run_id) == dict.fromkeys(ids, 1)
    assert await _recorded(pool, run_id) == 1  # the two long ones were still running
    worker = await start_worker(env)
    try:
        (row,) = await wait_all_finished(pool, [run_id], timeout=60)
    finally:
        await stop_worker(worker)
    assert row["status"] == "succeeded"
    # the finished call ran once; the interrupted ones once more each (pause is idempotent)
    assert await _executions(pool, run_id) == {ids[0]: 1, ids[1]: 2, ids[2]: 2}
    roles = [role for role, _ in await transcript(pool, run_id)]
    assert roles == ["user", "assistant", "user", "assistant"]
    _, content = (await transcript(pool, run_id))[2]
    blocks = json.loads(content) if isinstance(content, str) else content
    assert [b["tool_use_id"] for b in blocks] == ids  # in call order
    assert [(b["content"], b.get("is_error", False)) for b in blocks] == [("paused", False)] * 3
