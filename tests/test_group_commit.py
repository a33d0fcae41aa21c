"""Group commit (run/group.py): fenced writes of concurrent runs share one transaction,
each run still fenced alone, each resumed only after the shared commit."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.control import RunControl
from hango_worker.agent.ports import Event, Fenced, Outcome
from hango_worker.agent.state import FileWrite, State, Todo
from hango_worker.provider.types import Message, TextBlock
from hango_worker.run import worker as worker_module
from hango_worker.run.claim import Claim
from hango_worker.run.execute import RunDeps
from hango_worker.run.group import GroupCommit
from hango_worker.run.io import CONNECTION_ERRORS, PgRunIO, Writer
from hango_worker.run.worker import InFlight, Worker
from hango_worker.tool.registry import Registry
from tests.helpers import scripted
from tests.worker_helpers import enqueue_and_claim, settings

WORKER = "gc-worker"


def _batches() -> tuple[float, float]:
    """(group commits, writes in them) so far."""
    count = REGISTRY.get_sample_value("hango_checkpoint_batch_size_count") or 0.0
    total = REGISTRY.get_sample_value("hango_checkpoint_batch_size_sum") or 0.0
    return count, total


def _splits() -> float:
    return REGISTRY.get_sample_value("hango_group_commit_splits_total") or 0.0


async def _claimed(pool: asyncpg.Pool, n: int) -> list[Claim]:
    return [Claim.from_record(r) for r in await enqueue_and_claim(pool, n, WORKER)]


def _io(pool: asyncpg.Pool, c: Claim, writer: Writer, message_seq: int = 1) -> PgRunIO:
    return PgRunIO(
        pool,
        c,
        worker_id=WORKER,
        lease_s=30.0,
        next_message_seq=message_seq,
        next_event_seq=1,
        writer=writer,
    )


async def _turn(io: PgRunIO, text: str) -> None:
    """One turn's checkpoint: the user message, the model's answer, an event."""
    c = io.claim
    state = State(c.run_id, c.session_id, c.agent_id, c.tenant_id)
    messages = [Message("user", [TextBlock(text="go")]), Message("assistant", [TextBlock(text)])]
    await io.checkpoint(state, messages, [Event("model_message", {"text": text})], None)


async def _texts(pool: asyncpg.Pool, run_id: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT content->0->>'text' AS t FROM messages WHERE run_id = $1 ORDER BY seq", run_id
    )
    return [r["t"] for r in rows]


async def _xids(pool: asyncpg.Pool, run_ids: list[str]) -> int:
    """How many transactions last wrote these runs' rows."""
    return int(
        await pool.fetchval(
            "SELECT count(DISTINCT xmin::text) FROM runs WHERE id = ANY($1::uuid[])", run_ids
        )
    )


async def _hold(gc: GroupCommit) -> asyncio.Future[object]:
    """A lone write kept in flight for a moment (a lone write goes at once, alone), so
    the writes sent next queue behind it and share the transaction after it."""
    held = asyncio.ensure_future(gc.fetchrow("SELECT 1 AS fenced FROM pg_sleep(0.05)"))
    await asyncio.sleep(0)  # it has started
    return held


async def test_a_stolen_lease_rejects_only_its_run_in_a_shared_commit(
    pool: asyncpg.Pool,
) -> None:
    a, b, c = await _claimed(pool, 3)
    await pool.execute(  # another worker took b over (its lease expired and was reclaimed)
        "UPDATE runs SET lease_owner = 'thief', attempt = attempt + 1 WHERE id = $1", b.run_id
    )
    gc = GroupCommit(pool)
    io_a, io_b, io_c = _io(pool, a, gc), _io(pool, b, gc), _io(pool, c, gc)
    held = await _hold(gc)
    before = _batches()
    res = await asyncio.gather(
        _turn(io_a, "a's answer"), _turn(io_b, "b's"), _turn(io_c, "c's"), return_exceptions=True
    )
    after = _batches()
    await held
    assert (after[0] - before[0], after[1] - before[1]) == (1, 3)
    assert await _xids(pool, [a.run_id, c.run_id]) == 1  # one transaction for both
    assert res[0] is None and res[2] is None
    assert isinstance(res[1], Fenced) and io_b.control.lost and not io_a.control.lost
    assert await _texts(pool, a.run_id) == ["go", "a's answer"]
    assert await _texts(pool, c.run_id) == ["go", "c's"]
    assert await _texts(pool, b.run_id) == []
    owner = await pool.fetchval("SELECT lease_owner FROM runs WHERE id = $1", b.run_id)
    assert owner == "thief"
    events = await pool.fetchval("SELECT count(*) FROM run_events WHERE run_id = $1", a.run_id)
    assert events == 1


