"""Group commit: the fenced writes of concurrent runs in one worker share one transaction.

Every checkpoint, finish and recorded tool result of a run is one fenced statement
(store/sql.py). A run hands its statement to the worker's GroupCommit and waits; the
statements that arrive while the previous commit is still in flight go together, in
run-id order, in one transaction: one commit, one WAL flush (fsync) for all of them.

- **Per-run fencing**: each statement carries its own run's fence and reports its own
  `fenced` count; a run whose lease was lost matches no row and is told so alone,
  while the other runs' writes in the same transaction commit.
- **Durable before resuming**: a run's wait ends only after the shared COMMIT returned.
- **Adaptive window**: no timer. A write that finds no commit in flight goes at once, on
  its own (one round trip, as without group commit); the batch grows only while a commit
  is in flight, i.e. with load.
- **One statement for the checkpoints**: a run's checkpoint comes as its record
  (`write`, a store/turn.py `TurnWrite`); the checkpoints of several runs in a batch go
  as one `sql.CHECKPOINT_MANY` (one round trip, one executor start), its arrays made
  from the records by field name (turn.checkpoint_many_args), each run still fenced and
  reported on its own row; other writes go beside it in the transaction.
- **Errors**: a statement error rolls the whole transaction back, so nothing of the batch
  is written; each write is then sent again in a transaction of its own, and only the
  faulty one gets the error. A connection error reaches every run of the batch, and each
  retries on its own (PgRunIO._fenced, with_reconnect), exactly as a lone write would.

See docs/scaling.md ("Group commit").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg

from hango_worker.run.io import CONNECTION_ERRORS
from hango_worker.store import sql, turn
from hango_worker.store.turn import FencedWrite, TurnWrite
from hango_worker.telemetry import metrics

log = logging.getLogger(__name__)

MAX_BATCH = 64  # statements per shared transaction


@dataclass(slots=True)
class _Write:
    query: str
    args: tuple[Any, ...]  # a plain statement's; a record's come from the record
    done: asyncio.Future[Any]
    record: FencedWrite | None = None  # a run's checkpoint or tool result

    def params(self) -> tuple[Any, ...]:
        return self.args if self.record is None else self.record.args()

    def run(self) -> str:
        """The run it writes (its first argument, for a plain statement)."""
        if self.record is not None:
            return self.record.run_id
        return str(self.args[0]) if self.args else ""


def _settle(w: _Write, row: Any = None, error: BaseException | None = None) -> None:
    if w.done.done():  # its run stopped waiting (cancelled): nobody to tell
        return
    if error is not None:
        w.done.set_exception(error)
    else:
        w.done.set_result(row)


class GroupCommit:
    """One per worker: `fetchrow` a fenced statement; it commits with its neighbours."""

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = MAX_BATCH) -> None:
        self.pool = pool
        self.max_batch = max_batch
        self._pending: list[_Write] = []
        self._flusher: asyncio.Task[None] | None = None
        self._lone = False  # a write sent at once (`_direct`) is in flight
        self._landing: list[asyncio.Future[None]] = []  # woken when a commit returns

    def next_landing(self) -> asyncio.Future[None] | None:
        """A future done when the commit in flight now returns (its runs then finish);
        None when nothing is in flight. The worker's claim waits for it, so that the
        runs a commit ends are replaced by one claim, not one claim each."""
        if not self._busy():
            return None
        f = asyncio.get_running_loop().create_future()
        self._landing.append(f)
        return f

    async def landed(self, within: float) -> None:
        """Return once the commit in flight now has returned, or after `within` seconds
        (at once when nothing is in flight), and one loop step later, so that the runs it
        ended have finished their tasks (freed their slots)."""
        landing = self.next_landing()
        if landing is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(landing, within)
        await asyncio.sleep(0)

    async def settled(self, within: float) -> bool:
        """Return once no write is in flight or queued (each one handed to it has
        committed or failed), or after `within` seconds; whether it settled. A stopping
        worker asks it before closing the pool, so that its last writes land first."""
        loop = asyncio.get_running_loop()
        until = loop.time() + within
        while (landing := self.next_landing()) is not None or self._pending:
            left = until - loop.time()
            if left <= 0:
                return False
            if landing is None:  # queued, its flusher not started yet: a loop step
                await asyncio.sleep(0.001)
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(landing, left)
        return True

    def _landed(self) -> None:
        waiting, self._landing = self._landing, []
        for f in waiting:
            if not f.done():
                f.set_result(None)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        """The statement's row, once the transaction that carried it has committed."""
        if not self._busy():
            return await self._direct(query, args)
        w = _Write(query, args, asyncio.get_running_loop().create_future())
        self._pending.append(w)
        return await w.done

    async def write(self, record: FencedWrite) -> Any:
        """A run's record, written with its statement (sql.STATEMENT_OF): its row, once
        the transaction that carried it has committed."""
        query = sql.STATEMENT_OF[type(record)]
        if not self._busy():
            return await self._direct(query, record.args())
        w = _Write(query, (), asyncio.get_running_loop().create_future(), record)
        self._pending.append(w)
        return await w.done

    def _busy(self) -> bool:
        return self._lone or (self._flusher is not None and not self._flusher.done())

    async def _direct(self, query: str, args: tuple[Any, ...]) -> Any:
        """Nothing in flight: the write goes at once, alone, from the run's own task (no
        hand-over to the flusher: one task and two loop iterations fewer per lone write).
        Writes arriving meanwhile queue, and go together once it has returned."""
        self._lone = True
        try:
            metrics.CHECKPOINT_BATCH.observe(1)
            return await self.pool.fetchrow(query, *args)
        finally:
            self._lone = False
            self._landed()
            if self._pending:
                self._flusher = asyncio.create_task(self._flush(), name="hango-group-commit")

    async def _flush(self) -> None:
        while self._pending:
            taken, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            batch = [w for w in taken if not w.done.done()]  # a cancelled run writes nothing
            if not batch:
                continue
            try:
                await self._commit(batch)
            except BaseException as e:  # never leave a run waiting forever
                for w in batch:
                    _settle(w, error=e)
                if isinstance(e, asyncio.CancelledError):
                    for w in self._pending:
                        _settle(w, error=e)
                    self._pending = []
                    self._landed()
                    raise
                log.exception("group commit failed")
            self._landed()

    async def _commit(self, batch: list[_Write]) -> None:
        metrics.CHECKPOINT_BATCH.observe(len(batch))
        if len(batch) == 1:
            await self._alone(batch[0])
            return
        # one lock order for every transaction that locks several runs rows (the
        # heartbeat's UPDATE walks runs_pkey): no deadlock between them
        batch.sort(key=_Write.run)
        merged, turns, rest = _mergeable(batch)
        try:
            if merged and not rest:  # the checkpoints only: one statement, autocommit
                args = turn.checkpoint_many_args(turns)
                results = _by_run(merged, turns, await self.pool.fetch(sql.CHECKPOINT_MANY, *args))
            else:
                async with self.pool.acquire() as con, con.transaction():
                    results = []
                    if merged:
                        args = turn.checkpoint_many_args(turns)
                        rows = await con.fetch(sql.CHECKPOINT_MANY, *args)
                        results = _by_run(merged, turns, rows)
                    results += [(w, await con.fetchrow(w.query, *w.params())) for w in rest]
        except CONNECTION_ERRORS as e:
            for w in batch:
                _settle(w, error=e)
            return
        except asyncpg.PostgresError as e:
            log.warning("a statement of a group commit failed (%s); committing each alone", e)
            metrics.GROUP_COMMIT_SPLITS.inc()
            for w in batch:
                await self._alone(w)
            return
        if merged:
            metrics.CHECKPOINTS_MERGED.inc(len(merged))
        for w, row in results:
            _settle(w, row)

    async def _alone(self, w: _Write) -> None:
        if w.done.done():
            return
        try:
            row = await self.pool.fetchrow(w.query, *w.params())
        except Exception as e:
            _settle(w, error=e)
        else:
            _settle(w, row)


def _mergeable(batch: list[_Write]) -> tuple[list[_Write], list[TurnWrite], list[_Write]]:
    """The batch's checkpoints that can share one CHECKPOINT_MANY (two or more, one per
    run), their records, and the other writes."""
    merged: list[_Write] = []
    turns: list[TurnWrite] = []
    rest: list[_Write] = []
    runs: set[str] = set()
    for w in batch:
        rec = w.record
        if type(rec) is TurnWrite and rec.run_id not in runs:
            runs.add(rec.run_id)
            merged.append(w)
            turns.append(rec)
        else:
            rest.append(w)
    if len(merged) < 2:
        return [], [], batch
    return merged, turns, rest


def _by_run(
    writes: list[_Write], turns: list[TurnWrite], rows: list[Any]
) -> list[tuple[_Write, Any]]:
    """Each checkpoint with its run's row of CHECKPOINT_MANY ({id, fenced, cancel})."""
    found = {r["id"]: r for r in rows}
    return [(w, found.get(t.run_id)) for w, t in zip(writes, turns, strict=True)]
