"""The database a command's handler works in: the DSN, a pool, the tenant it acts in."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import asyncpg

from hango_worker.config import Settings
from hango_worker.store import db


def database(settings: Settings) -> AbstractAsyncContextManager[str]:
    """The DSN to use: HANGO_DATABASE_URL, or the embedded server under HANGO_DATA_DIR."""
    return db.resolve(settings.database_url, settings.data_dir)


@asynccontextmanager
async def pool_for(settings: Settings, *, size: int = 4) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    async with database(settings) as dsn:
        pool = await db.open_pool(dsn, min_size=1, max_size=size)
        try:
            yield dsn, pool
        except asyncpg.UndefinedTableError:
            raise db.Unavailable(db.not_migrated(dsn)) from None
        finally:
            await pool.close()


async def tenant_of(pool: asyncpg.Pool, a: argparse.Namespace) -> str:
    """The tenant a command acts in: `--tenant NAME|ID`, else the default tenant."""
    from hango_worker.store.tenants import resolve_tenant

    return await resolve_tenant(pool, getattr(a, "tenant_name", None))
