"""alembic upgrade head == the SQLAlchemy metadata; downgrades drop what each step added;
the alembic CLI works from the repository root; readiness follows schema compatibility."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import pool
from sqlalchemy.ext.asyncio import create_async_engine

from hango_worker.service import readiness
from hango_worker.store import migrate
from hango_worker.store.schema import metadata
from hango_worker.telemetry.metrics_server import NotReady


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


async def _tables(dsn: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
        return {r["table_name"] for r in rows}
    finally:
        await conn.close()


async def _producer_api(dsn: str) -> tuple[bool, int, bool]:
    """0009_producer_api: the schema hango_api, its internal functions beside the tables,
    the role hango_producer."""
    conn = await asyncpg.connect(dsn)
    try:
        return (
            await conn.fetchval(
                "SELECT count(*) = 1 FROM pg_namespace WHERE nspname = 'hango_api'"
            ),
            await conn.fetchval(
                "SELECT count(*) FROM pg_proc WHERE proname IN "
                "('hango_enqueue_run', 'hango_run_input', 'hango_tenant_id')"
            ),
            await conn.fetchval(
                "SELECT count(*) = 1 FROM pg_roles WHERE rolname = 'hango_producer'"
            ),
        )
    finally:
        await conn.close()


async def test_downgrade_steps_drop_what_each_revision_added_and_upgrade_restores_them(
    empty_dsn: str,
) -> None:
    await migrate.upgrade(empty_dsn, "head")
    assert "rate_limits" in await _tables(empty_dsn)
    assert {"priority", "output"} <= await _columns(empty_dsn, "runs")
    assert {"weight", "max_running"} <= await _columns(empty_dsn, "tenants")
    await migrate.downgrade(empty_dsn, "0009_producer_api")
    assert "output" not in await _columns(empty_dsn, "runs")
    assert "rate_limits" not in await _tables(empty_dsn)
    assert "priority" not in await _columns(empty_dsn, "runs")
    assert not {"weight", "max_running"} & await _columns(empty_dsn, "tenants")
    assert "max_running" not in await _columns(empty_dsn, "agents")
    assert "skills" in await _tables(empty_dsn) and "depth" in await _columns(empty_dsn, "runs")
    assert await _producer_api(empty_dsn) == (True, 3, True)
    await migrate.downgrade(empty_dsn, "0008_subagents_skills")
    assert await _producer_api(empty_dsn) == (False, 0, True)  # the role is the server's
    await migrate.upgrade(empty_dsn, "0009_producer_api")  # and again, with the role there
    assert await _producer_api(empty_dsn) == (True, 3, True)
    await migrate.downgrade(empty_dsn, "0007_run_states")
    assert await _producer_api(empty_dsn) == (False, 0, True)
    assert "skills" not in await _tables(empty_dsn)
    assert "parent_run_id" not in await _columns(empty_dsn, "runs")
    assert "run_states" in await _tables(empty_dsn)
    await migrate.downgrade(empty_dsn, "0006_waiting")
    assert "run_states" not in await _tables(empty_dsn)
    assert {"waiting_for", "waiting_since", "waiting_until"} <= await _columns(empty_dsn, "runs")
    assert "run_decisions" in await _tables(empty_dsn)
    await migrate.downgrade(empty_dsn, "0005_memories")
    assert not {"waiting_for", "waiting_since"} & await _columns(empty_dsn, "runs")
    assert "run_decisions" not in await _tables(empty_dsn)
    assert "memories" in await _tables(empty_dsn)
    await migrate.downgrade(empty_dsn, "0004_run_files")
    assert "memories" not in await _tables(empty_dsn)
    assert "limit_reached" in await _columns(empty_dsn, "runs")
    assert "run_files" in await _tables(empty_dsn)
    await migrate.downgrade(empty_dsn, "0003_queue_integrity")
    assert "limit_reached" not in await _columns(empty_dsn, "runs")
    assert "run_files" not in await _tables(empty_dsn)
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


async def _foreign_keys(dsn: str, table: str) -> set[str]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT conname FROM pg_constraint WHERE contype = 'f' AND conrelid = $1::regclass",
            table,
        )
        return {r["conname"] for r in rows}
    finally:
        await conn.close()


async def test_0011_drops_only_the_messages_session_check_and_downgrade_restores_it(
    empty_dsn: str,
) -> None:
    """A message's session is its run's (runs.session_id has the foreign key): 0011 drops
    the repeated check; the one to runs, which cascades, stays."""
    await migrate.upgrade(empty_dsn, "0010_tenants")
    both = {"messages_session_id_fkey", "messages_run_id_fkey"}
    assert await _foreign_keys(empty_dsn, "messages") == both
    await migrate.upgrade(empty_dsn, "0011_messages_session_fk")
    assert await _foreign_keys(empty_dsn, "messages") == {"messages_run_id_fkey"}
    assert "runs_session_id_fkey" in await _foreign_keys(empty_dsn, "runs")
    assert (  # code at 0010 (and 0009, as 0010 serves it) runs on it: a rollback stays ready
        migrate.oldest_code_served(migrate.revisions(), "0011_messages_session_fk")
        == "0009_producer_api"
    )
    await migrate.downgrade(empty_dsn, "0010_tenants")
    assert await _foreign_keys(empty_dsn, "messages") == both


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


# -- the alembic CLI from a checkout (alembic.ini + alembic/ at the top level) ----------------

ROOT = Path(__file__).resolve().parent.parent


def alembic_cli(*args: str, url: str | None = None, x_url: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    if url is not None:
        env["HANGO_DATABASE_URL"] = url
    argv = [sys.executable, "-m", "alembic"]
    if x_url is not None:
        argv += ["-x", f"url={x_url}"]
    p = subprocess.run(
        [*argv, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert p.returncode == 0, (args, p.stdout[-2000:], p.stderr[-3000:])
    return p.stdout + p.stderr


async def test_alembic_cli_works_from_the_repository_root(empty_dsn: str) -> None:
    head = migrate.head_revision()
    # HANGO_DATABASE_URL is the database
    await asyncio.to_thread(alembic_cli, "upgrade", "head", url=empty_dsn)
    assert head in await asyncio.to_thread(alembic_cli, "current", url=empty_dsn)
    assert await _diff(empty_dsn) == []
    history = await asyncio.to_thread(alembic_cli, "history", url=empty_dsn)
    assert all(r.revision in history for r in migrate.revisions())
    await asyncio.to_thread(alembic_cli, "downgrade", "-1", url=empty_dsn)
    current = await asyncio.to_thread(alembic_cli, "current", url=empty_dsn)
    assert migrate.revisions()[-2].revision in current and head not in current
    # -x url= wins over (here: stands in for an unset) HANGO_DATABASE_URL
    await asyncio.to_thread(alembic_cli, "upgrade", "head", x_url=empty_dsn)
    assert await _diff(empty_dsn) == []
    assert head in await asyncio.to_thread(alembic_cli, "current", x_url=empty_dsn)


def test_alembic_offline_sql_needs_no_database() -> None:
    sql = alembic_cli("upgrade", "head", "--sql")
    assert "CREATE TABLE runs" in sql
    assert "ALTER TABLE runs ADD COLUMN state_json" in sql
    head = migrate.head_revision()
    oldest = migrate.oldest_code_served(migrate.revisions(), head)
    assert f"COMMENT ON TABLE alembic_version IS '{migrate.compat_comment(head, oldest)}'" in sql


def test_alembic_without_a_url_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    p = subprocess.run(
        [sys.executable, "-m", "alembic", "current"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode != 0
    assert "set HANGO_DATABASE_URL or pass -x url=" in p.stderr


# -- schema compatibility: readiness after an upgrade and after a rollback -------------------

EXTRA = '''"""test revision {rev}"""
import sqlalchemy as sa
from alembic import op

revision = "{rev}"
down_revision = "{down}"
branch_labels = None
depends_on = None
serves_code_since = "{serves}"


def upgrade() -> None:
    op.add_column("runs", sa.Column("{column}", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "{column}")
'''


def newer_migrations(tmp: Path) -> Path:
    """This code's migrations plus two newer revisions, as the next release would ship them:
    0098_expand (additive: serves this code's head) and 0099_contract (serves only itself)."""
    where = tmp / "alembic"
    shutil.copytree(migrate.script_location(), where, ignore=shutil.ignore_patterns("__pycache__"))
    head = migrate.head_revision()
    for rev, down, serves, column in (
        ("0098_expand", head, head, "extra_a"),
        ("0099_contract", "0098_expand", "0099_contract", "extra_b"),
    ):
        text = EXTRA.format(rev=rev, down=down, serves=serves, column=column)
        (where / "versions" / f"{rev}.py").write_text(text, encoding="utf-8")
    return where


async def upgrade_with(script_location: Path, dsn: str, revision: str) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.set_main_option("sqlalchemy.url", migrate.sqlalchemy_url(dsn))
    await asyncio.to_thread(command.upgrade, cfg, revision)


async def not_ready_reason(dsn: str) -> str | None:
    try:
        assert await readiness(dsn)() is True
    except NotReady as e:
        return str(e)
    return None


async def test_code_one_revision_behind_the_database_stays_ready(
    empty_dsn: str, tmp_path: Path
) -> None:
    """Rollback: the database was migrated by the next release (an additive revision); this,
    the previous code, has never seen that revision's file and is still ready."""
    newer = newer_migrations(tmp_path)
    await upgrade_with(newer, empty_dsn, "0098_expand")
    assert await not_ready_reason(empty_dsn) is None
    # a contracting revision on top: this code is no longer served, and says why
    await upgrade_with(newer, empty_dsn, "0099_contract")
    reason = await not_ready_reason(empty_dsn)
    assert reason is not None
    assert "0099_contract" in reason and migrate.head_revision() in reason
    assert "serves code since 0099_contract" in reason
    # a revision set by hand, which no migration recorded a comment for: not served
    conn = await asyncpg.connect(empty_dsn)
    try:
        await conn.execute("UPDATE alembic_version SET version_num = '0098_expand'")
    finally:
        await conn.close()
    reason = await not_ready_reason(empty_dsn)
    assert reason is not None and "an unrecorded revision" in reason


async def test_an_older_release_migrate_step_leaves_a_newer_schema_alone(
    empty_dsn: str, tmp_path: Path
) -> None:
    """Rolling back re-runs the older release's `migrate`: it must neither fail on the
    unknown newer revision while that schema serves it, nor touch the schema."""
    newer = newer_migrations(tmp_path)
    await upgrade_with(newer, empty_dsn, "0098_expand")
    await migrate.upgrade_and_seed(empty_dsn)
    conn = await asyncpg.connect(empty_dsn)
    try:
        assert (await migrate.read_schema_state(conn))[0] == "0098_expand"
        assert await conn.fetchval("SELECT count(*) FROM tenants") == 1
    finally:
        await conn.close()
    await upgrade_with(newer, empty_dsn, "0099_contract")
    with pytest.raises(migrate.SchemaNewerThanCode) as caught:
        await migrate.upgrade_and_seed(empty_dsn)
    assert "0099_contract" in str(caught.value) and migrate.head_revision() in str(caught.value)


async def test_code_newer_than_the_database_is_not_ready(empty_dsn: str) -> None:
    head, previous = migrate.head_revision(), migrate.revisions()[-2].revision
    assert await not_ready_reason(empty_dsn) is not None  # no schema at all
    await migrate.upgrade(empty_dsn, previous)
    reason = await not_ready_reason(empty_dsn)
    assert reason is not None
    assert previous in reason and head in reason and "hango-worker migrate" in reason
    await migrate.upgrade(empty_dsn, "head")
    assert await not_ready_reason(empty_dsn) is None


async def test_migrate_records_the_oldest_code_the_schema_serves(empty_dsn: str) -> None:
    await migrate.upgrade(empty_dsn, "head")
    conn = await asyncpg.connect(empty_dsn)
    try:
        rev, comment = await migrate.read_schema_state(conn)
    finally:
        await conn.close()
    assert rev == migrate.head_revision()
    oldest = migrate.oldest_code_served(migrate.revisions(), rev)
    assert comment == migrate.compat_comment(rev, oldest)
    # 0002 is additive: a database at 0002 still serves code at 0001
    assert migrate.oldest_code_served(migrate.revisions(), "0002_run_state") == "0001_initial"


def test_oldest_code_served_follows_the_declarations() -> None:
    R = migrate.Revision
    chain = (R("a", "a"), R("b", "a"), R("c", "b"), R("d", "d"), R("e", "c"))
    assert migrate.oldest_code_served(chain, "a") == "a"
    assert migrate.oldest_code_served(chain, "b") == "a"
    assert migrate.oldest_code_served(chain, "c") == "b"  # c no longer serves a
    assert migrate.oldest_code_served(chain, "d") == "d"  # a contract step
    assert migrate.oldest_code_served(chain, "e") == "d"  # e says c, but d already broke c
