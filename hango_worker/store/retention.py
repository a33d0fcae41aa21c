"""Retention policies: how long a tenant's data is kept, and their enforcement.

A policy (`retention`, migration 0020) is the fleet default (no tenant), a tenant's, or
an agent's override; each kind falls through on its own, agent → tenant → fleet, and a
kind no scope sets is kept forever. The kinds (docs/operations.md "Retention policies"):

- `events`: a finished run's `run_events`, once the run finished that long ago.
- `files`: a finished run's `run_files`, likewise.
- `runs`: finished runs with every row of theirs (messages, tool calls, events, files,
  state snapshots, decisions, budget holds, content block references and the blocks
  no run refers to any more) — a whole session at a time, only when every run of the
  session is finished that long ago, and none of them is the parent or the child of
  a run not finished (`_BLOCKED`). The session goes with its last run, and its
  session-scoped memories with it (no run can read them any more).
- `sessions`: a session no run was ever enqueued into, created that long ago (an
  orphan), with its session memories.
- `memories`: a memory file not written for that long, while no unfinished run could
  use it (a session memory: none in the session; an agent or key memory: none of
  the agent's).

Forks copy their source's messages into their own session, so a source's history is
removed on its own schedule: its forks keep their copy (and the content blocks they
refer to).

`enforce()` runs one pass: only one process at a time (a session advisory lock,
`LOCK_KEY`, held on its own connection; the others skip the pass), each statement
deleting at most `batch_size` rows in its own short transaction. A run resumed
during a pass is re-checked under lock and kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg

from hango_worker.store.purge import DELETE_BLOB_FILES, DELETE_BLOBS, RUN_TABLES
from hango_worker.store.repo import NotFound
from hango_worker.store.schema import RETENTION_KINDS

LOCK_KEY = 0x68616E676F_7274  # pg advisory lock key of the retention pass ("hango" "rt")
_FINAL = "('succeeded', 'failed', 'cancelled')"
_ZERO = "'00000000-0000-0000-0000-000000000000'::uuid"

# -- policies -------------------------------------------------------------------------------

_COLS = ", ".join(f"{k}_s" for k in RETENTION_KINDS)
# a kind not named in $8 keeps its value
_SETS = ", ".join(
    f"{k}_s = CASE WHEN $8::text[] @> ARRAY['{k}'] THEN EXCLUDED.{k}_s ELSE retention.{k}_s END"
    for k in RETENTION_KINDS
)
SET_POLICY = f"""
INSERT INTO retention (tenant_id, agent_id, {_COLS})
VALUES ($1::uuid, $2::uuid, $3, $4, $5, $6, $7)
ON CONFLICT (coalesce(tenant_id, {_ZERO}), coalesce(agent_id, {_ZERO})) DO UPDATE SET
    {_SETS},
    updated_at = now()
RETURNING id
"""
LIST_POLICIES = f"""
SELECT t.name AS tenant, a.name AS agent, {", ".join(f"p.{k}_s" for k in RETENTION_KINDS)}
FROM retention p LEFT JOIN tenants t ON t.id = p.tenant_id LEFT JOIN agents a ON a.id = p.agent_id
WHERE $1::uuid IS NULL OR p.tenant_id = $1::uuid OR p.tenant_id IS NULL
ORDER BY p.tenant_id NULLS FIRST, p.agent_id NULLS FIRST
"""
DELETE_POLICY = """
DELETE FROM retention WHERE tenant_id IS NOT DISTINCT FROM $1::uuid
  AND agent_id IS NOT DISTINCT FROM $2::uuid
"""
AGENT_ID = "SELECT id::text FROM agents WHERE tenant_id = $1::uuid AND name = $2"


async def agent_id(pool: asyncpg.Pool, tenant_id: str, name: str) -> str:
    found = await pool.fetchval(AGENT_ID, tenant_id, name)
    if found is None:
        raise NotFound(f"no agent {name!r} in this tenant")
    return str(found)


async def set_policy(
    pool: asyncpg.Pool, tenant_id: str | None, agent: str | None, seconds: dict[str, int | None]
) -> None:
    """Set the kinds in `seconds` (None: fall through) for the scope; the others stay."""
    unknown = set(seconds) - set(RETENTION_KINDS)
    if unknown:
        raise ValueError(f"unknown retention kinds: {sorted(unknown)}")
    values = [seconds.get(k) for k in RETENTION_KINDS]
    await pool.execute(SET_POLICY, tenant_id, agent, *values, sorted(seconds))


async def list_policies(pool: asyncpg.Pool, tenant_id: str | None) -> list[dict[str, Any]]:
    """The fleet default and the tenant's policies (every policy with `tenant_id` None)."""
    return [dict(r) for r in await pool.fetch(LIST_POLICIES, tenant_id)]


async def remove_policy(pool: asyncpg.Pool, tenant_id: str | None, agent: str | None) -> bool:
    return bool(int((await pool.execute(DELETE_POLICY, tenant_id, agent)).split()[-1]))