async def test_a_statement_error_in_a_shared_commit_fails_only_its_run(
    pool: asyncpg.Pool,
) -> None:
    a, b, c = await _claimed(pool, 3)
    # a's history already holds seq 1 (written by someone else): its checkpoint's
    # INSERT of seq 1 fails, which rolls back the whole shared transaction
    await pool.execute(
        "INSERT INTO messages (session_id, seq, run_id, role, content) "
        "VALUES ($1, 1, $2, 'user', '[]')",
        a.session_id,
        a.run_id,
    )
    gc = GroupCommit(pool)
    ios = [_io(pool, x, gc) for x in (a, b, c)]
    splits = _splits()
    held = await _hold(gc)
    res = await asyncio.gather(
        *(_turn(io, f"answer {i}") for i, io in enumerate(ios)), return_exceptions=True
    )
    await held
    assert isinstance(res[0], asyncpg.UniqueViolationError)
    assert res[1:] == [None, None]
    assert _splits() == splits + 1
    assert await _texts(pool, b.run_id) == ["go", "answer 1"]
    assert await _texts(pool, c.run_id) == ["go", "answer 2"]
    assert await _texts(pool, a.run_id) == [None]  # only the row found before
    # each run's fence was checked and renewed on its own write
    running = await pool.fetchval(
        "SELECT count(*) FROM runs WHERE id = ANY($1::uuid[]) AND status = 'running' "
        "AND lease_owner = $2",
        [x.run_id for x in (a, b, c)],
        WORKER,
    )
    assert running == 3


async def test_writes_arriving_during_a_commit_share_the_next_one(pool: asyncpg.Pool) -> None:
    claims = await _claimed(pool, 5)
    gc = GroupCommit(pool)
    ios = [_io(pool, c, gc) for c in claims]
    before = _batches()
    first = asyncio.ensure_future(_turn(ios[0], "first"))
    await asyncio.sleep(0)  # the first write goes alone, at once
    rest = [asyncio.ensure_future(_turn(io, f"next {i}")) for i, io in enumerate(ios[1:])]
    await asyncio.gather(first, *rest)
    after = _batches()
    assert (after[0] - before[0], after[1] - before[1]) == (2, 5)
    assert await _xids(pool, [c.run_id for c in claims]) == 2  # the first, then the rest
    for i, c in enumerate(claims[1:]):
        assert await _texts(pool, c.run_id) == ["go", f"next {i}"]


async def test_a_lone_write_is_not_held_back_by_a_window(pool: asyncpg.Pool) -> None:
    """On the test's own clock: a lone write through the group commit costs less than
    twice the same statement sent straight to the pool (no window, no timer)."""
    (c,) = await _claimed(pool, 1)
    gc = GroupCommit(pool)
    direct, grouped = _io(pool, c, pool), _io(pool, c, gc)
    t_direct, t_grouped = [], []
    before = _batches()
    for i in range(30):
        for io, times in ((direct, t_direct), (grouped, t_grouped)):
            t0 = time.perf_counter()
            await io.mark_started(f"toolu_{i}")
            times.append(time.perf_counter() - t0)
    after = _batches()
    assert (after[0] - before[0], after[1] - before[1]) == (30, 30)  # each alone
    assert statistics.median(t_grouped) < 2 * statistics.median(t_direct)


async def test_a_lost_connection_reaches_every_run_of_the_batch_and_each_retries(
    pool: asyncpg.Pool,
) -> None:
    a, b = await _claimed(pool, 2)
    gc = GroupCommit(pool)
    ios = [_io(pool, x, gc) for x in (a, b)]
    held = await _hold(gc)
    before = _batches()
    # a third write in the same batch kills the shared connection before the COMMIT
    kill = gc.fetchrow("SELECT pg_terminate_backend(pg_backend_pid()) AS fenced")
    res = await asyncio.gather(
        kill, *(_turn(io, f"answer {i}") for i, io in enumerate(ios)), return_exceptions=True
    )
    await held
    after = _batches()
    # the three together, then a's and b's writes again, each alone
    assert (after[0] - before[0], after[1] - before[1]) == (3, 5)
    assert isinstance(res[0], CONNECTION_ERRORS)  # the database went away: retry
    assert res[1:] == [None, None]  # each retried on its own and committed
    assert await _texts(pool, a.run_id) == ["go", "answer 0"]
    assert await _texts(pool, b.run_id) == ["go", "answer 1"]


