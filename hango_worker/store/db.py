"""asyncpg pools with JSON codecs."""

from __future__ import annotations

import json

import asyncpg


async def _init(conn: asyncpg.Connection) -> None:
    for typ in ("jsonb", "json"):
        await conn.set_type_codec(typ, encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's per-release reset query (UNLISTEN *, RESET ALL, …): pool
    connections keep no session state (LISTEN has its own connection), and the
    reset is an extra round trip after every hot-path statement. An open
    transaction is still rolled back by asyncpg itself."""


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        _asyncpg_dsn(dsn),
        min_size=min_size,
        max_size=max_size,
        init=_init,
        statement_cache_size=256,
        reset=_no_reset,
    )


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(_asyncpg_dsn(dsn))
    await _init(conn)
    return conn


def _asyncpg_dsn(dsn: str) -> str:
    if dsn.startswith("postgresql+asyncpg://"):
        return "postgresql://" + dsn[len("postgresql+asyncpg://") :]
    return dsn


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    if "@" not in dsn or "://" not in dsn:
        return dsn
    scheme, rest = dsn.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"
