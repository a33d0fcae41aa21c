"""Retention: delete finished runs' events (and optionally the runs) in bounded batches.

`hango-worker gc --older-than 30d [--runs]` calls `gc()`. What it touches:

- Only runs whose status is final (succeeded, failed, cancelled) and whose
  `finished_at` is older than the cut-off (`now() - older_than`, taken once from
  the database clock at the start). Queued and running runs are never touched.
- Events: every `run_events` row of such runs.
- Runs (`delete_runs=True`): a run goes with its messages and tool calls, and
  only when its *whole session* qualifies — every run of the session is final
  and older than the cut-off. A session's history is thus removed whole or not
  at all: a conversation that is still going (a recent or queued run in the
  same session) keeps its full history, because the next run of that session
  replays it to the model. The `sessions` rows stay.

How it stays gentle on a live database:

- Every batch is its own short transaction deleting at most about `batch_size`
  rows (a single session larger than that is deleted alone, in one
  transaction). Nothing takes a table lock; only the deleted rows and the
  parent rows being checked are locked, for the duration of one batch.
- Candidates are found with keyset pagination on the primary key, so the total
  scan work is one pass over `runs` (and `sessions`), not one per batch.
- Each batch re-checks its rows under lock: a run resumed (`runs resume`)
  between batches is skipped, and a run enqueued into a session being deleted
  either waits for the batch to commit or makes the batch skip that session.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from hango_worker.vocab import FINISHED

FINAL_STATUSES = tuple(str(s) for s in FINISHED)
_FINAL = "('succeeded', 'failed', 'cancelled')"

_AGE = re.compile(r"^\s*(\d+)\s*([dhms])\s*$")
_UNIT_SECONDS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}


def parse_age(text: str) -> datetime.timedelta:
    """'30d' | '12h' | '45m' | '90s' → timedelta; ValueError with a clear message otherwise."""
    m = _AGE.match(text) if isinstance(text, str) else None
    if m is None:
        raise ValueError(
            f"invalid age {text!r}: expected a whole number followed by one unit, "
            "d (days), h (hours), m (minutes) or s (seconds), e.g. 30d, 12h, 45m, 90s"
        )
    seconds = int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    try:
        return datetime.timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"invalid age {text!r}: too large") from None


@dataclass
class GcResult:
    """What one `gc()` call deleted. `batches` counts transactions that deleted rows."""

    cutoff: datetime.datetime | None = None
    events_deleted: int = 0
    runs_deleted: int = 0
    messages_deleted: int = 0
    blobs_deleted: int = 0  # stored content blocks no run refers to any more
    tool_calls_deleted: int = 0
    batches: int = 0

    @property
    def rows_deleted(self) -> int:
        runs = self.runs_deleted + self.messages_deleted + self.tool_calls_deleted
        return self.events_deleted + runs


# -- SQL ----------------------------------------------------------------------------------
# $cutoff is always a timestamptz; $tenant a uuid or NULL (all tenants).

_RUN_CANDIDATES = f"""
SELECT id FROM runs
WHERE status IN {_FINAL} AND finished_at < $1
  AND ($2::uuid IS NULL OR tenant_id = $2::uuid)
  {{after}}
ORDER BY id
LIMIT $3
"""
RUN_CANDIDATES_FIRST = _RUN_CANDIDATES.format(after="")
RUN_CANDIDATES_NEXT = _RUN_CANDIDATES.format(after="AND id > $4::uuid")

# One batch of events: re-check the runs under a share lock (a concurrent
# `runs resume` waits for this batch, or this batch skips the resumed run).
DELETE_EVENTS_BATCH = f"""
WITH ok AS (
    SELECT id FROM runs
    WHERE id = ANY($1::uuid[]) AND status IN {_FINAL} AND finished_at < $2
    FOR SHARE
), doomed AS (
    SELECT e.run_id, e.seq FROM run_events e JOIN ok ON ok.id = e.run_id
    LIMIT $3
)
DELETE FROM run_events d USING doomed
WHERE d.run_id = doomed.run_id AND d.seq = doomed.seq
"""

# A run that keeps its session (and so every run of the session) alive.
_BLOCKER = f"(o.status NOT IN {_FINAL} OR o.finished_at IS NULL OR o.finished_at >= $2)"

_SESSION_CANDIDATES = f"""
SELECT s.id FROM sessions s
WHERE ($1::uuid IS NULL OR s.tenant_id = $1::uuid)
  {{after}}
  AND EXISTS (SELECT 1 FROM runs r WHERE r.session_id = s.id)
  AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.session_id = s.id AND {_BLOCKER})
