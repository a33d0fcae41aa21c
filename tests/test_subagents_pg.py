"""Subagents on real worker processes: children run on any worker, and kill -9 of a
worker running a child, or of the worker that just enqueued them, loses nothing and
duplicates nothing."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from hango_worker.store import repo
from hango_worker.testing.chaos_tools import ensure_table
from tests.procs import kill_worker, start_worker, wait_all_finished, wait_exit, worker_env

T = repo.DEFAULT_TENANT_ID


def task(text: str, i: int) -> dict[str, Any]:
    return {
        "name": "task",
        "input": {"description": text, "subagent_type": "helper"},
        "id": f"toolu_task_{i}",
    }


# The parent lists only `task`; a child lists only `pause_once`. Both play this script:
# the parent's pause call and a child's task calls are refused by their allowlists.
SCRIPT = [
    {
        "text": "Delegating.",
        "tool_calls": [
            task("a", 0),
            task("b", 1),
            task("c", 2),
            {"name": "pause_once", "input": {"seconds": 2}, "id": "toolu_pause"},
        ],
    },
    {"text": "All done."},
]


async def setup(pool: asyncpg.Pool, dsn: str, tmp: Path) -> tuple[dict[str, str], str]:
    await ensure_table(pool)
    path = tmp / "script.json"
    path.write_text(json.dumps(SCRIPT))
    for name, tools, config in (
        ("helper", ["pause_once"], {}),
        ("boss", ["task"], {"subagents": ["helper"]}),
    ):
        await repo.create_agent(
            pool, tenant_id=T, name=name, model="m", system=[], tools=tools, config=config
        )
    ids = await repo.enqueue(pool, tenant_id=T, agent="boss", input_text="split it")
    return worker_env(dsn, path), ids["run_id"]


async def children(pool: asyncpg.Pool, parent: str) -> list[Any]:
    return list(
        await pool.fetch(
            "SELECT id::text, status, parent_tool_use_id FROM runs WHERE parent_run_id = $1 "
            "ORDER BY parent_tool_use_id",
            parent,
        )
    )


async def finish(pool: asyncpg.Pool, env: dict[str, str], parent: str) -> None:
    """Two fresh workers until the parent (and so every child) has ended."""
    workers = [await start_worker(env), await start_worker(env)]
    try:
        (row,) = await wait_all_finished(pool, [parent], timeout=120)
        assert row["status"] == "succeeded", await pool.fetchval(
            "SELECT error::text FROM runs WHERE id = $1", parent
        )
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            await wait_exit(w)


@pytest.mark.parametrize("kill", ["a_child_running", "right_after_the_enqueue"])
async def test_kill_9_loses_no_child_and_runs_none_twice(
    kill: str, pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    env, parent = await setup(pool, dsn, tmp_path)
    a = await start_worker(env)
    try:
        async with asyncio.timeout(60):
            while True:
                kids = await children(pool, parent)
                if kill == "right_after_the_enqueue" and kids:
                    break  # the enqueue committed; the parent may not be waiting yet
                if kill == "a_child_running" and await pool.fetchval(
                    "SELECT count(*) FROM chaos_exec WHERE tool = 'pause'"
                ):
                    break
                await asyncio.sleep(0.01)
    finally:
        await kill_worker(a)
    await finish(pool, env, parent)
    kids = await children(pool, parent)
    assert [k["parent_tool_use_id"] for k in kids] == [f"toolu_task_{i}" for i in range(3)]
    assert [k["status"] for k in kids] == ["succeeded"] * 3  # each child once, to the end
    results = await pool.fetch(
        "SELECT content FROM messages m JOIN runs r ON r.session_id = m.session_id "
        "WHERE r.id = $1 AND m.role = 'user' ORDER BY m.seq",
        parent,
    )
    blocks = [b for r in results if isinstance(r["content"], list) for b in r["content"]]
    answers = [
        b["content"] for b in blocks if str(b.get("tool_use_id", "")).startswith("toolu_task")
    ]
    assert answers == ["All done."] * 3  # each child's final answer, in call order
    # the parent's history was written once: its input and first turn appear once
    assert [r["content"][0].get("text") for r in results][:1] == ["split it"]
    assert sum(1 for r in results if r["content"][0].get("text") == "split it") == 1
    # a child's pause runs at most once per child (interrupted, never re-run)
    assert await pool.fetchval("SELECT count(*) FROM chaos_exec WHERE tool = 'pause'") <= 3


async def test_children_run_on_both_workers_while_the_parent_holds_no_slot(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    env, parent = await setup(pool, dsn, tmp_path)
    env["HANGO_WORKER_CONCURRENCY"] = "1"  # one slot each: a waiting parent must free it
    await finish(pool, env, parent)
    kids = await children(pool, parent)
    workers = await pool.fetch(
        "SELECT DISTINCT worker_id FROM run_events WHERE run_id = ANY($1::uuid[]) "
        "AND type = 'run_started'",
        [k["id"] for k in kids],
    )
    assert [k["status"] for k in kids] == ["succeeded"] * 3 and len(workers) == 2