async def test_a_group_commit_cancelled_at_shutdown_leaves_no_write_waiting(
    pool: asyncpg.Pool,
) -> None:
    """A lone write's own task cancelled mid-write ends only that write, and the writes
    queued behind it still go; the writer task cancelled (the event loop shutting down)
    mid-commit: every write of its batch ends with CancelledError — none is told it
    committed, none waits forever — and the next write starts afresh."""
    gc = GroupCommit(pool)

    async def running(prefix: str) -> None:
        q = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 AND state = 'active'"
        while await pool.fetchval(q, prefix + "%") == 0:
            await asyncio.sleep(0.01)

    lone = asyncio.ensure_future(gc.fetchrow("SELECT pg_sleep(3) IS NULL AS fenced"))
    await asyncio.sleep(0)  # the first write goes at once, alone, from its own task
    queued = [
        asyncio.ensure_future(gc.fetchrow("SELECT pg_sleep(4) IS NULL AS fenced")) for _ in range(2)
    ]
    await running("SELECT pg_sleep(3)")
    lone.cancel()
    await running("SELECT pg_sleep(4)")  # the queue moved on: its batch is committing
    (writer,) = [t for t in asyncio.all_tasks() if t.get_name() == "hango-group-commit"]
    writer.cancel()
    done = await asyncio.wait_for(asyncio.gather(lone, *queued, return_exceptions=True), timeout=10)
    assert [type(r) for r in done] == [asyncio.CancelledError] * 3
    row = await asyncio.wait_for(gc.fetchrow("SELECT 7 AS fenced"), timeout=10)
    assert row["fenced"] == 7


def _merged() -> float:
    return REGISTRY.get_sample_value("hango_checkpoints_merged_total") or 0.0


async def _write(io: PgRunIO, n: int, outcome: Outcome | None) -> None:
    """A checkpoint of n messages, n + 1 events, n files and n kept states."""
    x = io.claim
    st = State(x.run_id, x.session_id, x.agent_id, x.tenant_id)
    st.todos = [Todo(content=f"todo of {x.run_id}", status="pending")]
    st.file_writes = [FileWrite(f"/f{i}", f"{x.run_id} {i}", 5) for i in range(n)]
    msgs = [Message("user", [TextBlock(f"{x.run_id} m{i}")]) for i in range(n)]
    events = [Event("e", {"run": x.run_id, "i": i}) for i in range(n + 1)]
    states = [(t, json.dumps({"run": x.run_id, "turn": t})) for t in range(n)]
    await io.checkpoint(st, msgs, events, outcome, None, states)


async def _rows_of(pool: asyncpg.Pool, x: Claim) -> dict[str, Any]:
    q = {
        "events": "SELECT seq, payload->>'run' AS run, worker_id, attempt FROM run_events "
        "WHERE run_id = $1 ORDER BY seq",
        "files": "SELECT path, content FROM run_files WHERE run_id = $1 ORDER BY path",
        "states": "SELECT turn, state_json->>'run' AS run FROM run_states WHERE run_id = $1 "
        "ORDER BY turn",
        "run": "SELECT status, lease_owner, finished_at IS NOT NULL AS finished, "
        "state_json->'todos'->0->>'content' AS todo FROM runs WHERE id = $1",
    }
    return {k: [tuple(r.values()) for r in await pool.fetch(v, x.run_id)] for k, v in q.items()}


