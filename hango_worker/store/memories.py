"""Long-term memory for operators (`hango-worker memory ls|show|rm`), cold path."""

from __future__ import annotations

from typing import Any

import asyncpg

from hango_worker.store.repo import NotFound, find_agent

# -- long-term memory, for operators (`hango-worker memory ls|show|rm`) ---------------------

MEMORY_COLUMNS = (
    "a.name AS agent, m.agent_id::text AS agent_id, m.scope, m.scope_key, m.path, m.size, "
    "m.version, m.run_id::text AS run_id, m.tool_use_id, m.created_at, m.updated_at"
)


def _scope_of(session_id: str | None, key: str | None) -> tuple[str, str]:
    """(scope, scope key): a session's memory, a caller key's, or else the agent's."""
    if session_id is not None:
        return "session", session_id
    if key is not None:
        return "key", key
    return "agent", ""


async def list_memories(
    db: asyncpg.Pool,
    tenant_id: str,
    *,
    agent: str | None = None,
    session_id: str | None = None,
    key: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """Memory files of the tenant (no contents), optionally of one agent and one scope."""
    agent_id = None if agent is None else (await find_agent(db, tenant_id, agent))["id"]
    scoped = session_id is not None or key is not None
    scope, scope_key = _scope_of(session_id, key) if scoped else (None, None)
    rows = await db.fetch(
        f"SELECT {MEMORY_COLUMNS} FROM memories m JOIN agents a ON a.id = m.agent_id "
        "WHERE m.tenant_id = $1 AND ($2::uuid IS NULL OR m.agent_id = $2::uuid) "
        "AND ($3::text IS NULL OR (m.scope = $3 AND m.scope_key = $4)) "
        "ORDER BY a.name, m.scope, m.scope_key, m.path LIMIT $5",
        tenant_id,
        agent_id,
        scope,
        scope_key,
        limit,
    )
    return [dict(r) for r in rows]


async def get_memory(
    db: asyncpg.Pool,
    tenant_id: str,
    *,
    agent: str,
    path: str,
    session_id: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    a = await find_agent(db, tenant_id, agent)
    scope, scope_key = _scope_of(session_id, key)
    row = await db.fetchrow(
        f"SELECT {MEMORY_COLUMNS}, m.content FROM memories m JOIN agents a ON a.id = m.agent_id "
        "WHERE m.tenant_id = $1 AND m.agent_id = $2 AND m.scope = $3 AND m.scope_key = $4 "
        "AND m.path = $5",
        tenant_id,
        a["id"],
        scope,
        scope_key,
        path,
    )
    if row is None:
        raise NotFound(f"no memory file {path} in the {scope} memory of agent {a['name']!r}")
    return dict(row)


async def delete_memory(
    db: asyncpg.Pool,
    tenant_id: str,
    *,
    agent: str,
    path: str,
    session_id: str | None = None,
    key: str | None = None,
) -> int:
    """Delete one memory file; returns the version it had. A run that had viewed it
    gets a conflict on its next edit of that file (it was deleted under it)."""
    a = await find_agent(db, tenant_id, agent)
    scope, scope_key = _scope_of(session_id, key)
    version = await db.fetchval(
        "DELETE FROM memories WHERE tenant_id = $1 AND agent_id = $2 AND scope = $3 "
        "AND scope_key = $4 AND path = $5 RETURNING version",
        tenant_id,
        a["id"],
        scope,
        scope_key,
        path,
    )
    if version is None:
        raise NotFound(f"no memory file {path} in the {scope} memory of agent {a['name']!r}")
    return int(version)
