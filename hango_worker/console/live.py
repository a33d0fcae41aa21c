"""A run's live text as server-sent events.

One LISTEN connection per console process (`TextHub`) receives the workers' batched
`hango_text` NOTIFYs (run/stream.py) and hands each chunk to the streams following
that run. Each stream renders with the CLI's own `LiveView` (render.py: every
character once, whether it first arrives streamed or in a committed event; terminal
escapes dropped) into plain text the page appends with `textContent` — never parsed
as HTML. Committed events are read every `poll_s`; the stream ends (`end`) when the
run finishes or waits for a person, and the page reloads to show that.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from hango_worker.render import LiveView, Painter
from hango_worker.store import db, repo
from hango_worker.store.sql import TEXT_CHANNEL
from hango_worker.vocab import FINISHED, RunStatus

log = logging.getLogger(__name__)

HEARTBEAT_S = 15.0
QUEUE_MAX = 1000  # chunks a slow reader may fall behind before it misses streamed text


class TextHub:
    """Fans the `hango_text` NOTIFY stream out to the streams following each run."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: asyncpg.Connection | None = None
        self.subs: dict[str, set[asyncio.Queue[tuple[int, str]]]] = {}
        self._lock = asyncio.Lock()
        self.closing = False  # the server is stopping: streams end at their next poll

    async def _ensure(self) -> None:
        async with self._lock:
            if self.conn is not None and not self.conn.is_closed():
                return
            self.conn = await db.connect(self.dsn)
            await self.conn.add_listener(TEXT_CHANNEL, self._on_text)

    def _on_text(self, conn: object, pid: int, channel: str, payload: str) -> None:
        with contextlib.suppress(ValueError, KeyError, TypeError):  # not ours: ignored
            msg = json.loads(payload)
            for q in self.subs.get(msg["run_id"], ()):
                with contextlib.suppress(asyncio.QueueFull):  # the events still carry it
                    q.put_nowait((int(msg["offset"]), str(msg["text"])))

    async def subscribe(self, run_id: str) -> asyncio.Queue[tuple[int, str]]:
        try:
            await self._ensure()
        except Exception as e:  # best effort: the committed events still arrive
            log.warning("live text unavailable: %s", e)
        q: asyncio.Queue[tuple[int, str]] = asyncio.Queue(QUEUE_MAX)
        self.subs.setdefault(run_id, set()).add(q)
        return q

    def unsubscribe(self, run_id: str, q: asyncio.Queue[tuple[int, str]]) -> None:
        qs = self.subs.get(run_id, set())
        qs.discard(q)
        if not qs:
            self.subs.pop(run_id, None)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def stream_over(run: dict[str, Any]) -> bool:
    """The run produces no more text until someone acts: finished, or waiting for a
    person (a run waiting for its subagents goes on)."""
    waiting = run.get("waiting_for")
    children = isinstance(waiting, dict) and waiting.get("reason") == "children"
    return run["status"] in FINISHED or (run["status"] == RunStatus.WAITING and not children)


async def follow(
    pool: asyncpg.Pool, hub: TextHub, tenant_id: str, run_id: str, poll_s: float = 0.25
) -> AsyncIterator[bytes]:
    """The run's live view as SSE messages, from its first event, until `stream_over`."""
    out = io.StringIO()
    view = LiveView(Painter(out), run_id)
    q = await hub.subscribe(run_id)
    seen, quiet = 0, 0.0
    try:
        yield b"retry: 2000\n\n"
        while True:
            while not q.empty():
                offset, text = q.get_nowait()
                view.delta(run_id, text, offset)
            run = await repo.get_run(pool, tenant_id, run_id)
            for e in await repo.run_events(pool, run_id, after=seen):
                view.event(e)
                seen = e["seq"]
            if chunk := out.getvalue():
                out.seek(0)
                out.truncate()
                quiet = 0.0
                yield sse("text", {"text": chunk})
            if stream_over(run):
                yield sse("end", {"status": run["status"]})
                return
            if hub.closing:
                return
            quiet += poll_s
            if quiet >= HEARTBEAT_S:
                quiet = 0.0
                yield b": keep-alive\n\n"
            with contextlib.suppress(TimeoutError):
                offset, text = await asyncio.wait_for(q.get(), poll_s)
                view.delta(run_id, text, offset)
    finally:
        hub.unsubscribe(run_id, q)
