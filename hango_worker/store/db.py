"""asyncpg pools with JSON codecs; which database to use; why it cannot be used.

Connection failures become `Unavailable` with one line naming the cause and
what to do (unreachable, no such database, refused credentials, not
migrated), never a driver traceback. The DSN's password is never printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

from hango_worker.config import asyncpg_dsn

CONNECT_TIMEOUT_S = 10.0


class Unavailable(RuntimeError):
    """The database cannot be used as it is; the message says why and what to do."""


# `json.dumps` with no options, without its own call on every value the hot path writes
# (a checkpoint's state_json, usage, …): the same text, from one encoder made once.
_encode = json.JSONEncoder().encode


async def _init(conn: asyncpg.Connection) -> None:
    for typ in ("jsonb", "json"):
        await conn.set_type_codec(typ, encoder=_encode, decoder=json.loads, schema="pg_catalog")


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Skip asyncpg's per-release reset query (UNLISTEN *, RESET ALL, …): pool
    connections keep no session state (LISTEN has its own connection), and the
    reset is an extra round trip after every hot-path statement. An open
    transaction is still rolled back by asyncpg itself."""


async def create_pool(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    server_settings: dict[str, str] | None = None,
) -> asyncpg.Pool:
    return await asyncpg.create_pool(
        asyncpg_dsn(dsn),
        min_size=min_size,
        max_size=max_size,
        init=_init,
        statement_cache_size=256,
        reset=_no_reset,
        server_settings=server_settings,
    )


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(asyncpg_dsn(dsn))
    await _init(conn)
    return conn


def redact(dsn: str) -> str:
    """The DSN without its password, for messages."""
    if "@" not in dsn or "://" not in dsn:
        return dsn
    scheme, rest = dsn.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}@{host}"


def describe_connect_error(dsn: str, err: BaseException) -> str:
    """One line: what went wrong connecting to `dsn`, and what to do about it."""
    where = redact(dsn)
    if isinstance(err, asyncpg.InvalidCatalogNameError):
        return (
            f"database unavailable: {err} (at {where}): create it (e.g. `createdb`) "
            "or fix the database name in HANGO_DATABASE_URL"
        )
    if isinstance(err, asyncpg.InvalidAuthorizationSpecificationError) and "no encryption" in str(
        err
    ):
        return (
            f"database unavailable: {where} requires TLS ({err}): "
            "set sslmode=require (or verify-full) in HANGO_DATABASE_URL"
        )
    if isinstance(
        err, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return (
            f"database unavailable: {where} refused the credentials ({err}): "
            "check the user and password in HANGO_DATABASE_URL"
        )
    if isinstance(err, TimeoutError):
        return (
            f"database unavailable: no answer from {where} within {CONNECT_TIMEOUT_S:g}s: "
            "check that Postgres is up and reachable"
        )
    if isinstance(err, socket.gaierror):
        return f"database unavailable: cannot resolve the host of {where}: check HANGO_DATABASE_URL"
    if isinstance(err, OSError):
        cause = str(err) or type(err).__name__
        return (
            f"database unavailable: cannot connect to {where} ({cause}): "
            "check that Postgres is up and HANGO_DATABASE_URL is right"
        )
    detail = str(err).splitlines()[0] if str(err) else type(err).__name__
    return f"database unavailable: {where}: {detail}"


def not_migrated(dsn: str) -> str:
    return (
        f"database unavailable: {redact(dsn)} is not migrated (no schema): "
        "run `hango-worker migrate` first"
    )


async def check_connect(dsn: str) -> asyncpg.Connection:
    """A connection, or `Unavailable` with one line naming the cause."""
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            return await connect(dsn)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        raise Unavailable(describe_connect_error(dsn, e)) from None  # ValueError: a bad URL


async def schema_revision(dsn: str) -> str | None:
    """The database's alembic revision (None: never migrated); `Unavailable` if unreachable."""
    conn = await check_connect(dsn)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            if await conn.fetchval("SELECT to_regclass('alembic_version')") is None:
                return None
            version = await conn.fetchval("SELECT version_num FROM alembic_version LIMIT 1")
    except (OSError, TimeoutError, asyncpg.PostgresError) as e:
        raise Unavailable(describe_connect_error(dsn, e)) from None
    finally:
        conn.terminate()
    return None if version is None else str(version)


async def require_migrated(dsn: str) -> str:
    """The revision, or `Unavailable` when the database is unreachable or not migrated."""
    revision = await schema_revision(dsn)
    if revision is None:
        raise Unavailable(not_migrated(dsn))
    return revision


async def open_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """`create_pool`, with connection failures as `Unavailable`."""
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            return await create_pool(dsn, min_size=min_size, max_size=max_size)
    except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        raise Unavailable(describe_connect_error(dsn, e)) from None  # ValueError: a bad URL


@asynccontextmanager
async def resolve(database_url: str | None, data_dir: Path) -> AsyncIterator[str]:
    """The DSN to use: `database_url`, or the embedded server under `data_dir`."""
    if database_url:
        yield database_url
        return
    from hango_worker.store import embedded

    try:
        _server, dsn = await asyncio.to_thread(embedded.start, data_dir)
    except Exception as e:
        raise Unavailable(
            f"database unavailable: could not start the embedded Postgres in {data_dir}: {e}"
        ) from e
    # one line, so nobody mistakes a development database for the real one
    where = await asyncio.to_thread(os.path.abspath, data_dir)
    print(
        f"HANGO_DATABASE_URL is unset: using an embedded development database in {where}",
        file=sys.stderr,
    )
    yield dsn
