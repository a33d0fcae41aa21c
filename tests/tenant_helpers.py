"""Tenants, agents and many queued runs, fast (one statement per batch of runs)."""

from __future__ import annotations

import asyncpg

from hango_worker.store import repo, sql, tenants


async def tenant_with_agent(
    pool: asyncpg.Pool, name: str, *, max_running: int | None = None, weight: int = 1
) -> str:
    if name == "default":
        tid = await repo.ensure_default_tenant(pool)
    else:
        tid = await tenants.create_tenant(pool, name, weight=weight, max_running=max_running)
    await repo.create_agent(
        pool, tenant_id=tid, name="agent", model="claude-test", system=[], tools=[], config={}
    )
    return tid


async def bulk_enqueue(pool: asyncpg.Pool, tenant_id: str, n: int, priority: int = 0) -> None:
    """`n` runs of the tenant's agent "agent", each in its own session, oldest first."""
    await pool.execute(
        """
        WITH a AS (SELECT id FROM agents WHERE tenant_id = $1 AND name = 'agent'),
        s AS (
            INSERT INTO sessions (id, tenant_id, agent_id)
            SELECT gen_random_uuid(), $1, a.id FROM a, generate_series(1, $2)
            RETURNING id, agent_id
        )
        INSERT INTO runs (id, tenant_id, session_id, agent_id, input, priority, created_at)
        SELECT gen_random_uuid(), $1, s.id, s.agent_id, '{"text": "go"}',  $3,
            clock_timestamp()
        FROM s
        """,
        tenant_id,
        n,
        priority,
    )


async def claim(pool: asyncpg.Pool, n: int, worker: str = "w1") -> list[asyncpg.Record]:
    return list(await pool.fetch(sql.CLAIM, worker, n, 30.0))
