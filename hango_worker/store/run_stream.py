"""A run's events as one ordered, resumable stream: the HTTP API's `/v1/runs/{id}/events`
(console/api.py) and `Client.stream` (client.py) both read it.

Two kinds of event, each with an id that orders it within the run:

- durable events: the rows of `run_events`, id `<seq>` (their durable per-run number).
  Every status change, turn boundary, model message, tool call and result and decision
  is one. A resume after id `s` (or `s.n`) continues with the first row after `s`: no
  gap and no duplicate, whichever worker wrote them (a takeover continues the same seq).
- text deltas: the worker's live text of the turn in progress (the `hango_text`
  NOTIFYs, run/stream.py), id `<s>.<n>` where `s` is the last durable event sent and
  `n` counts from 1 (after a resume at `s.n`: from n+1). They are provisional: never
  stored, so text streamed while no one listened is not sent again; the `model_message`
  event that ends the turn carries its whole text and supersedes the deltas since the
  previous durable event. Text a durable event of the current attempt already carries
  is not sent as a delta after it: the worker counts each claim's text from offset 0
  (run/stream.py), and a claim is an attempt (`runs.attempt`, `run_events.attempt`).

The stream ends with `end` (`{"status": …}`, no id) once the run has finished.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from hango_worker.store import repo
from hango_worker.vocab import FINISHED


@dataclass(frozen=True, slots=True)
class StreamEvent:
    id: str | None  # None: the final `end` (it moves no position)
    event: str  # a run_events type, "text_delta" or "end"
    data: dict[str, Any]


def parse_event_id(raw: str | None) -> tuple[int, int]:
    """`(seq, n)` of a `Last-Event-ID` (`<seq>` or `<seq>.<n>`); (0, 0) for none.
    ValueError: not an id of this stream."""
    if raw is None or not raw.strip():
        return 0, 0
    seq, dot, n = raw.strip().partition(".")
    try:
        s, d = int(seq), int(n) if dot else 0
    except ValueError:
        raise ValueError(
            f"{raw!r} is not an event id of this stream (<seq> or <seq>.<n>)"
        ) from None
    if s < 0 or d < 0:
        raise ValueError(f"{raw!r} is not an event id of this stream (<seq> or <seq>.<n>)")
    return s, d


def durable(e: dict[str, Any]) -> dict[str, Any]:
    """A run_events row as the stream's data (JSON-ready)."""
    at = e.get("created_at")
    return {
        "seq": e["seq"],
        "type": e["type"],
        "payload": e.get("payload") or {},
        "attempt": e.get("attempt"),
        "created_at": at.isoformat() if isinstance(at, datetime) else at,
    }


def message_text(e: dict[str, Any]) -> str:
    """The assistant text a `model_message` event carries ('' for any other event)."""
    if e["type"] != "model_message":
        return ""
    content = ((e.get("payload") or {}).get("message") or {}).get("content") or []
    return "".join(
        b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
    )


class Position:
    """Where a stream stands: the last durable seq, the deltas sent since, and how much of
    the current attempt's text the durable events already carry."""

    def __init__(self, attempt: int) -> None:
        self.seq, self.n, self.attempt, self.committed = 0, 0, attempt, 0

    def claim(self, attempt: int) -> None:
        """The run's current attempt: a new one streams its text from offset 0."""
        if attempt != self.attempt:
            self.attempt, self.committed = attempt, 0

    def saw(self, e: dict[str, Any]) -> None:
        if e["seq"] > self.seq:
            self.seq, self.n = e["seq"], 0
        if e.get("attempt") == self.attempt:
            self.committed += len(message_text(e))

    def delta(self, offset: int, text: str) -> StreamEvent | None:
        """The delta to send for a chunk at `offset`, trimmed of committed text; None if
        it holds nothing new."""
        skip = max(0, self.committed - offset)
        if skip >= len(text):
            return None
        self.n += 1
        data = {"text": text[skip:], "offset": offset + skip}
        return StreamEvent(f"{self.seq}.{self.n}", "text_delta", data)


async def events(
    pool: asyncpg.Pool,
    tenant_id: str,
    run_id: str,
    deltas: asyncio.Queue[tuple[int, str]] | None,
    last_event_id: str | None = None,
    *,
    poll_s: float = 0.25,
    stopping: Callable[[], bool] = lambda: False,
) -> AsyncIterator[StreamEvent]:
    """The run's events after `last_event_id`, then live, until `end` (the run finished)
    or `stopping()`. `deltas`: the run's (offset, text) chunks, subscribed before this is
    called (None: durable events only). NotFound: no such run in this tenant."""
    seq, n = parse_event_id(last_event_id)
    run = await repo.get_run(pool, tenant_id, run_id)  # NotFound before anything is sent
    pos = Position(run["attempt"])
    for e in await repo.run_events(pool, run_id, after=0):
        if e["seq"] > seq:
            break
        pos.saw(e)  # the attempt's committed text up to the resume point
    pos.seq, pos.n = seq, n
    while True:
        run = await repo.get_run(pool, tenant_id, run_id)  # before the events: none missed
        pos.claim(run["attempt"])
        for e in await repo.run_events(pool, run_id, after=pos.seq):
            pos.saw(e)
            yield StreamEvent(str(e["seq"]), e["type"], durable(e))
        if run["status"] in FINISHED:
            yield StreamEvent(None, "end", {"status": run["status"]})
            return
        if stopping():
            return
        for offset, text in await _next_chunks(deltas, poll_s):
            if (d := pos.delta(offset, text)) is not None:
                yield d


async def _next_chunks(
    q: asyncio.Queue[tuple[int, str]] | None, wait_s: float
) -> list[tuple[int, str]]:
    """The chunks that arrive within `wait_s` (all queued ones once one has)."""
    if q is None:
        await asyncio.sleep(wait_s)
        return []
    got: list[tuple[int, str]] = []
    with contextlib.suppress(TimeoutError):
        got.append(await asyncio.wait_for(q.get(), wait_s))
    while not q.empty():
        got.append(q.get_nowait())
    return got