# -- enforcement ------------------------------------------------------------------------------

# Each agent's effective policy; a kind NULL at every scope is kept forever.
_POLICY = f"""
pol AS (
    SELECT a.id AS agent_id, {
    ", ".join(f"coalesce(pa.{k}_s, pt.{k}_s, pf.{k}_s) AS {k}_s" for k in RETENTION_KINDS)
}
    FROM agents a
    LEFT JOIN retention pa ON pa.tenant_id = a.tenant_id AND pa.agent_id = a.id
    LEFT JOIN retention pt ON pt.tenant_id = a.tenant_id AND pt.agent_id IS NULL
    LEFT JOIN retention pf ON pf.tenant_id IS NULL AND pf.agent_id IS NULL
)"""


def _rows_of_old_runs(table: str, kind: str) -> str:
    """At most $1 rows of `table` of finished runs older than the kind's duration."""
    return f"""
WITH {_POLICY}, doomed AS (
    SELECT x.ctid FROM {table} x JOIN runs r ON r.id = x.run_id
    JOIN pol ON pol.agent_id = r.agent_id
    WHERE pol.{kind}_s IS NOT NULL AND r.status IN {_FINAL}
      AND r.finished_at < now() - make_interval(secs => pol.{kind}_s)
    LIMIT $1
    FOR SHARE OF r
)
DELETE FROM {table} WHERE ctid IN (SELECT ctid FROM doomed)
"""


DELETE_OLD_EVENTS = _rows_of_old_runs("run_events", "events")
DELETE_OLD_FILES = _rows_of_old_runs("run_files", "files")

# A run that keeps its whole session: not finished, not old enough under its policy,
# or the parent or child of a run not finished.
_BLOCKED = f"""(
    o.status NOT IN {_FINAL} OR o.finished_at IS NULL OR op.runs_s IS NULL
    OR o.finished_at >= now() - make_interval(secs => op.runs_s)
    OR EXISTS (SELECT 1 FROM runs k WHERE k.parent_run_id = o.id AND k.status NOT IN {_FINAL})
    OR EXISTS (SELECT 1 FROM runs p WHERE p.id = o.parent_run_id AND p.status NOT IN {_FINAL})
)"""
OLD_SESSIONS = f"""
WITH {_POLICY}
SELECT s.id::text FROM sessions s
WHERE EXISTS (SELECT 1 FROM runs r WHERE r.session_id = s.id)
  AND NOT EXISTS (
    SELECT 1 FROM runs o JOIN pol op ON op.agent_id = o.agent_id
    WHERE o.session_id = s.id AND {_BLOCKED})
  AND s.id > $2::uuid
ORDER BY s.id LIMIT $1
"""
LOCK_SESSIONS = "SELECT id FROM sessions WHERE id = ANY($1::uuid[]) ORDER BY id FOR UPDATE"
# Re-checked in the batch's transaction, the runs locked.
DOOMED_RUNS = f"""
WITH {_POLICY}
SELECT r.id::text FROM runs r WHERE r.session_id = ANY($1::uuid[])
  AND NOT EXISTS (
    SELECT 1 FROM runs o JOIN pol op ON op.agent_id = o.agent_id
    WHERE o.session_id = r.session_id AND {_BLOCKED})
ORDER BY r.id
FOR UPDATE OF r
"""
DELETE_OF_RUNS = {t: f"DELETE FROM {t} WHERE run_id = ANY($1::uuid[])" for t in RUN_TABLES}
DELETE_RUN_BLOBS = (
    "DELETE FROM run_blobs WHERE run_id = ANY($1::uuid[]) RETURNING tenant_id::text, sha256"
)
DELETE_RUNS = "DELETE FROM runs WHERE id = ANY($1::uuid[])"
# stored blocks no run refers to any more: purge.py's DELETE_BLOB_FILES, DELETE_BLOBS
# The sessions a batch emptied, and their session memories (no run can read them now).
DELETE_EMPTIED_SESSIONS = """
DELETE FROM sessions s WHERE s.id = ANY($1::uuid[])
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.session_id = s.id)
RETURNING s.id::text
"""
DELETE_SESSION_MEMORIES = (
    "DELETE FROM memories WHERE scope = 'session' AND scope_key = ANY($1::text[])"
)
# Orphan sessions: no run, created long enough ago under the session agent's policy.
OLD_EMPTY_SESSIONS = f"""
WITH {_POLICY}
SELECT s.id::text FROM sessions s JOIN pol ON pol.agent_id = s.agent_id
WHERE pol.sessions_s IS NOT NULL
  AND s.created_at < now() - make_interval(secs => pol.sessions_s)
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.session_id = s.id)
ORDER BY s.id LIMIT $1
"""
# Memories not written for long, while no unfinished run could read them.
DELETE_OLD_MEMORIES = f"""
WITH {_POLICY}, doomed AS (
    SELECT m.ctid FROM memories m JOIN pol ON pol.agent_id = m.agent_id
    WHERE pol.memories_s IS NOT NULL
      AND m.updated_at < now() - make_interval(secs => pol.memories_s)
      AND NOT EXISTS (
        SELECT 1 FROM runs r WHERE r.agent_id = m.agent_id AND r.status NOT IN {_FINAL}
          AND (m.scope <> 'session' OR r.session_id::text = m.scope_key))
    LIMIT $1
)
DELETE FROM memories WHERE ctid IN (SELECT ctid FROM doomed)
"""
OLDEST_RUN = (
    f"SELECT extract(epoch FROM now() - min(finished_at)) FROM runs WHERE status IN {_FINAL}"
)
TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
UNLOCK = "SELECT pg_advisory_unlock($1)"