ORDER BY s.id
LIMIT $3
"""
SESSION_CANDIDATES_FIRST = _SESSION_CANDIDATES.format(after="")
SESSION_CANDIDATES_NEXT = _SESSION_CANDIDATES.format(after="AND s.id > $4::uuid")

# Rows a session's deletion removes (for sizing batches).
SESSION_WEIGHTS = """
SELECT s.id,
    (SELECT count(*) FROM messages m WHERE m.session_id = s.id)
    + (SELECT count(*) FROM runs r JOIN tool_calls t ON t.run_id = r.id WHERE r.session_id = s.id)
    + (SELECT count(*) FROM runs r JOIN run_events e ON e.run_id = r.id WHERE r.session_id = s.id)
    + (SELECT count(*) FROM runs r WHERE r.session_id = s.id) AS n
FROM unnest($1::uuid[]) AS s(id)
ORDER BY s.id
"""

# Inside the batch transaction: lock the sessions first (an enqueue into one of
# them takes KEY SHARE on it through the foreign key, so it either committed
# before — and then blocks the session below — or waits for this batch).
LOCK_SESSIONS = "SELECT id FROM sessions WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE"

DELETABLE_RUNS = f"""
SELECT r.id FROM runs r
WHERE r.session_id = ANY($1::uuid[]) AND r.status IN {_FINAL} AND r.finished_at < $2
  AND NOT EXISTS (SELECT 1 FROM runs o WHERE o.session_id = r.session_id AND {_BLOCKER})
ORDER BY r.id
FOR UPDATE OF r
"""

DELETE_TOOL_CALLS = "DELETE FROM tool_calls WHERE run_id = ANY($1::uuid[])"
DELETE_MESSAGES = "DELETE FROM messages WHERE run_id = ANY($1::uuid[])"
DELETE_RUN_EVENTS = "DELETE FROM run_events WHERE run_id = ANY($1::uuid[])"
DELETE_RUNS = "DELETE FROM runs WHERE id = ANY($1::uuid[])"
# Stored content blocks (docs/inputs-and-outputs.md): the runs' references, then each
# blob no run refers to any more (a fork's run still does). run_blobs' foreign key on
# blobs makes a race with an enqueue that refers to the same bytes an error, never a
# dangling reference.
DELETE_RUN_BLOBS = (
    "DELETE FROM run_blobs WHERE run_id = ANY($1::uuid[]) RETURNING tenant_id::text, sha256"
)
DELETE_BLOBS = """
DELETE FROM blobs b USING unnest($1::uuid[], $2::bytea[]) AS d(tenant_id, sha256)
WHERE b.tenant_id = d.tenant_id AND b.sha256 = d.sha256
  AND NOT EXISTS (SELECT 1 FROM run_blobs r WHERE r.tenant_id = b.tenant_id AND r.sha256 = b.sha256)
"""


def _count(status: str) -> int:
    """'DELETE 42' → 42."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0


@dataclass
class _Pass:
    """One gc call's fixed inputs and running totals."""

    pool: asyncpg.Pool
    cutoff: datetime.datetime
    tenant: str | None
    batch_size: int
    pause_s: float
    progress: Callable[[GcResult], None] | None
    result: GcResult

    async def batch_done(self) -> None:
        self.result.batches += 1
        if self.progress is not None:
            self.progress(self.result)
        if self.pause_s > 0:
            await asyncio.sleep(self.pause_s)


def _tenant(tenant_id: str | None) -> str | None:
    if tenant_id is None:
        return None
    try:
        return str(uuid.UUID(tenant_id))
    except ValueError:
        raise ValueError(f"tenant_id {tenant_id!r} is not a UUID") from None


