"""Live text for `runs watch` in other processes: deltas batched into NOTIFYs.

Per delta the worker only appends to an in-memory buffer; a flush task sends
what accumulated, at most every `interval_s`, one `pg_notify` per run — never
a row per delta, never work in the middleware chain; all runs' news of one flush
go in one statement (sql.NOTIFY_MANY). Each chunk carries its
character offset in the run's text, so a watcher can merge late chunks with
the committed `model_message` events without printing anything twice. A burst
bigger than one NOTIFY payload (Postgres refuses 8000 bytes or more) is split
into several, measured in encoded bytes and never inside a character, so no
text is dropped whatever the script.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

import asyncpg

from hango_worker.store.sql import NOTIFY, NOTIFY_MANY, TEXT_CHANNEL

log = logging.getLogger(__name__)

MAX_PAYLOAD = 7000  # bytes; Postgres refuses NOTIFY payloads of 8000 bytes or more


def _cost(ch: str) -> int:
    """Bytes `ch` takes inside a JSON string as `json.dumps` writes it (ASCII-only)."""
    if " " <= ch < "\x7f" and ch not in '"\\':
        return 1
    return len(json.dumps(ch)) - 2  # \n: 2, \u00e9: 6, an astral character: 12


def payloads(run_id: str, offset: int, text: str, limit: int = MAX_PAYLOAD) -> list[str]:
    """`text` as NOTIFY payloads of at most `limit` bytes each, in order, split only
    between characters; each carries the character offset it starts at."""
    envelope = len(json.dumps({"run_id": run_id, "offset": offset + len(text), "text": ""}))
    budget = limit - envelope
    assert budget >= 12, "the payload limit leaves no room for text"
    # JSON escapes each character on its own, so the text's escaped length is the sum of
    # `_cost` over its characters: when it fits, the one payload the loop below would
    # make, without a Python call per character
    if len(json.dumps(text)) - 2 <= budget:
        return [json.dumps({"run_id": run_id, "offset": offset, "text": text})] if text else []
    out: list[str] = []
    start = used = 0
    for i, ch in enumerate(text):
        cost = _cost(ch)
        if used + cost > budget:
            out.append(
                json.dumps({"run_id": run_id, "offset": offset + start, "text": text[start:i]})
            )
            start, used = i, 0
        used += cost
    if start < len(text):
        out.append(json.dumps({"run_id": run_id, "offset": offset + start, "text": text[start:]}))
    return out


class TextPublisher:
    def __init__(self, pool: asyncpg.Pool, interval_s: float = 0.2) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self._buf: dict[str, list[str]] = {}
        self._sent: dict[str, int] = {}  # characters of the run's text already published
        self._done: set[str] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, run_id: str, text: str) -> None:
        self._buf.setdefault(run_id, []).append(text)

    def forget(self, run_id: str) -> None:
        """The run ended: drop its offset once its last text is flushed."""
        self._done.add(run_id)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="hango-text-publisher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})  # a cancel of stop() itself still propagates
        with contextlib.suppress(Exception):
            await self.flush()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.flush()
            except Exception as e:  # live text is best effort; the events are the record
                log.debug("text publish failed: %s", e)

    async def flush(self) -> None:
        buf, self._buf = self._buf, {}
        done, self._done = self._done, set()
        out: list[str] = []
        for run_id, parts in buf.items():
            text = "".join(parts)
            start = self._sent.get(run_id, 0)
            self._sent[run_id] = start + len(text)
            out += payloads(run_id, start, text)
        if len(out) == 1:
            await self.pool.execute(NOTIFY, TEXT_CHANNEL, out[0])
        elif out:
            await self.pool.fetchval(NOTIFY_MANY, TEXT_CHANNEL, out)
        for run_id in done:
            self._sent.pop(run_id, None)
