"""Purge: remove every row that belongs to a tenant, a session or a run, in every table.

`hango-worker tenants purge NAME --yes`, `hango-worker runs purge ID --yes` and
`hango-worker runs purge --session ID --yes` call `purge_tenant`, `purge_run` and
`purge_session` (docs/operations.md "Purge"). What each removes:

- A run: the run and its subagent runs (its descendants through `parent_run_id`),
  with every row of theirs (`RUN_TABLES`, `run_blobs`), then the sessions left with
  no run, their session-scoped memories, and the stored content blocks (`blobs`,
  with their `blob_files`) no run refers to any more. A run whose session holds
  other runs is refused (its history is the session's: purge the session instead).
- A session: every run of the session and their descendants, as above.
- A tenant: every run, session, memory, skill, budget, agent, blob and Files API
  id and retention policy of the tenant, then the tenant itself.

What is never touched: a run that is not finished (queued, running or waiting) —
the purge is refused (`Conflict`) before anything is deleted; cancel such runs
first (`tenants set NAME --max-running 0` stops new claims). A fork is a new run in
a new session with its own copy of the source's messages, so purging the source
leaves its forks whole (a shared content block stays while a fork refers to it).
Agent- and key-scoped memories are the agent's, not a run's: a run or session
purge leaves them (their `run_id` provenance may then name a purged run); the
tenant's purge removes them.

How it stays gentle: every statement deletes at most `batch_size` rows and is its
own short transaction, so no lock is held for long and nothing takes a table lock.
The flip side: a purge that fails half way (a run resumed or enqueued into the
tenant meanwhile) has deleted part of the data; running it again finishes it.
Runs are deleted only while still finished (a resumed run makes the purge stop
with `Conflict`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import asyncpg

from hango_worker.store.repo import Conflict, NotFound

_FINAL = "('succeeded', 'failed', 'cancelled')"

# Tables keyed by run_id (budget_holds has no foreign key: a hold outlives nothing).
RUN_TABLES = (
    "run_events",
    "messages",
    "tool_calls",
    "run_files",
    "run_states",
    "run_decisions",
    "budget_holds",
)
# Tables keyed by tenant_id, in the order a tenant's purge empties them (after its
# runs and sessions): each one's foreign keys point only at tables emptied later.
TENANT_TABLES = ("memories", "skills", "budgets", "retention", "blob_files", "blobs", "agents")
# Every table a tenant's purge empties, for the catalog-driven test.
PURGED_TABLES = (*RUN_TABLES, "run_blobs", "runs", "sessions", *TENANT_TABLES, "tenants")


def _run_rows(table: str) -> str:
    return (
        f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
        f"SELECT ctid FROM {table} WHERE run_id = ANY($1::uuid[]) LIMIT $2))"
    )


def _tenant_rows(table: str) -> str:
    return (
        f"DELETE FROM {table} WHERE ctid = ANY(ARRAY("
        f"SELECT ctid FROM {table} WHERE tenant_id = $1::uuid LIMIT $2))"
    )


DELETE_RUN_ROWS = {t: _run_rows(t) for t in RUN_TABLES}
DELETE_TENANT_ROWS = {t: _tenant_rows(t) for t in (*TENANT_TABLES, "sessions")}
DELETE_RUN_BLOBS = (
    "DELETE FROM run_blobs WHERE ctid = ANY(ARRAY("
    "SELECT ctid FROM run_blobs WHERE run_id = ANY($1::uuid[]) LIMIT $2)) "
    "RETURNING tenant_id::text, sha256"
)
# Only runs still finished: a run resumed since the check stays (and stops the purge).
DELETE_RUNS = f"DELETE FROM runs WHERE id = ANY($1::uuid[]) AND status IN {_FINAL}"

TENANT_RUNS = "SELECT id::text FROM runs WHERE tenant_id = $1::uuid ORDER BY id"
_TREE = """
WITH RECURSIVE t AS (
    SELECT id FROM runs WHERE {start}
    UNION
    SELECT r.id FROM runs r JOIN t ON r.parent_run_id = t.id
)
SELECT id::text FROM t ORDER BY id
"""
SESSION_RUNS = _TREE.format(start="session_id = $1::uuid")
RUN_TREE = _TREE.format(start="id = $1::uuid")
ACTIVE_RUNS = f"""
SELECT id::text, status FROM runs WHERE id = ANY($1::uuid[]) AND status NOT IN {_FINAL}
ORDER BY id LIMIT 5
"""
TENANT_ACTIVE_RUNS = f"""
SELECT id::text, status FROM runs WHERE tenant_id = $1::uuid AND status NOT IN {_FINAL}
ORDER BY id LIMIT 5
"""
RUN_SESSION = "SELECT session_id::text, tenant_id::text FROM runs WHERE id = $1::uuid"
SESSION_TENANT = "SELECT tenant_id::text FROM sessions WHERE id = $1::uuid"
RUNS_SESSIONS = "SELECT DISTINCT session_id::text FROM runs WHERE id = ANY($1::uuid[]) ORDER BY 1"
OTHER_RUNS_OF_SESSION = (
    "SELECT count(*) FROM runs WHERE session_id = $1::uuid AND NOT id = ANY($2::uuid[])"
)
# Sessions of the purged runs that no run is left in, and their session memories.
DELETE_EMPTY_SESSIONS = """
DELETE FROM sessions s WHERE s.id = ANY($1::uuid[])
  AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.session_id = s.id)
