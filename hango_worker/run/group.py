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
- **Errors**: a statement error rolls the whole transaction back, so nothing of the batch
  is written; each write is then sent again in a transaction of its own, and only the
  faulty one gets the error. A connection error reaches every run of the batch, and each
  retries on its own (PgRunIO._fenced, with_reconnect), exactly as a lone write would.

See docs/scaling.md ("Group commit").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import asyncpg

from hango_worker.run.io import CONNECTION_ERRORS
from hango_worker.telemetry import metrics

log = logging.getLogger(__name__)

MAX_BATCH = 64  # statements per shared transaction


@dataclass(slots=True)
class _Write:
    query: str
    args: tuple[Any, ...]
    done: asyncio.Future[Any]


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

    async def fetchrow(self, query: str, *args: Any) -> Any:
        """The statement's row, once the transaction that carried it has committed."""
        if not self._busy():
            return await self._direct(query, args)
        w = _Write(query, args, asyncio.get_running_loop().create_future())
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
                    raise
                log.exception("group commit failed")

    async def _commit(self, batch: list[_Write]) -> None:
        metrics.CHECKPOINT_BATCH.observe(len(batch))
        if len(batch) == 1:
            await self._alone(batch[0])
            return
        # one lock order for every transaction that locks several runs rows (the
        # heartbeat's UPDATE walks runs_pkey): no deadlock between them
        batch.sort(key=lambda w: str(w.args[0]) if w.args else "")
        try:
            async with self.pool.acquire() as con, con.transaction():
                rows = [await con.fetchrow(w.query, *w.args) for w in batch]
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
        for w, row in zip(batch, rows, strict=True):
            _settle(w, row)

    async def _alone(self, w: _Write) -> None:
        if w.done.done():
            return
        try:
            row = await self.pool.fetchrow(w.query, *w.args)
        except Exception as e:
            _settle(w, error=e)
        else:
            _settle(w, row)