async def test_checkpoints_of_a_batch_share_one_statement_each_run_getting_its_own_rows(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Runs with different numbers of messages, events, files and kept states, one run
    finishing (succeeded) and two still running, checkpointed in one merged statement:
    every row lands on its own run, only the finished run is notified on hango_done."""
    claims = await _claimed(pool, 3)
    gc = GroupCommit(pool)
    done: list[str] = []
    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener("hango_done", lambda *args: done.append(args[3]))
        held = await _hold(gc)
        merged, before = _merged(), _batches()
        outcomes = [None, Outcome("succeeded", output=[{"n": 1}], has_output=True), None]
        await asyncio.gather(
            *(
                _write(_io(pool, x, gc), i + 1, o)
                for i, (x, o) in enumerate(zip(claims, outcomes, strict=True))
            )
        )
        await held
        after = _batches()
        for _ in range(100):
            if done:
                break
            await asyncio.sleep(0.01)
    finally:
        await listener.close()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 3)
    assert _merged() == merged + 3
    assert await _xids(pool, [x.run_id for x in claims]) == 1
    for n, (x, o) in enumerate(zip(claims, outcomes, strict=True), start=1):
        rid = x.run_id
        assert await _texts(pool, rid) == [f"{rid} m{i}" for i in range(n)]
        got = await _rows_of(pool, x)
        assert got["events"] == [(i + 1, rid, WORKER, x.attempt) for i in range(n + 1)]
        assert got["files"] == [(f"/f{i}", f"{rid} {i}") for i in range(n)]
        assert got["states"] == [(t, rid) for t in range(n)]
        run = ("succeeded", None, True) if o else ("running", WORKER, False)
        assert got["run"] == [(*run, f"todo of {rid}")]
    assert done == [claims[1].run_id]
    outputs = "SELECT output::text FROM runs WHERE id = ANY($1::uuid[]) ORDER BY id"
    ids = sorted(x.run_id for x in claims)
    want = {claims[1].run_id: '[{"n": 1}]'}  # a structured answer (agent/middlewares/output.py)
    assert [r[0] for r in await pool.fetch(outputs, ids)] == [want.get(i) for i in ids]


async def test_next_landing_is_none_when_idle_and_done_when_the_commit_returns(
    pool: asyncpg.Pool,
) -> None:
    gc = GroupCommit(pool)
    assert gc.next_landing() is None  # nothing in flight
    held = await _hold(gc)  # a lone write in flight
    landing = gc.next_landing()
    assert landing is not None and not landing.done()
    queued = asyncio.ensure_future(gc.fetchrow("SELECT 1 AS fenced"))  # behind it
    await asyncio.wait_for(landing, timeout=10)
    assert held.done()  # it landed with the write in flight
    second = gc.next_landing()  # the queued write now commits
    assert second is not None
    await asyncio.wait_for(second, timeout=10)
    assert (await queued)["fenced"] == 1
    assert gc.next_landing() is None


async def test_landed_returns_when_the_commit_in_flight_returns_or_after_its_bound(
    pool: asyncpg.Pool,
) -> None:
    gc = GroupCommit(pool)
    await asyncio.wait_for(gc.landed(30.0), timeout=1)  # nothing in flight: at once
    held = await _hold(gc)
    await asyncio.wait_for(gc.landed(30.0), timeout=10)
    assert held.done()  # it returned with the commit, not after its bound
    slow = asyncio.ensure_future(gc.fetchrow("SELECT 1 AS fenced FROM pg_sleep(2)"))
    await asyncio.sleep(0)
    await asyncio.wait_for(gc.landed(0.01), timeout=1)  # bounded: the commit goes on
    assert not slow.done()
    assert (await slow)["fenced"] == 1


def _worker(pool: asyncpg.Pool, dsn: str, gc: GroupCommit) -> Worker:
    deps = RunDeps(pool, settings(dsn, worker_concurrency=4), Registry([]), scripted(), "w")
    deps.writer = gc
    return Worker(deps, dsn)


async def test_the_claim_waits_for_the_commit_in_flight_when_runs_are_running(
    pool: asyncpg.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run ended while a group commit is in flight: the claim waits for that commit
    (the runs it ends free their slots too) and then counts the free slots; with no run
    in flight it claims at once."""
    monkeypatch.setattr(worker_module, "LANDING_WAIT_S", 30.0)
    gc = GroupCommit(pool)
    worker = _worker(pool, dsn, gc)
    (c,) = await _claimed(pool, 1)
    forever = asyncio.ensure_future(asyncio.Event().wait())
    worker._inflight[c.run_id] = InFlight(c, RunControl(), forever, 0.0)  # type: ignore[arg-type]
    held = await _hold(gc)
    free = await asyncio.wait_for(worker._after_landing(), timeout=10)
    assert held.done() and free == 3
    assert (
        await asyncio.wait_for(worker._after_landing(), timeout=1) == 3
    )  # nothing committing: at once
    forever.cancel()


async def test_the_claim_waits_for_a_slow_commit_only_a_moment(
    pool: asyncpg.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "LANDING_WAIT_S", 0.01)
    gc = GroupCommit(pool)
    worker = _worker(pool, dsn, gc)
    held = asyncio.ensure_future(gc.fetchrow("SELECT 1 AS fenced FROM pg_sleep(2)"))
    await asyncio.sleep(0)
    assert await asyncio.wait_for(worker._after_landing(), timeout=1) == 4
    assert not held.done()
    await held
