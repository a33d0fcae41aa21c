"""A LISTEN connection that wakes the worker, re-established when it drops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import asyncpg

from hango_worker.store import db
from hango_worker.store.sql import CANCEL_CHANNEL, NOTIFY_CHANNEL

log = logging.getLogger(__name__)


class Listener:
    def __init__(self, dsn: str, on_enqueue: Callable[[], None], on_cancel: Callable[[str], None]):
        self.dsn = dsn
        self.on_enqueue = on_enqueue
        self.on_cancel = on_cancel
        self._task: asyncio.Task[None] | None = None
        self._lost = asyncio.Event()
        self.connected = asyncio.Event()
        self.reconnects = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="hango-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # asyncio.wait, not `suppress(CancelledError): await`: that would also swallow
            # a cancel of stop() itself (a bounded shutdown step given up: run/bounded.py)
            await asyncio.wait({self._task})

    def _notified(self, conn: object, pid: int, channel: str, payload: str) -> None:
        if channel == NOTIFY_CHANNEL:
            self.on_enqueue()
        elif channel == CANCEL_CHANNEL:
            self.on_cancel(payload)

    async def _run(self) -> None:
        delay = 0.2
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await db.connect(self.dsn)
                self._lost.clear()
                conn.add_termination_listener(lambda c: self._lost.set())
                await conn.add_listener(NOTIFY_CHANNEL, self._notified)
                await conn.add_listener(CANCEL_CHANNEL, self._notified)
                self.connected.set()
                self.on_enqueue()  # anything queued while we were away
                delay = 0.2
                await self._watch(conn)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("LISTEN connection failed (%s); retrying in %.1fs", e, delay)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            self.reconnects += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _watch(self, conn: asyncpg.Connection) -> None:
        """Return when the connection is gone (termination or a failed liveness probe)."""
        while not self._lost.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._lost.wait(), timeout=10.0)
            if not self._lost.is_set():
                await asyncio.wait_for(conn.execute("SELECT 1"), timeout=5.0)
