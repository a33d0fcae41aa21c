"""Tenants as a thing to operate: create, list, change their weight and limits, and
an agent's max_running (docs/operations.md "Tenants, fairness and limits").

The claim (store/sql.py CLAIM) reads `tenants.weight`, `tenants.max_running` and
`agents.max_running` on every claim, so a change here takes effect at the next claim
of every worker; runs already running are never stopped by a lower limit (the tenant
just gets no new claims until it is under the limit again).
"""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg

from hango_worker.store.repo import (
    DEFAULT_TENANT_ID,
    UUID_SHAPED,
    Conflict,
    NotFound,
    check_new_name,
    ensure_default_tenant,
)

MAX_WEIGHT = 1000  # tenants_weight_check
MAX_RUNNING = 1_000_000  # a sanity bound on max_running (any larger is "no limit")


def check_weight(weight: int) -> None:
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        raise ValueError(f"a tenant's weight must be an integer 1 to {MAX_WEIGHT}, got {weight!r}")


def check_max_running(n: int | None) -> None:
    """None is no limit; 0 pauses claiming for the tenant (or agent)."""
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_RUNNING:
        raise ValueError(
            f"max_running must be an integer 0 to {MAX_RUNNING} (0 pauses claiming; "
            f"omit it for no limit), got {n!r}"
        )


async def create_tenant(
    db: asyncpg.Pool | asyncpg.Connection,
    name: str,
    *,
    weight: int = 1,
    max_running: int | None = None,
) -> str:
    check_new_name("tenant", name)
    check_weight(weight)
    check_max_running(max_running)
    tenant_id = str(uuid.uuid4())
    try:
        await db.execute(
            "INSERT INTO tenants (id, name, weight, max_running) VALUES ($1, $2, $3, $4)",
            tenant_id,
            name,
            weight,
            max_running,
        )
    except asyncpg.UniqueViolationError:
        raise Conflict(f"a tenant named {name!r} already exists") from None
    return tenant_id


async def list_tenants(db: asyncpg.Pool | asyncpg.Connection) -> list[dict[str, Any]]:
    """Every tenant with its weight, limit, and runs queued and running now."""
    await ensure_default_tenant(db)
    rows = await db.fetch(
        "SELECT t.id::text, t.name, t.weight, t.max_running, t.created_at, "
        "(SELECT count(*) FROM runs r WHERE r.tenant_id = t.id AND r.status = 'queued') "
        "AS queued, "
        "(SELECT count(*) FROM runs r WHERE r.tenant_id = t.id AND r.status = 'running') "
        "AS running FROM tenants t ORDER BY t.name"
    )
    return [dict(r) for r in rows]


async def resolve_tenant(db: asyncpg.Pool | asyncpg.Connection, name_or_id: str | None) -> str:
    """The id of the tenant named (or with id) `name_or_id`; None: the default tenant."""
    if name_or_id is None:
        return await ensure_default_tenant(db)
    if name_or_id in ("default", DEFAULT_TENANT_ID):
        await ensure_default_tenant(db)
    if UUID_SHAPED.match(name_or_id):  # an id, never a name
        row = await db.fetchval("SELECT id::text FROM tenants WHERE id = $1::uuid", name_or_id)
    else:
        row = await db.fetchval("SELECT id::text FROM tenants WHERE name = $1", name_or_id)
    if row is None:
        raise NotFound(
            f"no tenant {name_or_id!r} (`hango-worker tenants list` lists them; "
            "`hango-worker tenants create NAME` creates one)"
        )
    return str(row)


_UNSET: Any = object()


async def update_tenant(
    db: asyncpg.Pool | asyncpg.Connection,
    name_or_id: str,
    *,
    weight: int | None = None,
    max_running: int | None = _UNSET,
) -> dict[str, Any]:
    """Change a tenant's weight and/or max_running (None: no limit); the new row."""
    if weight is not None:
        check_weight(weight)
    if max_running is not _UNSET:
        check_max_running(max_running)
    tenant_id = await resolve_tenant(db, name_or_id)
    row = await db.fetchrow(
        "UPDATE tenants SET weight = coalesce($2, weight), "
        "max_running = CASE WHEN $3 THEN $4::int ELSE max_running END "
        "WHERE id = $1 RETURNING id::text, name, weight, max_running",
        tenant_id,
        weight,
        max_running is not _UNSET,
        None if max_running is _UNSET else max_running,
    )
    assert row is not None
    return dict(row)


async def set_agent_max_running(
    db: asyncpg.Pool | asyncpg.Connection, tenant_id: str, agent: str, n: int | None
) -> None:
    """An agent's max_running (None: no limit), fleet-wide."""
    check_max_running(n)
    done = await db.fetchval(
        "UPDATE agents SET max_running = $3 WHERE tenant_id = $1 AND (name = $2 OR id::text = $2) "
        "RETURNING 1",
        tenant_id,
        agent,
        n,
    )
    if done is None:
        raise NotFound(f"no agent {agent!r} in this tenant")