RETURNING s.id::text
"""
DELETE_SESSION_MEMORIES = (
    "DELETE FROM memories WHERE scope = 'session' AND scope_key = ANY($1::text[])"
)
# A stored block (and its Files API ids) once no run refers to it (a fork's run may).
_UNREFERENCED = (
    "NOT EXISTS (SELECT 1 FROM run_blobs r WHERE r.tenant_id = b.tenant_id AND r.sha256 = b.sha256)"
)
DELETE_BLOB_FILES = f"""
DELETE FROM blob_files b USING unnest($1::uuid[], $2::bytea[]) AS d(tenant_id, sha256)
WHERE b.tenant_id = d.tenant_id AND b.sha256 = d.sha256 AND {_UNREFERENCED}
"""
DELETE_BLOBS = f"""
DELETE FROM blobs b USING unnest($1::uuid[], $2::bytea[]) AS d(tenant_id, sha256)
WHERE b.tenant_id = d.tenant_id AND b.sha256 = d.sha256 AND {_UNREFERENCED}
"""
DELETE_TENANT = "DELETE FROM tenants WHERE id = $1::uuid"


@dataclass
class PurgeResult:
    """Rows deleted per table (every table of `PURGED_TABLES` the purge visited)."""

    deleted: dict[str, int] = field(default_factory=dict)

    def add(self, table: str, n: int) -> None:
        self.deleted[table] = self.deleted.get(table, 0) + n

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def _count(status: str) -> int:
    """'DELETE 42' → 42."""
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0


_T = TypeVar("_T")


def _chunks(items: list[_T], size: int) -> Iterable[list[_T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _refuse_active(rows: list[asyncpg.Record], what: str) -> None:
    if rows:
        listed = ", ".join(f"{r['id']} ({r['status']})" for r in rows)
        raise Conflict(
            f"{what} has runs not finished ({listed}{', …' if len(rows) == 5 else ''}): "
            "cancel them first (a purge never removes a queued, running or waiting run)"
        )


async def _repeat(pool: asyncpg.Pool, sql: str, *args: Any) -> int:
    """Run a bounded DELETE (its last argument the bound) until it deletes fewer rows."""
    total = 0
    while True:
        n = _count(await pool.execute(sql, *args))
        total += n
        if n < args[-1]:
            return total


async def _purge_runs(pool: asyncpg.Pool, runs: list[str], batch: int, out: PurgeResult) -> None:
    """Every row of `runs` (chunked), the runs, then the blocks no run refers to any more."""
    keys: set[tuple[str, bytes]] = set()
    for chunk in _chunks(runs, batch):
        for table in RUN_TABLES:
            out.add(table, await _repeat(pool, DELETE_RUN_ROWS[table], chunk, batch))
        while True:
            refs = await pool.fetch(DELETE_RUN_BLOBS, chunk, batch)
            keys.update((r["tenant_id"], bytes(r["sha256"])) for r in refs)
            out.add("run_blobs", len(refs))
            if len(refs) < batch:
                break
        n = _count(await pool.execute(DELETE_RUNS, chunk))
        out.add("runs", n)
        if n < len(chunk):
            raise Conflict("a run was resumed during the purge: cancel it and purge again")
    ordered = sorted(keys)
    for part in _chunks(ordered, batch):
        args = [k[0] for k in part], [k[1] for k in part]
        out.add("blob_files", _count(await pool.execute(DELETE_BLOB_FILES, *args)))
        out.add("blobs", _count(await pool.execute(DELETE_BLOBS, *args)))


async def _purge_tree(pool: asyncpg.Pool, runs: list[str], batch: int) -> PurgeResult:
    """Runs (a session's, or a run's tree) and the sessions they leave empty."""
    out = PurgeResult()
    _refuse_active(await pool.fetch(ACTIVE_RUNS, runs), "the selection")
    sessions = [r[0] for r in await pool.fetch(RUNS_SESSIONS, runs)]
    await _purge_runs(pool, runs, batch, out)
    gone = [r[0] for r in await pool.fetch(DELETE_EMPTY_SESSIONS, sessions)]
    out.add("sessions", len(gone))
    out.add("memories", _count(await pool.execute(DELETE_SESSION_MEMORIES, gone)))
    return out


def _check_batch(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError("batch_size must be at least 1")


async def purge_run(
    pool: asyncpg.Pool, tenant_id: str, run_id: str, *, batch_size: int = 1000
) -> PurgeResult:
    """The run, its subagent runs and all their rows (see the module docstring)."""
    _check_batch(batch_size)
    row = await pool.fetchrow(RUN_SESSION, run_id)
    if row is None or row["tenant_id"] != tenant_id:
        raise NotFound(f"run {run_id} not found")
    runs = [r[0] for r in await pool.fetch(RUN_TREE, run_id)]
    if await pool.fetchval(OTHER_RUNS_OF_SESSION, row["session_id"], runs):
        raise Conflict(
            f"run {run_id}'s session {row['session_id']} holds other runs, whose history "
            "includes this run's: purge the whole session (runs purge --session)"
        )
    return await _purge_tree(pool, runs, batch_size)


async def purge_session(
    pool: asyncpg.Pool, tenant_id: str, session_id: str, *, batch_size: int = 1000
) -> PurgeResult:
    """Every run of the session, their subagent runs and all their rows."""
    _check_batch(batch_size)
    if await pool.fetchval(SESSION_TENANT, session_id) != tenant_id:
        raise NotFound(f"session {session_id} not found")
    runs = [r[0] for r in await pool.fetch(SESSION_RUNS, session_id)]
    if not runs:  # a session with no run yet: just the session
        out = PurgeResult()
        gone = [r[0] for r in await pool.fetch(DELETE_EMPTY_SESSIONS, [session_id])]
        out.add("sessions", len(gone))
        out.add("memories", _count(await pool.execute(DELETE_SESSION_MEMORIES, gone)))
        return out
    return await _purge_tree(pool, runs, batch_size)


async def purge_tenant(
    pool: asyncpg.Pool, tenant_id: str, *, batch_size: int = 1000
) -> PurgeResult:
    """Every row of the tenant in every table, then the tenant (see the module docstring)."""
    _check_batch(batch_size)
    out = PurgeResult()
    _refuse_active(await pool.fetch(TENANT_ACTIVE_RUNS, tenant_id), "the tenant")
    runs = [r[0] for r in await pool.fetch(TENANT_RUNS, tenant_id)]
    await _purge_runs(pool, runs, batch_size, out)
    try:
        for table in ("sessions", *TENANT_TABLES):
            n = await _repeat(pool, DELETE_TENANT_ROWS[table], tenant_id, batch_size)
            out.add(table, n)
        out.add("tenants", _count(await pool.execute(DELETE_TENANT, tenant_id)))
    except asyncpg.ForeignKeyViolationError:
        raise Conflict(
            "the tenant got new rows during the purge (a run enqueued?): purge it again"
        ) from None
    return out