async def gc(
    pool: asyncpg.Pool,
    *,
    older_than: datetime.timedelta,
    tenant_id: str | None = None,
    delete_runs: bool = False,
    batch_size: int = 1000,
    pause_s: float = 0.0,
    progress: Callable[[GcResult], None] | None = None,
) -> GcResult:
    """Delete finished runs' events older than `older_than` (and the runs with `delete_runs`).

    See the module docstring for exactly what is deleted. `pause_s` sleeps
    between batches (to leave room for replication and vacuum); `progress` is
    called with the running totals after every batch that deleted rows.
    """
    if older_than < datetime.timedelta(0):
        raise ValueError("older_than must not be negative")
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")
    tenant = _tenant(tenant_id)
    result = GcResult()
    cutoff: datetime.datetime = await pool.fetchval("SELECT now() - $1::interval", older_than)
    result.cutoff = cutoff
    p = _Pass(pool, cutoff, tenant, batch_size, pause_s, progress, result)
    await _delete_events(p)
    if delete_runs:
        await _delete_old_sessions(p)
    return result


async def _delete_events(p: _Pass) -> None:
    """Events of every finished, old run (chunked by run id, batched by rows)."""
    after: Any = None
    while True:
        if after is None:
            rows = await p.pool.fetch(RUN_CANDIDATES_FIRST, p.cutoff, p.tenant, p.batch_size)
        else:
            rows = await p.pool.fetch(RUN_CANDIDATES_NEXT, p.cutoff, p.tenant, p.batch_size, after)
        if not rows:
            break
        ids = [r["id"] for r in rows]
        after = ids[-1]
        while True:
            n = _count(await p.pool.execute(DELETE_EVENTS_BATCH, ids, p.cutoff, p.batch_size))
            if n == 0:
                break
            p.result.events_deleted += n
            await p.batch_done()
            if n < p.batch_size:
                break
        if len(rows) < p.batch_size:
            break


async def _delete_old_sessions(p: _Pass) -> None:
    """Whole sessions whose runs are all finished and old: runs, messages, tool calls."""
    after: Any = None
    while True:
        if after is None:
            rows = await p.pool.fetch(SESSION_CANDIDATES_FIRST, p.tenant, p.cutoff, p.batch_size)
        else:
            rows = await p.pool.fetch(
                SESSION_CANDIDATES_NEXT, p.tenant, p.cutoff, p.batch_size, after
            )
        if not rows:
            break
        sessions = [r["id"] for r in rows]
        after = sessions[-1]
        weights = await p.pool.fetch(SESSION_WEIGHTS, sessions)
        for group in _groups([(w["id"], int(w["n"])) for w in weights], p.batch_size):
            if await _delete_sessions(p.pool, group, p.cutoff, p.result):
                await p.batch_done()
        if len(rows) < p.batch_size:
            break


def _groups(weighted: Sequence[tuple[Any, int]], limit: int) -> list[list[Any]]:
    """Consecutive groups whose total weight stays within `limit` (an oversize item goes alone)."""
    groups: list[list[Any]] = []
    current: list[Any] = []
    total = 0
    for item, weight in weighted:
        if current and total + weight > limit:
            groups.append(current)
            current, total = [], 0
        current.append(item)
        total += weight
    if current:
        groups.append(current)
    return groups


async def _delete_sessions(
    pool: asyncpg.Pool, sessions: list[Any], cutoff: datetime.datetime, result: GcResult
) -> bool:
    """One batch: the runs of `sessions` that still qualify, with their rows. True if any."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(LOCK_SESSIONS, sessions)
        runs = [r["id"] for r in await conn.fetch(DELETABLE_RUNS, sessions, cutoff)]
        if not runs:
            return False
        tool_calls = _count(await conn.execute(DELETE_TOOL_CALLS, runs))
        messages = _count(await conn.execute(DELETE_MESSAGES, runs))
        events = _count(await conn.execute(DELETE_RUN_EVENTS, runs))
        refs = await conn.fetch(DELETE_RUN_BLOBS, runs)
        deleted = _count(await conn.execute(DELETE_RUNS, runs))
        if refs:
            blobs = [r["tenant_id"] for r in refs], [r["sha256"] for r in refs]
            result.blobs_deleted += _count(await conn.execute(DELETE_BLOBS, *blobs))
    result.tool_calls_deleted += tool_calls
    result.messages_deleted += messages
    result.events_deleted += events
    result.runs_deleted += deleted
    return True
