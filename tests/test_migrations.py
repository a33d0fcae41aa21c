"""alembic upgrade head == the SQLAlchemy metadata; downgrades drop what each step added."""

from __future__ import annotations

import asyncpg
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import create_async_engine

from hango_worker.store import migrate
from hango_worker.store.schema import metadata


async def _diff(dsn: str) -> list[object]:
    engine = create_async_engine(migrate.sqlalchemy_url(dsn), poolclass=pool.NullPool)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda c: compare_metadata(MigrationContext.configure(c), metadata)
            )
    finally:
        await engine.dispose()


async def _columns(dsn: str, table: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_name = $1", table
        )
        return {r["column_name"] for r in rows}
    finally:
        await conn.close()


async def test_upgrade_head_matches_metadata(empty_dsn: str) -> None:
    await migrate.upgrade(empty_dsn, "head")
    assert await _diff(empty_dsn) == []


async def test_one_downgrade_step_drops_queue_columns_and_upgrade_restores_them(
    empty_dsn: str,
) -> None:
    await migrate.upgrade(empty_dsn, "head")
    assert {"queued_at", "idempotency_key"} <= await _columns(empty_dsn, "runs")
    assert "message_seq" in await _columns(empty_dsn, "tool_calls")
    await migrate.downgrade(empty_dsn, "-1")
    cols = await _columns(empty_dsn, "runs")
    assert not {"queued_at", "idempotency_key"} & cols
    assert "message_seq" not in await _columns(empty_dsn, "tool_calls")
    assert {"id", "status", "attempt", "lease_owner", "state_json"} <= cols
    await migrate.downgrade(empty_dsn, "-1")
    assert "state_json" not in await _columns(empty_dsn, "runs")
    await migrate.upgrade(empty_dsn, "head")
    assert await _diff(empty_dsn) == []


async def test_upgrade_to_0003_backfills_queued_at_and_message_seq(empty_dsn: str) -> None:
    await migrate.upgrade(empty_dsn, "0002_run_state")
    conn = await asyncpg.connect(empty_dsn)
    try:
        t, a, s, r = (f"00000000-0000-0000-0000-00000000000{i}" for i in range(1, 5))
        await conn.execute("INSERT INTO tenants (id, name) VALUES ($1, 't')", t)
        await conn.execute(
            "INSERT INTO agents (id, tenant_id, name, model) VALUES ($1, $2, 'a', 'm')", a, t
        )
        await conn.execute(
            "INSERT INTO sessions (id, tenant_id, agent_id) VALUES ($1, $2, $3)", s, t, a
        )
        await conn.execute(
            "INSERT INTO runs (id, tenant_id, session_id, agent_id, input, created_at) "
            "VALUES ($1, $2, $3, $4, '{}', now() - interval '1 day')",
            r,
            t,
            s,
            a,
        )
        use = '[{"type": "tool_use", "id": "toolu_1", "name": "x", "input": {}}]'
        for seq, role, content in [(1, "user", "[]"), (2, "assistant", use), (3, "user", "[]")]:
            await conn.execute(
                "INSERT INTO messages (session_id, seq, run_id, role, content) "
                "VALUES ($1, $2, $3, $4, $5::jsonb)",
                s,
                seq,
                r,
                role,
                content,
            )
        for call in ("toolu_1", "toolu_orphan"):
            await conn.execute(
                "INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt) "
                "VALUES ($1, $2, 'x', '{}', 1)",
                r,
                call,
            )
        await migrate.upgrade(empty_dsn, "head")
        assert await conn.fetchval("SELECT queued_at = created_at FROM runs")
        rows = await conn.fetch("SELECT tool_use_id, message_seq FROM tool_calls ORDER BY 1")
        assert [tuple(x) for x in rows] == [("toolu_1", 2), ("toolu_orphan", None)]
    finally:
        await conn.close()


async def test_downgrade_to_base_leaves_no_tables(empty_dsn: str) -> None:
    await migrate.upgrade(empty_dsn, "head")
    await migrate.downgrade(empty_dsn, "base")
    conn = await asyncpg.connect(empty_dsn)
    try:
        tables = await conn.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
            "AND tablename <> 'alembic_version'"
        )
    finally:
        await conn.close()
    assert tables == []
