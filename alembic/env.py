"""Alembic environment: async (asyncpg).

The database URL, first found wins:
1. `-x url=postgresql://…` on the alembic command line;
2. `sqlalchemy.url` set by the caller (`hango_worker.store.migrate`, i.e. `hango-worker migrate`);
3. the `HANGO_DATABASE_URL` environment variable (or the file HANGO_DATABASE_URL_FILE names).

Offline mode (`alembic upgrade head --sql`) needs no database and no URL; its output
applies with `psql -v ON_ERROR_STOP=1 -f`.

Every run, online or offline, sets `lock_timeout` and `statement_timeout` first (defaults
and overrides: hango_worker/store/migrate.py LOCK_TIMEOUT; `-x lock_timeout=30s -x
statement_timeout=1h`), and ends by granting the producer API to its role when the role
exists (hango_worker/store/cluster.py).
"""

from __future__ import annotations

import asyncio
import os
from logging.config import fileConfig

import asyncpg
from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from hango_worker.config import ConfigError, asyncpg_dsn, load_secret_files
from hango_worker.store.cluster import GRANTS_SQL
from hango_worker.store.migrate import (
    compat_comment_sql,
    configured_timeouts,
    sqlalchemy_url,
    timeout_statements,
)
from hango_worker.store.schema import metadata

config = context.config
target_metadata = metadata

# The alembic CLI (alembic.ini) gets its log lines; a program calling us keeps its own logging.
if config.config_file_name is not None and config.get_section("loggers") is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def database_url() -> str | None:
    try:  # HANGO_DATABASE_URL_FILE (docs/operations.md "Secrets from files")
        load_secret_files()
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    url = context.get_x_argument(as_dictionary=True).get("url")
    url = url or config.get_main_option("sqlalchemy.url") or os.environ.get("HANGO_DATABASE_URL")
    return sqlalchemy_url(url) if url else None


def timeouts() -> list[str]:
    x_arguments = context.get_x_argument(as_dictionary=True)
    return timeout_statements(*configured_timeouts(x_arguments, config))


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata)
    with context.begin_transaction():
        # one migrator at a time, whatever starts them (waiting for it is not bounded)
        connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7261536)")
        for statement in timeouts():
            connection.exec_driver_sql(statement)
        context.run_migrations()
        # record which code this schema serves, for code that has never seen these files
        current = context.get_context().get_current_revision()
        if current is not None:
            connection.exec_driver_sql(compat_comment_sql(context.script, current))
        connection.exec_driver_sql(GRANTS_SQL)


async def _main(url: str) -> None:
    # asyncpg reads the URL's parameters itself (sslmode, sslrootcert, host=/socket, …):
    # SQLAlchemy would pass them as keyword arguments asyncpg does not take
    # (docs/operations.md "Database URLs")
    try:
        dsn = asyncpg_dsn(url)
    except ValueError as e:
        raise SystemExit(f"configuration error: the database URL is not valid: {e}") from None
    engine = create_async_engine(
        "postgresql+asyncpg://",
        async_creator=lambda: asyncpg.connect(dsn),
        poolclass=pool.NullPool,
    )
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


def _online() -> None:
    url = database_url()
    if url is None:
        raise SystemExit(
            "no database URL: set HANGO_DATABASE_URL or pass -x url=postgresql://user@host/db"
        )
    asyncio.run(_main(url))


if context.is_offline_mode():
    url = database_url()
    context.configure(
        url=url,
        dialect_name=None if url else "postgresql",
        target_metadata=metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        for statement in timeouts():
            context.execute(statement)
        context.run_migrations()
        target = context.get_revision_argument()
        resolved = context.script.get_revision(target) if isinstance(target, str) else None
        if resolved is not None:
            context.execute(compat_comment_sql(context.script, resolved.revision))
        context.execute(GRANTS_SQL)
else:
    _online()
