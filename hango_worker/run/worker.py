"""The worker: poll/LISTEN, claim in batches, lease + heartbeat, run, shut down.

See docs/system-architecture.md (steps 2-3, 7-8). Per worker (not per run): one
heartbeat statement renews every lease it holds, one LISTEN connection, one
reclaim/queue-stats sweep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field

import asyncpg

from hango_worker.agent.control import RunControl
from hango_worker.agent.ports import Fenced
from hango_worker.run.bounded import close_pool, within
from hango_worker.run.claim import Claim
from hango_worker.run.execute import RunDeps, execute, fail_run, run_control
from hango_worker.run.group import GroupCommit
from hango_worker.run.io import CONNECTION_ERRORS, discard_connections
from hango_worker.run.listener import Listener
from hango_worker.run.retention import retention_loop
from hango_worker.run.schema_gate import SchemaGate, schema_mismatch
from hango_worker.run.stream import TextPublisher
from hango_worker.run.sweep import sweep
from hango_worker.store import db, sql
from hango_worker.telemetry import metrics
from hango_worker.telemetry.logs import current_run_id
from hango_worker.vocab import ErrorType

log = logging.getLogger(__name__)

LANDING_WAIT_S = 0.05  # the longest a claim waits for the commit in flight
# Shutdown bounds (docs/system-architecture.md, "Graceful shutdown"): after the grace,
# the runs still going are cancelled and get STOP_WAIT_S to unwind; every closing step
# after that (the claim in flight, the last writes, the hand-back, connections) gets
# CLOSE_WAIT_S. The worker is done within the grace plus STOP_BOUND_S, whatever its
# runs, the database or the provider are doing.
STOP_WAIT_S = 5.0
CLOSE_WAIT_S = 2.0
STOP_BOUND_S = STOP_WAIT_S + 4 * CLOSE_WAIT_S

_CRASHED = (
    "the worker hit an unexpected error running this run; see the worker log for the traceback"
)


@dataclass(slots=True)
class InFlight:
    claim: Claim
    control: RunControl  # what the worker tells the run: cancel, shut down, lost
    task: asyncio.Task[None]
    started: float


@dataclass(slots=True)
class WorkerStats:
    claimed: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    lost: int = 0


class Worker:
    def __init__(self, deps: RunDeps, dsn: str) -> None:
        self.deps = deps
        if deps.writer is None:  # checkpoints of concurrent runs share commits
            deps.writer = GroupCommit(deps.pool)
        self.dsn = dsn
        self.settings = deps.settings
        self.worker_id = deps.worker_id
        self.stats = WorkerStats()
        self._inflight: dict[str, InFlight] = {}
        self._wake = asyncio.Event()
        self._stopping = False
        self._stop = asyncio.Event()  # set by request_shutdown
        self._tasks: set[asyncio.Task[None]] = set()  # every run task not yet done
        self._gave_up: list[tuple[str, int]] = []  # runs cancelled mid-turn: (id, attempt)
        self._hints: set[asyncio.Task[None]] = set()  # cancel hints being checked
        self._listener = Listener(dsn, self._wake.set, self._on_cancel)
        self._background: list[asyncio.Task[None]] = []
        self._claim_pool: asyncpg.Pool | None = None  # sql.CLAIM_SESSION_SETTINGS
        every = self.settings.schema_check_interval_s
        self.gate = SchemaGate(deps.pool, every_s=every, blocked_every_s=min(every, 5.0))
        metrics.set_slots(0, self.settings.worker_concurrency)
        metrics.init_tool_series(deps.registry.names())

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self, *, until_idle: bool = False) -> WorkerStats:
        """Claim and run until shut down (or, with until_idle, the queue is empty), then
        hand every run back and stop, within the grace plus a bound (`STOP_BOUND_S`)."""
        self._listener.start()
        await self._open_claim_pool()
        if self.deps.text is None:
            self.deps.text = TextPublisher(self.deps.pool)
        self.deps.text.start()
        self._background = [
            asyncio.create_task(self._heartbeat_loop(), name="hango-heartbeat"),
            asyncio.create_task(self._sweep_loop(), name="hango-sweep"),
            asyncio.create_task(
                retention_loop(self.deps.pool, self.settings.retention_interval_s, self.gate),
                name="hango-retention",
            ),
        ]
        log.info("worker started", extra={"worker_id": self.worker_id})
        try:
            await self._claim_until_stopped(until_idle)
            await self._drain()
        finally:
            await self._close()
        return self.stats

    async def _claim_until_stopped(self, until_idle: bool) -> None:
        """The claim loop, until idle or shut down. A claim in flight when the shutdown
        comes gets CLOSE_WAIT_S to return (its runs then start, already stopping) and is
        abandoned after that: a statement on a connection that stopped answering must not
        hold the stop up (its transaction is rolled back with the connection)."""
        main = asyncio.ensure_future(self._main(until_idle))
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({main, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not main.done():
                await within(main, CLOSE_WAIT_S, "the claim in flight")
        finally:
            stop.cancel()
        if main.done() and not main.cancelled() and (err := main.exception()) is not None:
            raise err

    async def _close(self) -> None:
        """Stop the per-worker tasks and connections together, each bounded: one stuck
        on a connection that stopped answering is abandoned, never awaited forever."""
        for t in [*self._background, *self._hints]:
            t.cancel()
        text = self.deps.text
        steps: list[Awaitable[object]] = [
            within(asyncio.wait(self._background), CLOSE_WAIT_S, "the heartbeat and sweep"),
            within(self._listener.stop(), CLOSE_WAIT_S, "the LISTEN connection"),
        ]
        if text is not None:
            steps.append(within(text.stop(), CLOSE_WAIT_S, "the last live text"))
        if self._claim_pool is not None:
            steps.append(close_pool(self._claim_pool, CLOSE_WAIT_S, "the claim connection"))
        await asyncio.gather(*steps)

    async def _open_claim_pool(self) -> None:
        """The claim's own connection (sql.CLAIM_SESSION_SETTINGS); the shared pool if it
        cannot be opened now (the claim handles an unreachable database itself)."""
        try:
            self._claim_pool = await db.create_pool(
                self.dsn, min_size=1, max_size=1, server_settings=sql.CLAIM_SESSION_SETTINGS
            )
        except Exception as e:
            log.warning("claim connection not opened (%s); claiming on the shared pool", e)

    def request_shutdown(self) -> None:
        """First call: stop claiming, hand runs back at their next turn boundary (a run
        waiting out a backoff or the rate limit: at once). Second call: cancel
        everything now (the cancelled runs are handed back, `_hand_back`)."""
        if self._stopping:
            log.warning("second shutdown signal: abandoning runs in flight")
            for t in self._tasks:
                t.cancel()
            return
        self._stopping = True
        self._stop.set()
        log.info(
            "shutdown requested: claiming stopped; %d runs in flight get %gs to finish their "
            "calls and reach a turn boundary, then are handed back",
            len(self._inflight),
            self.settings.shutdown_grace_s,
        )
        for f in self._inflight.values():
            f.control.shutdown = True
        self._wake.set()

    async def _drain(self) -> None:
        """Every run stops at its next turn boundary within the grace and is handed back
        (`released`); the ones left then are cancelled, get STOP_WAIT_S to unwind and
        are handed back by one statement. The last writes land before the pool closes."""
        tasks = set(self._tasks)  # every run task, a previous attempt's included
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=self.settings.shutdown_grace_s)
            if pending:
                log.warning(
                    "%d runs did not reach a turn boundary within the grace period", len(pending)
                )
                for t in pending:
                    t.cancel()
                await asyncio.wait(pending, timeout=STOP_WAIT_S)
        if isinstance(self.deps.writer, GroupCommit):
            await self.deps.writer.settled(CLOSE_WAIT_S)
        await self._hand_back()

    async def _hand_back(self) -> None:
        """The runs this worker gave up on (cancelled, not lost) go back to the queue at
        once (sql.HAND_BACK), instead of holding their lease until it expires. Bounded:
        with the database away, their leases expire as after a crash."""
        gave_up, self._gave_up = self._gave_up, []
        if not gave_up:
            return
        ids = [rid for rid, _ in gave_up]
        attempts = [a for _, a in gave_up]

        async def hand_back() -> None:
            rows = await self.deps.pool.fetch(sql.HAND_BACK, self.worker_id, ids, attempts)
            metrics.RUNS_HANDED_BACK.inc(len(rows))
            log.warning("shutdown: %d runs cancelled mid-turn were handed back", len(rows))

        await within(hand_back(), CLOSE_WAIT_S, "handing back the runs cancelled mid-turn")

    # -- claiming ----------------------------------------------------------------------------

    async def _main(self, until_idle: bool) -> None:
        while not self._stopping:
            self._wake.clear()
            free = self.settings.worker_concurrency - len(self._inflight)
            # idle only if nothing ran while the claim looked: a run ending during the
            # claim may have queued another (a parent woken) after the claim's snapshot
            busy = bool(self._inflight)
            if busy and free > 0:
                free = await self._after_landing()
            # outside the schema range this code serves: claim nothing (run/schema_gate.py)
            claimed = await self._claim(free) if free > 0 and await self.gate.open() else 0
            if until_idle and claimed == 0 and not busy and not self._inflight:
                return
            if claimed and claimed == free:
                continue
            # woken by new work (LISTEN), a run ending (a slot free: _execute) or the poll
            timeout = self.settings.poll_interval_s * random.uniform(0.8, 1.2)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _after_landing(self) -> int:
        """Free slots once the group commit in flight has returned (at most a moment): the
        runs it ends free their slots together and one claim fills them, instead of a
        claim per run (a claim costs Postgres about as much for one run as for eight)."""
        if isinstance(self.deps.writer, GroupCommit):
            await self.deps.writer.landed(LANDING_WAIT_S)
        return self.settings.worker_concurrency - len(self._inflight)

    async def _claim(self, n: int) -> int:
        pool = self._claim_pool or self.deps.pool
        try:
            rows = await pool.fetch(sql.CLAIM, self.worker_id, n, self.settings.lease_s)
        except CONNECTION_ERRORS as e:
            log.warning("claim failed, database unreachable: %s", e)
            await discard_connections(pool)
            await asyncio.sleep(0.2)
            return 0
        except Exception as e:  # never let one bad claim take the worker down
            if schema_mismatch(e):  # the schema changed under us: one line, check it now
                log.warning("claim failed on the schema (%s): checking it", e)
                self.gate.suspect()
                return 0
            log.exception("claim failed")
            await asyncio.sleep(1.0)
            return 0
        claims = [Claim.from_record(r) for r in rows]  # never raises on a row's content
        sessions: set[str] = set()
        again: list[Claim] = []
        for c in claims:
            if c.session_id in sessions:  # one run per session at a time
                again.append(c)
                continue
            sessions.add(c.session_id)
            metrics.QUEUE_WAIT.observe(c.queued_s)
            self._start(c)
        for c in again:
            with contextlib.suppress(Exception):  # else its lease expires and it is reclaimed
                await self.deps.pool.execute(sql.UNCLAIM, c.run_id, self.worker_id, c.attempt)
        return len(claims) - len(again)

    def _start(self, c: Claim) -> None:
        metrics.RUNS_CLAIMED.inc()
        self.stats.claimed += 1
        control = run_control(self.deps, c)
        control.shutdown = self._stopping
        # The run may be claimed again while its previous attempt's task is still ending
        # (a parent woken by its children right after its `waiting` checkpoint): the new
        # task waits for the old one, and each removes only its own entry. The old task
        # once removed the new entry, so `until_idle` stopped with the new attempt still
        # running and the pool closed under it (tests/test_shutdown.py).
        before = self._inflight.get(c.run_id)
        after = before.task if before is not None else None
        task = asyncio.create_task(self._execute(c, control, after), name=f"run-{c.run_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._inflight[c.run_id] = InFlight(c, control, task, time.perf_counter())
        metrics.set_slots(len(self._inflight), self.settings.worker_concurrency)

    async def _execute(
        self, c: Claim, control: RunControl, after: asyncio.Task[None] | None
    ) -> None:
        current_run_id.set(c.run_id)  # this task's context only
        status = "lost"
        try:
            if after is not None:
                await asyncio.wait({after})
            outcome = await execute(self.deps, c, control)
            status = outcome.status if outcome else "lost"
            if outcome is not None and outcome.status == "failed":
                etype = (outcome.error or {}).get("type")
                metrics.RUNS_FAILED.labels(metrics.error_type_label(etype)).inc()
        except Fenced:
            log.warning("lease lost; abandoning run", extra={"run_id": c.run_id})
        except asyncio.CancelledError:
            status = "abandoned"
            if not control.lost:  # ours still: handed back at shutdown (_hand_back)
                self._gave_up.append((c.run_id, c.attempt))
        except Exception:
            log.exception("run crashed", extra={"run_id": c.run_id})
            status = await self._fail_crashed(c, control)
        finally:
            if self.deps.text is not None:
                self.deps.text.forget(c.run_id)
            f = self._inflight.get(c.run_id)
            if f is not None and f.task is asyncio.current_task():
                del self._inflight[c.run_id]
            else:
                f = None  # a newer attempt of the run holds the entry
            self._wake.set()  # a slot is free: the claim loop looks again
            metrics.set_slots(len(self._inflight), self.settings.worker_concurrency)
            self._account(status, f)

    def _account(self, status: str, f: InFlight | None) -> None:
        self.stats.finished[status] = self.stats.finished.get(status, 0) + 1
        if status in ("lost", "abandoned"):
            self.stats.lost += 1
            metrics.LEASE_LOST.inc()
            return
        metrics.child(metrics.RUNS_FINISHED, status).inc()
        if f is not None:
            metrics.child(metrics.RUN_DURATION, status).observe(time.perf_counter() - f.started)

    async def _fail_crashed(self, c: Claim, control: RunControl) -> str:
        error = {"type": ErrorType.INTERNAL_ERROR, "message": _CRASHED}
        try:
            await fail_run(self.deps, c, control, error)
            return "failed"
        except Exception:
            return "lost"

    def _on_cancel(self, run_id: str) -> None:
        """A `hango_cancel` NOTIFY: a hint to look, never an order. Any role that can
        connect may send one; the run is cancelled only when its row says so
        (`cancel_requested`, written by `hango_api.cancel` / `runs cancel`, which check
        tenant and role). docs/operations.md, "Trust model"."""
        f = self._inflight.get(run_id)
        if f is None or f.control.cancel.is_set():
            return
        check = asyncio.ensure_future(self._check_cancel(run_id, f))
        self._hints.add(check)
        check.add_done_callback(self._hints.discard)

    async def _check_cancel(self, run_id: str, f: InFlight) -> None:
        try:
            requested = await self.deps.pool.fetchval(
                sql.CANCEL_REQUESTED, run_id, self.worker_id, f.claim.attempt
            )
        except Exception as e:  # the heartbeat reads the flag within a third of a lease
            log.warning("cancel hint for run %s not checked: %s", run_id, e)
            metrics.CANCEL_HINTS.labels("unchecked").inc()
            return
        if requested:
            f.control.cancel.set()
        metrics.CANCEL_HINTS.labels("acted" if requested else "ignored").inc()

    # -- per-worker background work ------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        interval = self.settings.lease_s / 3
        while True:
            await asyncio.sleep(interval)
            try:
                await self.heartbeat()
            except Exception:  # a background loop must outlive any one failure
                log.exception("heartbeat failed")

    async def heartbeat(self) -> None:
        ids = [rid for rid, f in self._inflight.items() if not f.control.lost]
        if not ids:
            return
        try:
            rows = await self.deps.pool.fetch(
                sql.HEARTBEAT, self.worker_id, self.settings.lease_s, ids
            )
        except CONNECTION_ERRORS as e:
            log.warning("heartbeat failed, database unreachable: %s", e)
            await discard_connections(self.deps.pool)
            return
        alive = {r["id"]: r for r in rows}
        for rid in ids:
            f = self._inflight.get(rid)
            if f is None:
                continue
            r = alive.get(rid)
            if r is None or r["attempt"] != f.claim.attempt:
                f.control.lost = True  # another worker has it: stop at once, write nothing
                f.task.cancel()
            elif r["cancel_requested"]:
                f.control.cancel.set()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 2 * random.uniform(0.5, 1.0))
            if self.gate.problem is not None:  # not served: the gate logs why
                continue
            try:
                await self.sweep()
            except Exception as e:
                if schema_mismatch(e):
                    self.gate.suspect()
                    continue
                log.exception("reclaim sweep failed")

    async def sweep(self) -> int:
        """One reclaim sweep (run/sweep.py); what it changed."""
        return await sweep(
            self.deps.pool, self.worker_id, self.settings.max_attempts, self.deps.budgets
        )