@dataclass
class RetentionResult:
    """One pass: whether it ran (it had the lock), rows deleted per table."""

    ran: bool = False
    deleted: dict[str, int] = field(default_factory=dict)
    oldest_run_s: float | None = None

    def add(self, table: str, n: int) -> None:
        if n:
            self.deleted[table] = self.deleted.get(table, 0) + n


def _count(status: str) -> int:
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0


async def _repeat(pool: asyncpg.Pool, sql: str, batch: int) -> int:
    total = 0
    while True:
        n = _count(await pool.execute(sql, batch))
        total += n
        if n < batch:
            return total


async def enforce(pool: asyncpg.Pool, *, batch_size: int = 500) -> RetentionResult:
    """One retention pass over every tenant, unless another process holds the lock."""
    out = RetentionResult()
    async with pool.acquire() as lock:
        if not await lock.fetchval(TRY_LOCK, LOCK_KEY):
            return out
        try:
            out.ran = True
            out.add("run_events", await _repeat(pool, DELETE_OLD_EVENTS, batch_size))
            out.add("run_files", await _repeat(pool, DELETE_OLD_FILES, batch_size))
            await _old_sessions(pool, batch_size, out)
            await _orphan_sessions(pool, batch_size, out)
            out.add("memories", await _repeat(pool, DELETE_OLD_MEMORIES, batch_size))
            oldest = await pool.fetchval(OLDEST_RUN)
            out.oldest_run_s = None if oldest is None else float(oldest)
        finally:
            await lock.fetchval(UNLOCK, LOCK_KEY)
    return out


async def _old_sessions(pool: asyncpg.Pool, batch: int, out: RetentionResult) -> None:
    """Whole sessions past their runs' retention, a few at a time (one transaction each),
    in one keyset pass over the sessions (one kept on re-check is not tried again)."""
    per_batch = max(1, batch // 50)  # a session holds tens of rows, or more
    after = "00000000-0000-0000-0000-000000000000"
    while True:
        found = [r[0] for r in await pool.fetch(OLD_SESSIONS, per_batch, after)]
        if not found:
            return
        after = found[-1]
        await _delete_sessions(pool, found, out)
        if len(found) < per_batch:
            return


async def _orphan_sessions(pool: asyncpg.Pool, batch: int, out: RetentionResult) -> None:
    """Sessions no run was ever enqueued into (or left in), past their policy."""
    while True:
        found = [r[0] for r in await pool.fetch(OLD_EMPTY_SESSIONS, batch)]
        if not found:
            return
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute(LOCK_SESSIONS, found)
            await _drop_empty(conn, found, out)
        if len(found) < batch:
            return


async def _drop_empty(conn: asyncpg.Connection, sessions: list[str], out: RetentionResult) -> None:
    """Of `sessions` (locked), those with no run, with their session memories."""
    gone = [r[0] for r in await conn.fetch(DELETE_EMPTIED_SESSIONS, sessions)]
    out.add("sessions", len(gone))
    out.add("memories", _count(await conn.execute(DELETE_SESSION_MEMORIES, gone)))


async def _delete_sessions(pool: asyncpg.Pool, sessions: list[str], out: RetentionResult) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(LOCK_SESSIONS, sessions)
        runs = [r[0] for r in await conn.fetch(DOOMED_RUNS, sessions)]
        if not runs:
            return
        for table in RUN_TABLES:
            out.add(table, _count(await conn.execute(DELETE_OF_RUNS[table], runs)))
        refs = await conn.fetch(DELETE_RUN_BLOBS, runs)
        out.add("run_blobs", len(refs))
        out.add("runs", _count(await conn.execute(DELETE_RUNS, runs)))
        if refs:
            keys = [r["tenant_id"] for r in refs], [r["sha256"] for r in refs]
            out.add("blob_files", _count(await conn.execute(DELETE_BLOB_FILES, *keys)))
            out.add("blobs", _count(await conn.execute(DELETE_BLOBS, *keys)))
        await _drop_empty(conn, sessions, out)
