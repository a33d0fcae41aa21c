"""Subagents as durable child runs (agent/middlewares/subagent.py): a `task` call enqueues a
child run, the parent waits holding nothing, and resumes with the answers in order."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.provider.types import (
    Message,
    ModelError,
    Request,
    Response,
    StopReason,
    TextBlock,
    TextSink,
    ToolUseBlock,
    Usage,
)
from hango_worker.service import serve
from hango_worker.store import fork, repo
from hango_worker.vocab import ErrorType
from tests.worker_helpers import details, enqueue, run_until_idle, settings

T = repo.DEFAULT_TENANT_ID


class TreeModel:
    """The parent (system "parent") delegates `tasks` at once, then joins the answers;
    a child (system "child") answers its task after `child_s` seconds — or fails when
    the task says so, or delegates again when its own system says "nest"."""

    name = "scripted"

    def __init__(self, tasks: list[dict[str, Any]], child_s: float = 0.0) -> None:
        self.tasks = tasks
        self.child_s = child_s

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        system = " ".join(b.text for b in request.system)
        turn = sum(1 for m in request.messages if m.role == "assistant")
        first = request.messages[0].text()
        if "parent" in system or "nest" in system:
            if turn == 0:
                calls = [ToolUseBlock(f"toolu_t{i}", "task", t) for i, t in enumerate(self.tasks)]
                return _answer(calls, StopReason.TOOL_USE)
            results = request.messages[-1].content
            joined = " | ".join(str(getattr(b, "content", "")) for b in results)
            return _answer([TextBlock(f"joined: {joined}")])
        if "fail" in first:
            raise ModelError(ErrorType.INVALID_REQUEST_ERROR, "bad child", retryable=False)
        await asyncio.sleep(self.child_s)
        return _answer([TextBlock(f"answer to {first}")])


def _answer(content: list[Any], stop: StopReason = StopReason.END_TURN) -> Response:
    return Response(Message("assistant", content), stop, Usage(10, 5))


async def agents(pool: asyncpg.Pool, **parent_config: Any) -> None:
    await repo.create_agent(
        pool,
        tenant_id=T,
        name="helper",
        model="m",
        system=["You are a child."],
        tools=[],
        config={},
    )
    config = {"subagents": ["helper"], **parent_config}
    await repo.create_agent(
        pool,
        tenant_id=T,
        name="boss",
        model="m",
        system=["You are the parent."],
        tools=["task"],
        config=config,
    )


def tasks(*texts: str, kind: str = "helper") -> list[dict[str, Any]]:
    return [{"description": t, "subagent_type": kind} for t in texts]


async def test_three_children_run_at_once_and_the_parent_waits_holding_nothing(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await agents(pool)
    parent = await enqueue(pool, "split it", agent="boss")
    model = TreeModel(tasks("a", "b", "c"), child_s=1.0)
    suspended = REGISTRY.get_sample_value("hango_runs_suspended_total", {"reason": "children"})
    worker = asyncio.create_task(run_until_idle(dsn, model, worker_concurrency=4))
    running = "SELECT count(*) FROM runs WHERE parent_run_id = $1 AND status = 'running'"
    status = "SELECT status FROM runs WHERE id = $1"
    async with asyncio.timeout(30):  # while the children run, the parent holds nothing
        while await pool.fetchval(running, parent) < 3 or (
            await pool.fetchval(status, parent) == "running"
        ):
            await asyncio.sleep(0.02)
    row = await pool.fetchrow("SELECT status, lease_owner FROM runs WHERE id = $1", parent)
    assert (row["status"], row["lease_owner"]) == ("waiting", None)
    assert await pool.fetchval(running, parent) == 3
    waiting = await pool.fetchval("SELECT waiting_for FROM runs WHERE id = $1", parent)
    assert waiting == {"reason": "children", "not_started": ["toolu_t0", "toolu_t1", "toolu_t2"]}
    after = REGISTRY.get_sample_value("hango_runs_suspended_total", {"reason": "children"})
    assert (after or 0) - (suspended or 0) == 1
    await worker
    run = await details(pool, parent)
    assert run["status"] == "succeeded", run["error"]
    assert run["transcript"][-1]["content"][0]["text"] == (
        "joined: answer to a | answer to b | answer to c"  # in call order
    )
    children = await pool.fetch(
        "SELECT status, depth, started_at, finished_at FROM runs WHERE parent_run_id = $1", parent
    )
    assert [c["status"] for c in children] == ["succeeded"] * 3 and {
        c["depth"] for c in children
    } == {1}
    # the three 1 s children overlapped: together well under 3 s of wall time
    spread = max(c["finished_at"] for c in children) - min(c["started_at"] for c in children)
    wall = await pool.fetchval(
        "SELECT extract(epoch FROM finished_at - started_at) FROM runs WHERE id = $1", parent
    )
    print(
        f"three 1 s children: parent wall {float(wall):.2f} s, children spread "
        f"{spread.total_seconds():.2f} s (sequential: 3 s)"
    )
    assert spread.total_seconds() < 2.5 and float(wall) < 2.5
    tree = await fork.tree(pool, T, parent)
    assert [(r["level"], r["status"]) for r in tree] == [(0, "succeeded")] + [(1, "succeeded")] * 3


async def test_a_failing_child_is_an_error_result_and_a_bad_type_a_tool_error(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await agents(pool)
    parent = await enqueue(pool, "go", agent="boss")
    mixed = [*tasks("ok", "fail please"), {"description": "x", "subagent_type": "nobody"}]
    await run_until_idle(dsn, TreeModel(mixed))
    run = await details(pool, parent)
    assert run["status"] == "succeeded", run["error"]
    results = run["transcript"][-2]["content"]
    assert results[0] == {
        "type": "tool_result",
        "tool_use_id": "toolu_t0",
        "content": "answer to ok",
    }
    assert results[1]["is_error"] and "failed: bad child" in results[1]["content"]
    assert results[2]["is_error"] and "unknown subagent_type 'nobody'" in results[2]["content"]
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE parent_run_id = $1", parent) == 2


async def test_the_depth_limit_stops_recursion_with_a_clear_error(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await repo.create_agent(
        pool,
        tenant_id=T,
        name="nester",
        model="m",
        system=["nest"],
        tools=["task"],
        config={"max_depth": 1},
    )
    root = await enqueue(pool, "go", agent="nester")
    await run_until_idle(dsn, TreeModel(tasks("deeper", kind="general")))
    tree = await fork.tree(pool, T, root)
    assert [(r["level"], r["status"]) for r in tree] == [(0, "succeeded"), (1, "succeeded")]
    child = await details(pool, tree[1]["id"])
    refused = child["transcript"][-2]["content"][0]
    assert refused["is_error"] and "subagents may nest 1 deep (max_depth)" in refused["content"]


async def test_cancelling_the_parent_cancels_its_children(pool: asyncpg.Pool, dsn: str) -> None:
    await agents(pool)
    parent = await enqueue(pool, "go", agent="boss")
    worker = asyncio.create_task(
        run_until_idle(dsn, TreeModel(tasks("a", "b", "c"), child_s=30), worker_concurrency=2)
    )
    async with asyncio.timeout(30):
        while (
            await pool.fetchval(
                "SELECT count(*) FROM runs WHERE parent_run_id = $1 AND status = 'running'", parent
            )
            < 2
        ):
            await asyncio.sleep(0.02)
    assert await repo.request_cancel(pool, T, parent) == "cancelled"  # waiting: at once
    started = time.monotonic()
    await asyncio.wait_for(worker, 30)
    assert time.monotonic() - started < 25  # the running children stopped, not slept out
    rows = await pool.fetch("SELECT status FROM runs WHERE parent_run_id = $1", parent)
    assert [r["status"] for r in rows] == ["cancelled"] * 3


async def test_one_trace_holds_the_parent_and_its_children(
    pool: asyncpg.Pool, dsn: str, spans: Any
) -> None:
    await agents(pool)
    await enqueue(pool, "go", agent="boss")
    await run_until_idle(dsn, TreeModel(tasks("a", "b")))
    spans.handle.force_flush()
    runs = spans.named("invoke_agent")
    assert len({s.context.trace_id for s in runs}) == 1  # parent attempts and children
    calls = {s.context.span_id for s in spans.named("execute_tool task")}
    children = [s for s in runs if s.name == "invoke_agent helper"]
    assert len(children) == 2 and all(s.parent.span_id in calls for s in children)


@pytest.mark.parametrize("kind", ["approve"])
async def test_a_person_cannot_decide_for_a_run_waiting_on_children(
    kind: str, pool: asyncpg.Pool, dsn: str
) -> None:
    from hango_worker.store import decisions
    from hango_worker.vocab import Decision

    await agents(pool)
    parent = await enqueue(pool, "go", agent="boss")
    worker = asyncio.create_task(
        run_until_idle(dsn, TreeModel(tasks("a"), child_s=1.0), worker_concurrency=2)
    )
    async with asyncio.timeout(30):
        while await pool.fetchval("SELECT status FROM runs WHERE id = $1", parent) != "waiting":
            await asyncio.sleep(0.02)
    with pytest.raises(repo.Conflict, match="waits for its subagent runs"):
        await decisions.decide(pool, T, parent, Decision.APPROVE)
    await worker
    assert (await details(pool, parent))["status"] == "succeeded"


async def test_client_wait_returns_when_the_parent_ends_not_while_its_children_run(
    pool: asyncpg.Pool, dsn: str
) -> None:
    from hango_worker.client import Client

    await agents(pool)
    parent = await enqueue(pool, "go", agent="boss")
    worker = asyncio.create_task(
        run_until_idle(dsn, TreeModel(tasks("a", "b"), child_s=0.5), worker_concurrency=3)
    )
    run = await Client(pool).wait(parent, timeout_s=60, poll_s=0.2)
    assert run["status"] == "succeeded"
    await worker


async def test_until_idle_does_not_stop_while_a_run_ending_during_the_claim_queued_another(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """The race CI once hit: the claim's snapshot is taken before the last child's
    wake-up of its parent commits, and the child is gone from the in-flight set by the
    time the claim returns. Forced here: every claim made while runs are in flight
    returns only after they have all ended. An idle worker must still claim the parent."""
    await agents(pool)
    parent = await enqueue(pool, "go", agent="boss")

    def slow_claims(worker: Any, _server: Any) -> None:
        claim = worker._claim

        async def claim_then_let_runs_end(n: int) -> int:
            got = await claim(n)
            running = [f.task for f in worker._inflight.values()]
            if got == 0 and running:
                await asyncio.wait(running)
            return int(got)

        worker._claim = claim_then_let_runs_end

    await serve(
        settings(dsn, worker_concurrency=4),
        dsn,
        until_idle=True,
        provider=TreeModel(tasks("a")),
        logs=False,
        metrics=False,
        on_ready=slow_claims,
    )
    run = await details(pool, parent)
    assert run["status"] == "succeeded", (run["status"], run["error"])
