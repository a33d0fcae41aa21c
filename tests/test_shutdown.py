"""A stopping worker (docs/system-architecture.md, "Graceful shutdown"): it stops within
its bound whatever its runs and the database do, hands every run back, and
`until_idle` never returns with a run of its own still running.

Each race is pinned by a hook, not by timing: a writer that holds a run's task after
its commit, a row lock that keeps a statement waiting (seen in pg_stat_activity), a
rate-limit bucket paused for minutes, a tool that waits for an event."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.control import RunCancelled, RunControl, RunReleased
from hango_worker.config import Settings
from hango_worker.provider.types import Provider, Request, Response, TextSink
from hango_worker.run.bounded import close_pool
from hango_worker.run.execute import RunDeps
from hango_worker.run.group import GroupCommit
from hango_worker.run.io import with_reconnect
from hango_worker.run.worker import STOP_BOUND_S, Worker, WorkerStats
from hango_worker.store import db, ratelimits, repo, sql
from hango_worker.store.turn import FencedWrite, TurnWrite
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import call, scripted
from tests.test_subagents import TreeModel, agents, tasks
from tests.worker_helpers import details, enqueue, make_agent, settings

T = repo.DEFAULT_TENANT_ID


class Running:
    """A worker in this process on a pool of its own, its `run()` as a task."""

    def __init__(self, worker: Worker, pool: asyncpg.Pool, task: asyncio.Task[WorkerStats]):
        self.worker, self.pool, self.task = worker, pool, task

    async def stopped(self, within_s: float) -> WorkerStats:
        """The stats once `run()` returned: at most `within_s` seconds from now."""
        try:
            async with asyncio.timeout(within_s):
                return await asyncio.shield(self.task)
        finally:
            await close_pool(self.pool, 5)


async def start(
    dsn: str,
    provider: Provider,
    tools: Sequence[Tool] = (),
    *,
    until_idle: bool = False,
    wrap: Callable[[GroupCommit], Any] | None = None,
    **over: Any,
) -> Running:
    s: Settings = settings(dsn, **over)
    pool = await db.open_pool(dsn, min_size=1, max_size=8)
    registry = Registry([*Registry.default(load_entry_points=False).view(["calculator"]), *tools])
    deps = RunDeps(pool, s, registry, provider, f"w-{id(pool):x}")
    if wrap is not None:
        deps.writer = wrap(GroupCommit(pool))
    worker = Worker(deps, dsn)
    return Running(worker, pool, asyncio.ensure_future(worker.run(until_idle=until_idle)))


async def until(check: Callable[[], Awaitable[Any]], timeout: float = 30) -> Any:
    """Poll `check` (the database, another process's writes) until it returns a truthy
    value; fail loudly after `timeout` seconds."""
    async with asyncio.timeout(timeout):
        while not (found := await check()):
            await asyncio.sleep(0.01)
        return found


def waiting_tool(name: str, release: asyncio.Event, started: asyncio.Event) -> Tool:
    async def fn(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        started.set()
        await release.wait()
        return ToolResult("done")

    return Tool(name, "Waits for the test.", {"type": "object"}, fn, idempotent=False)


# -- the race behind "until_idle returned with the parent still running" ------------------


class GatedTree(TreeModel):
    """TreeModel whose children answer only once `go` is set."""

    def __init__(self, tasks: list[dict[str, Any]]) -> None:
        super().__init__(tasks)
        self.go = asyncio.Event()
        self.worker: Worker | None = None
        self.held_by_worker: list[bool] = []  # at each of the parent's joining calls

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        system = " ".join(b.text for b in request.system)
        if "child" in system:
            await self.go.wait()
        elif any(m.role == "assistant" for m in request.messages) and self.worker is not None:
            # the parent's new attempt: the worker still tracks it (heartbeat, drain)
            self.held_by_worker.append(self._tracked())
        return await super().complete(request, on_text)

    def _tracked(self) -> bool:
        assert self.worker is not None
        return any(f.claim.depth == 0 for f in self.worker._inflight.values())


class HoldAfterWaiting:
    """The worker's GroupCommit, but the parent's `waiting` checkpoint, once committed,
    lets the children answer and does not return until the worker has claimed the
    parent again: they ended and woke it while its previous attempt's task was still
    ending (observed: a child's wake landing just after the parent's checkpoint)."""

    def __init__(
        self, inner: GroupCommit, pool: asyncpg.Pool, parent: str, go: asyncio.Event
    ) -> None:
        self.inner, self.pool, self.parent, self.go = inner, pool, parent, go
        self.held = 0

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return await self.inner.fetchrow(query, *args)

    async def write(self, record: FencedWrite) -> Any:
        row = await self.inner.write(record)
        turn = record if isinstance(record, TurnWrite) else None
        if turn is not None and turn.run_id == self.parent and turn.status == "waiting":
            self.held += 1
            self.go.set()
            await until(self._claimed_again)
        return row

    async def _claimed_again(self) -> bool:
        r = await self.pool.fetchrow("SELECT status, attempt FROM runs WHERE id = $1", self.parent)
        return bool(r["status"] == "running" and r["attempt"] >= 2)


async def test_a_run_claimed_again_while_its_last_attempt_ends_keeps_until_idle_waiting(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await agents(pool)
    parent = await enqueue(pool, "go", agent="boss")
    hold: list[HoldAfterWaiting] = []
    model = GatedTree(tasks("a", "b"))

    def wrap(g: GroupCommit) -> HoldAfterWaiting:
        hold.append(HoldAfterWaiting(g, pool, parent, model.go))
        return hold[0]

    w = await start(dsn, model, until_idle=True, wrap=wrap)
    model.worker = w.worker
    stats = await w.stopped(60)
    assert model.held_by_worker == [True], "the old attempt's end dropped the new one"
    assert hold[0].held == 1, "the hook never held the parent's waiting checkpoint"
    run = await details(pool, parent)
    assert run["status"] == "succeeded", "until_idle returned with the parent still running"
    assert stats.finished == {"waiting": 1, "succeeded": 3}
    assert not w.worker._inflight and not w.worker._tasks


# -- waits before a model call end at once on a shutdown -------------------------------


async def test_a_shutdown_cuts_a_wait_before_a_model_call_short() -> None:
    control = RunControl()
    sleeping = asyncio.ensure_future(control.sleep(600))
    await asyncio.sleep(0)
    control.shutdown = True
    with pytest.raises(RunReleased):
        await asyncio.wait_for(sleeping, 10)
    with pytest.raises(RunReleased):  # asked again once stopping: at once
        await control.sleep(600)
    control.cancel.set()  # a cancel outranks the shutdown
    with pytest.raises(RunCancelled):
        await control.sleep(600)


async def test_a_run_waiting_for_the_rate_limit_is_handed_back_at_once_on_shutdown(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    await ratelimits.set_rate_limit(pool, "anthropic", requests_per_minute=60)
    await pool.execute(
        "UPDATE rate_limits SET blocked_until = now() + interval '10 minutes', "
        "updated_at = now() - interval '1 hour' WHERE key = 'anthropic'"
    )
    run_id = await enqueue(pool)
    w = await start(dsn, scripted({"text": "never"}), rate_limit_key="anthropic")
    # RATE_TAKE stamps updated_at: the run asked, was refused, and sleeps
    await until(
        lambda: pool.fetchval(
            "SELECT updated_at > now() - interval '1 minute' FROM rate_limits "
            "WHERE key = 'anthropic'"
        )
    )
    w.worker.request_shutdown()
    stats = await w.stopped(60)  # the grace is 25 s: a released run is not waited for
    assert stats.finished == {"released": 1}, "the run was not handed back from its wait"
    r = await pool.fetchrow(
        "SELECT status, lease_owner, lost_count FROM runs WHERE id = $1", run_id
    )
    assert (r["status"], r["lease_owner"], r["lost_count"]) == ("queued", None, 0)


# -- past the grace: cancelled, then handed back at once --------------------------------


def _handed_back() -> float:
    return REGISTRY.get_sample_value("hango_runs_handed_back_total") or 0.0


async def test_a_run_past_the_grace_is_cancelled_and_handed_back_not_left_to_its_lease(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["wait"])
    run_id = await enqueue(pool)
    release, started = asyncio.Event(), asyncio.Event()
    model = scripted({"tool_calls": [call("wait")]}, {"text": "after the interruption"})
    w = await start(dsn, model, [waiting_tool("wait", release, started)], shutdown_grace_s=0.2)
    await asyncio.wait_for(started.wait(), 30)
    before = _handed_back()
    w.worker.request_shutdown()
    stats = await w.stopped(0.2 + STOP_BOUND_S)
    assert stats.finished == {"abandoned": 1}
    r = await pool.fetchrow(
        "SELECT status, lease_owner, lease_expires_at, lost_count, attempt FROM runs WHERE id = $1",
        run_id,
    )
    assert (r["status"], r["lease_owner"], r["lease_expires_at"]) == ("queued", None, None)
    assert (r["lost_count"], r["attempt"]) == (0, 1), "a hand-back is not a lost lease"
    assert _handed_back() - before == 1
    # another worker takes it over: the call cut short is answered as interrupted
    again = await start(dsn, model, [waiting_tool("wait", release, started)], until_idle=True)
    await again.stopped(60)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded"
    result = run["transcript"][-2]["content"][0]
    assert result["is_error"] and "interrupted" in result["content"]


# -- a database that stops answering cannot hold the stop up -----------------------------


async def _waiting_on_a_lock(pool: asyncpg.Pool, text: str) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE $1",
            f"%{text}%",
        )
    )


async def test_a_worker_whose_statements_stop_answering_still_stops_within_its_bound(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["wait"])
    run_id = await enqueue(pool)
    release, started = asyncio.Event(), asyncio.Event()
    model = scripted({"tool_calls": [call("wait")]}, {"text": "done"})
    w = await start(dsn, model, [waiting_tool("wait", release, started)], shutdown_grace_s=0.2)
    await asyncio.wait_for(started.wait(), 30)
    locker = await db.connect(dsn)
    try:
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", run_id)
        release.set()  # the tool returns; recording its result waits on the lock
        await until(lambda: _waiting_on_a_lock(pool, "tool_calls"))
        w.worker.request_shutdown()
        # the run is cancelled after the grace, its hand-back waits on the lock too and
        # is given up: the stop is bounded all the same
        stats = await w.stopped(0.2 + STOP_BOUND_S)
        assert stats.finished == {"abandoned": 1}
        assert not await _waiting_on_a_lock(pool, "runs"), "a statement was left waiting"
        await tx.rollback()
    finally:
        await locker.close()
    r = await pool.fetchrow(
        "SELECT status, lease_owner, lost_count FROM runs WHERE id = $1", run_id
    )
    # nothing landed after the stop: the run keeps its lease, which expires as after a crash
    assert (r["status"], r["lease_owner"], r["lost_count"]) == ("running", w.worker.worker_id, 0)


async def test_the_last_writes_land_before_the_pool_closes(pool: asyncpg.Pool) -> None:
    """GroupCommit.settled: what a stopping worker waits for before closing its pool."""
    (row,) = await _claimed(pool, 1)
    group = GroupCommit(pool)
    assert await group.settled(0.1)  # nothing in flight
    locker = await pool.acquire()
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE", row["id"])
    write = asyncio.ensure_future(group.fetchrow(sql.UNCLAIM, row["id"], "w", row["attempt"]))
    await until(lambda: _waiting_on_a_lock(pool, "UPDATE runs"))
    assert not await group.settled(0.2), "settled while a write was in flight"
    await tx.rollback()
    await pool.release(locker)
    assert await group.settled(10)
    assert write.done()
    status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", row["id"])
    assert status == "queued"


async def _claimed(pool: asyncpg.Pool, n: int) -> list[asyncpg.Record]:
    await make_agent(pool)
    for i in range(n):
        await enqueue(pool, f"run {i}")
    return list(await pool.fetch(sql.CLAIM, "w", n, 30.0))


async def test_a_write_is_not_retried_once_its_pool_is_closing(dsn: str) -> None:
    p = await db.create_pool(dsn, min_size=1, max_size=2)
    tries = 0

    async def op() -> None:
        nonlocal tries
        tries += 1
        raise asyncpg.InterfaceError("pool is closing")

    closing = asyncio.ensure_future(p.close())
    await asyncio.sleep(0)
    with pytest.raises(asyncpg.InterfaceError):
        await with_reconnect(op, deadline_s=30, what="checkpoint", pool=p)
    assert tries == 1, "a closing pool was waited on"
    await closing


def test_sync_tools_run_on_at_most_n_daemon_threads_that_never_hold_the_exit() -> None:
    import threading
    from concurrent.futures import wait

    from hango_worker.tool.threads import DaemonThreads

    pool = DaemonThreads(2, "t")
    gate = threading.Event()
    seen: list[tuple[str, bool]] = []

    def job(n: int) -> int:
        seen.append((threading.current_thread().name, threading.current_thread().daemon))
        gate.wait(10)
        return n * 2

    def boom() -> None:
        raise ValueError("the tool's own error")

    futures = [pool.submit(job, n) for n in range(3)]
    failed = pool.submit(boom)
    gate.set()
    wait([*futures, failed], timeout=10)
    assert [f.result() for f in futures] == [0, 2, 4]
    with pytest.raises(ValueError, match="the tool's own error"):
        failed.result()
    assert {name for name, _ in seen} <= {"t_0", "t_1"}, "more threads than max_workers"
    assert all(daemon for _, daemon in seen)


def test_a_grace_shorter_than_a_tool_timeout_is_named_at_start_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A deploy would cut the slow tool's calls off: the start-up says so, naming it."""
    from hango_worker.service import _check_grace

    schema = {"type": "object", "properties": {}}

    async def fn(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult("ok")

    slow = Tool("crawl", "Slow.", schema, fn, timeout_s=120)
    caplog.set_level("WARNING", logger="hango_worker.service")
    _check_grace(Settings.model_fields["shutdown_grace_s"].default, Registry.default())
    assert not caplog.records  # the default grace covers the default tool timeout
    _check_grace(65, Registry([*Registry.default().view(Registry.default().names()), slow]))
    [line] = [r.getMessage() for r in caplog.records]
    assert "shutdown grace 65s is shorter than tool crawl's timeout (120s)" in line
    assert "HANGO_SHUTDOWN_GRACE_S to at least 125" in line
