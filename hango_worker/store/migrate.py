"""Run alembic migrations programmatically (used by the CLI, the demo and tests)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory

HERE = Path(__file__).parent


def sqlalchemy_url(dsn: str) -> str:
    """postgresql://… → postgresql+asyncpg://… (what alembic's async env uses)."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if dsn.startswith(prefix):
            return "postgresql+asyncpg://" + dsn[len(prefix) :]
    raise ValueError(f"not a postgres URL: {dsn.split('@')[-1]!r}")


def alembic_config(dsn: str) -> Config:
    cfg = Config(str(HERE / "alembic.ini"))
    cfg.set_main_option("script_location", str(HERE / "migrations"))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(dsn).replace("%", "%%"))
    return cfg


def head_revision() -> str:
    script = ScriptDirectory.from_config(alembic_config("postgresql://x@/x"))
    head = script.get_current_head()
    assert head is not None
    return head


async def upgrade(dsn: str, revision: str = "head") -> None:
    await asyncio.to_thread(command.upgrade, alembic_config(dsn), revision)


async def downgrade(dsn: str, revision: str) -> None:
    await asyncio.to_thread(command.downgrade, alembic_config(dsn), revision)


async def upgrade_and_seed(dsn: str) -> None:
    """Migrate to head, then make sure the default tenant exists (what `migrate` does)."""
    from hango_worker.store import db, repo

    await upgrade(dsn, "head")
    conn = await db.connect(dsn)
    try:
        await repo.ensure_default_tenant(conn)
    finally:
        await conn.close()
