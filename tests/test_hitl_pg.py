"""Waiting runs on Postgres and real worker processes: a waiting run holds no worker,
any worker resumes it after the decision, and an approved call runs exactly once."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.middlewares.repair import INTERRUPTED
from hango_worker.run.execute import RunDeps
from hango_worker.run.worker import Worker
from hango_worker.store import decisions, repo
from hango_worker.testing.chaos_tools import ensure_table
from hango_worker.tool.registry import Registry
from hango_worker.vocab import Decision
from tests.helpers import call, recording_tool, scripted
from tests.procs import (
    kill_worker,
    start_worker,
    transcript,
    wait_all_finished,
    wait_exit,
    worker_env,
)
from tests.test_cli import cli
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle, settings

T = repo.DEFAULT_TENANT_ID
GATED = {"approvals": [{"tool": "step_once"}, {"tool": "pause_once"}, {"tool": "echo"}]}


async def status(pool: asyncpg.Pool, run_id: str) -> str:
    return str(await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id))


async def until_status(pool: asyncpg.Pool, run_id: str, want: str, timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        while await status(pool, run_id) != want:
            await asyncio.sleep(0.05)


async def executions(pool: asyncpg.Pool, tool: str) -> list[Any]:
    return list(await pool.fetch("SELECT pid, tool_use_id FROM chaos_exec WHERE tool = $1", tool))


def script_file(tmp: Path, turns: list[dict[str, Any]]) -> Path:
    path = tmp / "script.json"
    path.write_text(json.dumps(turns))
    return path


async def test_approval_round_trip_through_the_cli_resumes_on_another_worker_process(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    await ensure_table(pool)
    step = {"name": "step_once", "input": {"n": 1}, "id": "toolu_step"}
    env = worker_env(dsn, script_file(tmp_path, [{"tool_calls": [step]}, {"text": "done"}]))
    await make_agent(pool, tools=["step_once"], config=GATED)
    run_id = await enqueue(pool, "do the step")
    a = await start_worker(env, until_idle=True)
    assert await wait_exit(a) == 0  # idle: the waiting run holds nothing
    row = await pool.fetchrow(
        "SELECT status, lease_owner, waiting_for FROM runs WHERE id = $1", run_id
    )
    assert (row["status"], row["lease_owner"]) == ("waiting", None)
    assert await executions(pool, "step_once") == []
    shown = cli(dsn, "runs", "show", run_id).stdout
    assert "waiting for approval" in shown and "toolu_step" in shown
    assert "queued again" in cli(dsn, "runs", "approve", run_id, "--call", "toolu_step").stdout
    b = await start_worker(env, until_idle=True)
    assert await wait_exit(b) == 0
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    assert [r["pid"] for r in await executions(pool, "step_once")] == [b.pid]
    by = {e["worker_id"] for e in run["events"] if e["type"] in ("run_started", "run_waiting")}
    assert len(by) == 2  # suspended by one worker process, resumed by another
    assert [e["payload"]["decision"] for e in run["events"] if e["type"] == "decision"] == [
        "approve"
    ]


@pytest.mark.parametrize("when", ["right_after_approval", "mid_execution"])
async def test_an_approved_call_runs_exactly_once_across_kill_9(
    when: str, pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    await ensure_table(pool)
    pause = {"name": "pause_once", "input": {"seconds": 3}, "id": "toolu_p"}
    env = worker_env(dsn, script_file(tmp_path, [{"tool_calls": [pause]}, {"text": "done"}]))
    await make_agent(pool, tools=["pause_once"], config=GATED)
    run_id = await enqueue(pool, "pause")
    a = await start_worker(env, until_idle=True)
    await wait_exit(a)
    assert await status(pool, run_id) == "waiting"
    await decisions.decide(pool, T, run_id, Decision.APPROVE)
    if when == "right_after_approval":
        # a worker claims the approved run and dies at once, before it starts the call:
        # its lease runs out and the next worker must run the call (once)
        await pool.execute(
            "UPDATE runs SET status = 'running', attempt = attempt + 1, lease_owner = 'dead', "
            "lease_expires_at = now() + interval '1 second' WHERE id = $1",
            run_id,
        )
        b = await start_worker(env)  # B sees nothing to claim until the lease expires
    else:
        b = await start_worker(env)
    try:
        async with asyncio.timeout(60):
            while when == "mid_execution" and not await executions(pool, "pause"):
                await asyncio.sleep(0.01)
    finally:
        if when == "mid_execution":
            await kill_worker(b)
    c = await start_worker(env) if when == "mid_execution" else b
    try:
        (row,) = await wait_all_finished(pool, [run_id], timeout=180)
    finally:
        await kill_worker(c)
    assert row["status"] == "succeeded"
    ran = await executions(pool, "pause")
    assert len(ran) == 1  # never twice, and never lost
    (result,) = [
        block
        for role, content in await transcript(pool, run_id)
        if role == "user" and isinstance(content, list)
        for block in content
        if block.get("tool_use_id") == "toolu_p"
    ]
    if when == "mid_execution":  # killed while it ran: its outcome is unknown
        assert ran[0]["pid"] == b.pid and result["content"] == INTERRUPTED
    else:  # the worker that died had not started it: the next one ran it
        assert result["content"] == "paused"
        attempts = await pool.fetchval("SELECT attempt FROM runs WHERE id = $1", run_id)
        assert attempts == 3  # suspended, the dead claim, the one that ran it


async def test_200_waiting_runs_hold_no_slot_and_the_worker_serves_others(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="gated", tools=["echo"], config=GATED)
    await make_agent(pool, name="plain", tools=[])
    tool, calls = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"})
    gated = [await enqueue(pool, agent="gated") for _ in range(200)]
    plain = [await enqueue(pool, agent="plain") for _ in range(20)]
    stats = await run_until_idle(dsn, turns, tools=[tool], worker_concurrency=8)
    assert stats.finished.get("waiting") == 200 and stats.finished.get("succeeded") == 20
    rows = await pool.fetch("SELECT status, count(*) AS n FROM runs GROUP BY 1 ORDER BY 1")
    assert {r["status"]: r["n"] for r in rows} == {"succeeded": 20, "waiting": 200}
    assert calls == []
    for run_id in gated:
        await decisions.decide(pool, T, run_id, Decision.APPROVE)
    await run_until_idle(dsn, turns, tools=[tool], worker_concurrency=8)
    rows = await pool.fetch("SELECT DISTINCT status FROM runs WHERE id = ANY($1::uuid[])", gated)
    assert [r["status"] for r in rows] == ["succeeded"]
    assert len(calls) == 200 and len(plain) == 20


async def test_a_decision_that_does_not_fit_is_a_clear_error_and_changes_nothing(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["echo"], config=GATED)
    tool, _ = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"})
    run_id = await enqueue(pool)
    await run_until_idle(dsn, turns, tools=[tool])
    before = await pool.fetchrow(
        "SELECT status, waiting_for::text AS w FROM runs WHERE id = $1", run_id
    )
    with pytest.raises(repo.NotFound, match="does not wait on call 'toolu_nope'"):
        await decisions.decide(pool, T, run_id, Decision.APPROVE, call_id="toolu_nope")
    with pytest.raises(repo.Conflict, match="waits for an approval, not an answer"):
        await decisions.decide(pool, T, run_id, Decision.ANSWER, text="yes")
    with pytest.raises(ValueError, match="reject needs a text"):
        await decisions.decide(pool, T, run_id, Decision.REJECT)
    with pytest.raises(ValueError, match="must be a JSON object"):
        await decisions.decide(pool, T, run_id, Decision.APPROVE, edited=[1])
    after = await pool.fetchrow(
        "SELECT status, waiting_for::text AS w FROM runs WHERE id = $1", run_id
    )
    assert after == before
    assert await pool.fetchval("SELECT count(*) FROM run_decisions") == 0
    await decisions.decide(pool, T, run_id, Decision.APPROVE)
    with pytest.raises(repo.Conflict, match="is queued, not waiting for a decision"):
        await decisions.decide(pool, T, run_id, Decision.APPROVE)
    p = cli(dsn, "runs", "approve", run_id, ok=False)
    assert p.returncode == 4 and "not waiting for a decision" in p.stderr


async def sweep(pool: asyncpg.Pool, dsn: str) -> int:
    deps = RunDeps(pool, settings(dsn), Registry([]), scripted(), "sweeper")
    return await Worker(deps, dsn).sweep()


@pytest.mark.parametrize("then", ["reject", "fail"])
async def test_the_approval_timeout_rejects_or_fails_a_waiting_run(
    then: str, pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(
        pool,
        tools=["echo"],
        config={**GATED, "approval_timeout_s": 0.2, "on_approval_timeout": then},
    )
    tool, calls = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"})
    run_id = await enqueue(pool)
    await run_until_idle(dsn, turns, tools=[tool])
    assert await status(pool, run_id) == "waiting"
    await sweep(pool, dsn)
    assert await status(pool, run_id) == "waiting"  # not due yet
    await asyncio.sleep(0.3)
    await sweep(pool, dsn)
    if then == "fail":
        run = await details(pool, run_id)
        assert run["status"] == "failed" and run["error"]["type"] == "approval_timeout"
        assert run["events"][-1]["type"] == "run_finished"
        return
    assert await status(pool, run_id) == "queued"
    await run_until_idle(dsn, turns, tools=[tool])
    run = await details(pool, run_id)
    assert run["status"] == "succeeded" and calls == []
    result = run["transcript"][-2]["content"][0]
    assert result["is_error"] and "no one decided" in result["content"]


async def test_a_waiting_run_is_cancelled_at_once_and_counted_in_the_gauge(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["echo"], config=GATED)
    tool, _ = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="x")]}, {"text": "ok"})
    run_id = await enqueue(pool)
    await run_until_idle(dsn, turns, tools=[tool])
    await sweep(pool, dsn)
    assert REGISTRY.get_sample_value("hango_runs_waiting") == 1
    assert await repo.request_cancel(pool, T, run_id) == "cancelled"
    await sweep(pool, dsn)
    assert REGISTRY.get_sample_value("hango_runs_waiting") == 0


async def test_a_malformed_waiting_record_fails_only_its_own_run(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["echo"])
    tool, _ = recording_tool()
    turns = scripted({"text": "ok"})
    bad, good = await enqueue(pool), await enqueue(pool)
    await pool.execute(
        """UPDATE runs SET waiting_for = '{"not_started": [1, 2]}' WHERE id = $1""", bad
    )
    await run_until_idle(dsn, turns, tools=[tool])
    failed = await details(pool, bad)
    assert failed["status"] == "failed" and failed["error"]["type"] == "invalid_state"
    assert "runs.waiting_for" in failed["error"]["message"]
    assert (await details(pool, good))["status"] == "succeeded"
