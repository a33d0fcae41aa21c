"""The run console's reads (hango_worker/console), every statement named, in one place.

Every one is scoped by tenant; the runs page is paged by key (created_at, id) on
`runs_tenant_created_idx`, so page 1000 costs what page 1 does, whatever the number
of finished runs (tests/test_console.py reads the query plan)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import asyncpg

from hango_worker.store.repo import NotFound

PAGE_SIZE = 50

# $1 tenant, $2 status or NULL, $3 agent id or NULL, $4/$5 the cursor (the last row's
# created_at and id) or NULL, $6 the page size. A backward scan of the tenant's part of
# runs_tenant_created_idx, stopped by LIMIT; the filters are checked on the way.
RUNS_PAGE = """
SELECT r.id::text AS id, a.name AS agent, r.status, r.attempt, r.created_at,
    r.finished_at, r.error->>'type' AS error_type, r.usage->>'cost_usd' AS cost_usd,
    r.waiting_for->>'reason' AS waiting_reason
FROM runs r JOIN agents a ON a.id = r.agent_id
WHERE r.tenant_id = $1
    AND ($2::text IS NULL OR r.status = $2)
    AND ($3::uuid IS NULL OR r.agent_id = $3)
    AND ($4::timestamptz IS NULL OR r.created_at <= $4)
    AND ($4::timestamptz IS NULL OR r.created_at < $4 OR r.id < $5::uuid)
ORDER BY r.created_at DESC, r.id DESC
LIMIT $6
"""

# Runs waiting for a person (not for their subagents or a spend budget), oldest wait
# first: the partial runs_waiting_idx holds only waiting runs.
WAITING = """
SELECT r.id::text AS id, a.name AS agent, r.waiting_since, r.waiting_until,
    r.waiting_for->>'reason' AS reason, r.waiting_for->'call'->>'name' AS tool,
    r.waiting_for->'call'->>'question' AS question
FROM runs r JOIN agents a ON a.id = r.agent_id
WHERE r.status = 'waiting' AND r.tenant_id = $1
    AND coalesce(r.waiting_for->>'reason', '') NOT IN ('children', 'budget')
ORDER BY r.waiting_since NULLS LAST, r.id
LIMIT $2
"""

# $1 tenant: the agents a runs page filters by
AGENTS = "SELECT id::text, name FROM agents WHERE tenant_id = $1 ORDER BY name"

# $1 tenant ids: their names, for the tenant switch
TENANT_NAMES = "SELECT id::text, name FROM tenants WHERE id = ANY($1::uuid[])"

# $1 run id, $2 the console user's tenants: the run's tenant, if one of them
RUN_TENANT = "SELECT tenant_id::text FROM runs WHERE id = $1 AND tenant_id = ANY($2::uuid[])"

# $1 agent id: its name (a run page's heading)
AGENT_NAME = "SELECT name FROM agents WHERE id = $1"

# $1 run id: each attempt's worker, first and last event, and how it ended
ATTEMPTS = """
SELECT attempt, min(worker_id) FILTER (WHERE type = 'run_started') AS worker_id,
    min(created_at) AS started_at, max(created_at) AS last_event_at,
    array_agg(type ORDER BY seq) FILTER (WHERE type IN
        ('run_finished', 'run_waiting', 'run_released', 'run_reclaimed')) AS ends
FROM run_events WHERE run_id = $1 AND attempt IS NOT NULL
GROUP BY attempt ORDER BY attempt
"""


def cursor(row: dict[str, Any]) -> str:
    return f"{row['created_at'].isoformat()}_{row['id']}"


def parse_cursor(raw: str | None) -> tuple[datetime | None, str | None]:
    if not raw:
        return None, None
    at, _, run_id = raw.partition("_")
    try:
        return datetime.fromisoformat(at), str(uuid.UUID(run_id))
    except ValueError:
        raise ValueError(f"{raw!r} is not a page cursor") from None


async def runs_page(
    pool: asyncpg.Pool,
    tenant_id: str,
    *,
    status: str | None,
    agent_id: str | None,
    after: str | None,
    size: int = PAGE_SIZE,
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the tenant's runs, newest first, and the cursor of the next page."""
    at, run_id = parse_cursor(after)
    rows = await pool.fetch(RUNS_PAGE, tenant_id, status, agent_id, at, run_id, size + 1)
    page = [dict(r) for r in rows[:size]]
    return page, cursor(page[-1]) if len(rows) > size else None


async def agents(pool: asyncpg.Pool, tenant_id: str) -> list[dict[str, Any]]:
    return [dict(r) for r in await pool.fetch(AGENTS, tenant_id)]


async def agent_name(pool: asyncpg.Pool, agent_id: str) -> str | None:
    name: str | None = await pool.fetchval(AGENT_NAME, agent_id)
    return name


async def tenant_names(pool: asyncpg.Pool, ids: tuple[str, ...]) -> dict[str, str]:
    return {r["id"]: r["name"] for r in await pool.fetch(TENANT_NAMES, ids)}


async def waiting(pool: asyncpg.Pool, tenant_id: str, limit: int = 200) -> list[dict[str, Any]]:
    return [dict(r) for r in await pool.fetch(WAITING, tenant_id, limit)]


async def tenant_of_run(pool: asyncpg.Pool, tenants: tuple[str, ...], run_id: str) -> str:
    """The tenant (among `tenants`) the run belongs to; NotFound otherwise — another
    tenant's run looks exactly like no run at all."""
    try:
        uuid.UUID(run_id)
    except ValueError:
        raise NotFound(f"{run_id!r} is not a run id (a UUID)") from None
    found = await pool.fetchval(RUN_TENANT, run_id, tenants)
    if found is None:
        raise NotFound(f"no run {run_id} in this console's tenants")
    return str(found)


async def attempts(pool: asyncpg.Pool, run_id: str) -> list[dict[str, Any]]:
    """Each attempt of the run: who ran it, when it started, how it ended."""
    return [dict(r) for r in await pool.fetch(ATTEMPTS, run_id)]


# One message of a run (its content as stored), for the image an attachment link names.
MESSAGE_CONTENT = """
SELECT m.content::text AS content FROM messages m JOIN runs r ON r.session_id = m.session_id
WHERE r.id = $1 AND m.seq = $2
"""

# A stored block's bytes (blobs), by its tenant and sha256.
BLOB_BYTES = "SELECT media_type, data FROM blobs WHERE tenant_id = $1::uuid AND sha256 = $2"


async def message_content(pool: asyncpg.Pool, run_id: str, seq: int) -> str | None:
    """The content (JSON text) of message `seq` of the run's session, or None."""
    v = await pool.fetchval(MESSAGE_CONTENT, run_id, seq)
    return None if v is None else str(v)


async def blob_bytes(pool: asyncpg.Pool, tenant_id: str, sha256_hex: str) -> bytes | None:
    """The bytes of the tenant's stored block `sha256_hex`, or None."""
    try:
        key = bytes.fromhex(sha256_hex)
    except ValueError:
        return None
    row = await pool.fetchrow(BLOB_BYTES, tenant_id, key)
    return None if row is None else bytes(row["data"])
