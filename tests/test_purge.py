"""`hango_worker.store.purge`: a tenant's (a session's, a run's) purge leaves no row of
it in any table — the tables enumerated from the catalog, so a new table the purge does
not know fails here — and leaves every other tenant's rows untouched."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field

import asyncpg
import pytest

from hango_worker.store import repo
from hango_worker.store.purge import PURGED_TABLES, purge_run, purge_session, purge_tenant
from hango_worker.store.repo import Conflict, NotFound
from tests.test_cli import cli

# Tables that hold no tenant's rows: the fleet-wide model rate limits and alembic's.
GLOBAL_TABLES = {"rate_limits", "alembic_version"}
SHARED = hashlib.sha256(b"the same bytes in both tenants").digest()


@dataclass
class Tenant:
    id: str
    agents: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)


async def _session(pool: asyncpg.Pool, t: Tenant) -> str:
    sid = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO sessions (id, tenant_id, agent_id) VALUES ($1, $2, $3)", sid, t.id, t.agents[0]
    )
    t.sessions.append(sid)
    return sid


async def _run(
    pool: asyncpg.Pool,
    t: Tenant,
    session: str,
    status: str = "succeeded",
    parent: str | None = None,
) -> str:
    """A run with rows in every table a run has rows in (a blob of its own and SHARED)."""
    rid = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO runs (id, tenant_id, session_id, agent_id, status, input, finished_at, "
        "parent_run_id, parent_tool_use_id, depth) VALUES ($1::uuid, $2, $3, $4, $5, '{}', "
        "CASE WHEN $5 IN ('succeeded', 'failed', 'cancelled') THEN now() END, $6, "
        "CASE WHEN $6::uuid IS NULL THEN NULL ELSE 'toolu_' || $1::uuid::text END, "
        "CASE WHEN $6::uuid IS NULL THEN 0 ELSE 1 END)",
        rid, t.id, session, t.agents[0], status, parent,
    )  # fmt: skip
    t.runs.append(rid)
    seq = await pool.fetchval(
        "SELECT coalesce(max(seq), 0) + 1 FROM messages WHERE session_id = $1", session
    )
    own = hashlib.sha256(rid.encode()).digest()
    await pool.execute(
        """
        WITH m AS (INSERT INTO messages (session_id, seq, run_id, role, content)
                   VALUES ($2, $3, $1, 'user', '"hi"') RETURNING 1),
        c AS (INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt)
              VALUES ($1, 'toolu_1', 'echo', '{}', 1) RETURNING 1),
        e AS (INSERT INTO run_events (run_id, seq, type) VALUES ($1, 1, 'started') RETURNING 1),
        f AS (INSERT INTO run_files (run_id, path, content, size)
              VALUES ($1, '/out.txt', 'x', 1) RETURNING 1),
        s AS (INSERT INTO run_states (run_id, turn, state_json) VALUES ($1, 1, '{}') RETURNING 1),
        d AS (INSERT INTO run_decisions (run_id, message_seq, tool_use_id, decision)
              VALUES ($1, 1, 'toolu_1', 'approve') RETURNING 1),
        h AS (INSERT INTO budget_holds (run_id, attempt, budget_ids, amount_usd)
              VALUES ($1, 1, '{}', 0.5) RETURNING 1),
        b AS (INSERT INTO blobs (tenant_id, sha256, media_type, size, data)
              VALUES ($4, $5, 'image/png', 1, 'x'), ($4, $6, 'image/png', 1, 'y')
              ON CONFLICT DO NOTHING RETURNING 1)
        SELECT (SELECT count(*) FROM m) + (SELECT count(*) FROM c) + (SELECT count(*) FROM e)
             + (SELECT count(*) FROM f) + (SELECT count(*) FROM s) + (SELECT count(*) FROM d)
             + (SELECT count(*) FROM h) + (SELECT count(*) FROM b)
        """,
        rid, session, seq, t.id, own, SHARED,
    )  # fmt: skip
    await pool.execute(
        "INSERT INTO run_blobs (run_id, sha256, tenant_id) VALUES ($1, $2, $3), ($1, $4, $3)",
        rid, own, t.id, SHARED,
    )  # fmt: skip
    await pool.execute(
        "INSERT INTO blob_files (tenant_id, sha256, account, file_id) VALUES ($1::uuid, $2, "
        "'acct', 'file_' || md5($1::text || encode($2, 'hex'))) ON CONFLICT DO NOTHING",
        t.id, own,
    )  # fmt: skip
    return rid


async def _tenant(pool: asyncpg.Pool, name: str) -> Tenant:
    """A tenant with rows in every table a tenant has rows in."""
    tid = str(uuid.uuid4())
    await pool.execute("INSERT INTO tenants (id, name) VALUES ($1, $2)", tid, name)
    t = Tenant(tid)
    t.agents.append(
        await repo.create_agent(
            pool, tenant_id=tid, name="bot", model="m", system=[], tools=[], config={}
        )
    )
    s1 = await _session(pool, t)
    first = await _run(pool, t, s1)
    await _run(pool, t, s1, "failed")  # a second run of the session
    await _run(pool, t, await _session(pool, t), parent=first)  # a subagent run
    await _run(pool, t, await _session(pool, t), "cancelled")  # a fork, say
    await pool.execute(
        """
        WITH m AS (INSERT INTO memories (tenant_id, agent_id, scope, scope_key, path, content,
                   size, run_id) VALUES ($1, $2, 'agent', '', '/a.md', 'a', 1, $4),
                   ($1, $2, 'session', $3, '/s.md', 's', 1, $4) RETURNING 1),
        k AS (INSERT INTO skills (tenant_id, name, version, description, body)
              VALUES ($1, 'sk', 1, 'd', 'b') RETURNING 1),
        p AS (INSERT INTO retention (tenant_id, agent_id, runs_s)
              VALUES ($1, NULL, 86400), ($1, $2, 3600) RETURNING 1)
        INSERT INTO budgets (tenant_id, agent_id, period, limit_usd, window_start)
        VALUES ($1, NULL, 'day', 5, now()), ($1, $2, 'month', 9, now())
        """,
        tid, t.agents[0], s1, first,
    )  # fmt: skip
    return t


async def _catalog(pool: asyncpg.Pool) -> dict[tuple[str, str], set[str]]:
    rows = await pool.fetch(
        "SELECT t.table_schema, t.table_name, array_agg(c.column_name::text) AS cols "
        "FROM information_schema.tables t JOIN information_schema.columns c "
        "ON c.table_schema = t.table_schema AND c.table_name = t.table_name "
        "WHERE t.table_schema IN ('public', 'hango_api') AND t.table_type = 'BASE TABLE' "
        "GROUP BY 1, 2"
    )
    return {(r["table_schema"], r["table_name"]): set(r["cols"]) for r in rows}


async def _rows_of(pool: asyncpg.Pool, t: Tenant) -> dict[str, int]:
    """Per table of the catalog, the rows that belong to `t` (by any key that names it)."""
    counts: dict[str, int] = {}
    keys = {
        "tenant_id": ("uuid", t.id),
        "run_id": ("uuid[]", t.runs),
        "session_id": ("uuid[]", t.sessions),
        "agent_id": ("uuid[]", t.agents),
        "parent_run_id": ("uuid[]", t.runs),
    }
    own_ids = {"tenants": t.id, "runs": t.runs, "sessions": t.sessions, "agents": t.agents}
    for (schema, table), cols in sorted((await _catalog(pool)).items()):
        if table in GLOBAL_TABLES:
            continue
        assert schema == "public" and table in PURGED_TABLES, (
            f"{schema}.{table} is a table the purge (store/purge.py) does not know: teach "
            "it (and this test) how to find and delete a tenant's rows there"
        )
        conds, args = [], []
        for col in sorted(cols & set(keys)):
            kind, value = keys[col]
            args.append(value)
            op = "= ANY" if kind == "uuid[]" else "="
            conds.append(f"{col} {op}(${len(args)}::{kind})")
        if table in own_ids:
            value = own_ids[table]
            args.append(value)
            kind = "uuid" if isinstance(value, str) else "uuid[]"
            conds.append(f"id {'=' if kind == 'uuid' else '= ANY'}(${len(args)}::{kind})")
        if table == "memories":  # session-scoped memories name their session
            args.append(t.sessions)
            conds.append(f"(scope = 'session' AND scope_key::uuid = ANY(${len(args)}::uuid[]))")
        assert conds, f"{table}: no column names a tenant, run, session or agent"
        q = f"SELECT count(*) FROM {schema}.{table} WHERE " + " OR ".join(conds)
        counts[table] = await pool.fetchval(q, *args)
    return counts


async def test_a_tenants_purge_leaves_no_row_of_it_in_any_table(pool: asyncpg.Pool) -> None:
    acme, other = await _tenant(pool, "acme"), await _tenant(pool, "other")
    await pool.execute("INSERT INTO rate_limits (key, requests_per_minute) VALUES ('m', 10)")
    before = await _rows_of(pool, acme)
    assert sorted(before) == sorted(PURGED_TABLES)
    assert all(n > 0 for n in before.values()), before  # the fixture fills every table
    others = await _rows_of(pool, other)
    large_objects = await pool.fetchval("SELECT count(*) FROM pg_largeobject_metadata")

    result = await purge_tenant(pool, acme.id, batch_size=2)  # many small batches

    after = await _rows_of(pool, acme)
    assert after == dict.fromkeys(PURGED_TABLES, 0)
    assert await _rows_of(pool, other) == others
    assert await pool.fetchval("SELECT count(*) FROM rate_limits") == 1
    assert await pool.fetchval("SELECT count(*) FROM pg_largeobject_metadata") == large_objects
    # the counts printed are the rows that were there (blobs: the tenant's own + SHARED)
    assert {k: v for k, v in result.deleted.items() if v} == {k: v for k, v in before.items() if v}
    # the other tenant's copy of the shared bytes is still whole
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM blobs WHERE tenant_id = $1 AND sha256 = $2", other.id, SHARED
        )
        == 1
    )
    with pytest.raises(NotFound):
        await purge_session(pool, acme.id, acme.sessions[0])


async def test_unfinished_runs_refuse_the_purge_before_anything_goes(pool: asyncpg.Pool) -> None:
    acme = await _tenant(pool, "acme")
    live = await _run(pool, acme, await _session(pool, acme), "waiting")
    # a subagent still running keeps its parent's session
    child = await _run(pool, acme, await _session(pool, acme), "running", parent=acme.runs[0])
    before = await _rows_of(pool, acme)
    with pytest.raises(Conflict, match="not finished"):
        await purge_tenant(pool, acme.id)
    with pytest.raises(Conflict, match="not finished"):
        await purge_run(pool, acme.id, live)
    with pytest.raises(Conflict, match=child):
        await purge_session(pool, acme.id, acme.sessions[0])
    assert await _rows_of(pool, acme) == before


async def test_a_session_purge_takes_its_runs_and_subagents_and_leaves_the_rest(
    pool: asyncpg.Pool,
) -> None:
    acme = await _tenant(pool, "acme")
    s1, child_session, fork_session = acme.sessions
    first, second, child, fork = acme.runs
    # a run of s1 alone cannot go: the session's next run replays its turns
    with pytest.raises(Conflict, match="purge the whole session"):
        await purge_run(pool, acme.id, first)
    with pytest.raises(NotFound):
        await purge_session(pool, str(uuid.uuid4()), s1)  # another tenant's id

    result = await purge_session(pool, acme.id, s1)

    assert result.deleted["runs"] == 3 and result.deleted["sessions"] == 2
    assert result.deleted["memories"] == 1  # the session's; the agent's stays
    left = await pool.fetch("SELECT id::text FROM runs WHERE tenant_id = $1", acme.id)
    assert [r["id"] for r in left] == [fork]
    assert await pool.fetchval("SELECT count(*) FROM memories WHERE tenant_id = $1", acme.id) == 1
    # SHARED stays while the fork refers to it; the purged runs' own blocks are gone
    blobs = await pool.fetch("SELECT sha256 FROM blobs WHERE tenant_id = $1", acme.id)
    assert sorted(bytes(b["sha256"]) for b in blobs) == sorted(
        [SHARED, hashlib.sha256(fork.encode()).digest()]
    )
    assert await pool.fetchval("SELECT count(*) FROM blob_files WHERE tenant_id = $1", acme.id) == 1
    # the fork alone is a run of its own session: it can go, and SHARED with it
    out = await purge_run(pool, acme.id, fork)
    assert out.deleted["runs"] == 1 and out.deleted["blobs"] == 2
    assert await pool.fetchval("SELECT count(*) FROM sessions WHERE tenant_id = $1", acme.id) == 0
    assert child_session and fork_session and second and child


def test_the_cli_wants_yes_and_prints_the_count_per_table(dsn: str) -> None:
    cli(dsn, "tenants", "create", "acme")
    cli(dsn, "agents", "create", "--tenant", "acme", "--name", "bot", "--model", "m")
    run = json.loads(
        cli(dsn, "enqueue", "--tenant", "acme", "--agent", "bot", "--input", "hi", "--json").stdout
    )["run_id"]
    p = cli(dsn, "tenants", "purge", "acme", ok=False)
    assert p.returncode == 2 and "--yes" in p.stderr
    p = cli(dsn, "tenants", "purge", "acme", "--yes", ok=False)
    assert p.returncode == 4 and run in p.stderr and "not finished" in p.stderr
    cli(dsn, "runs", "cancel", "--tenant", "acme", run)
    p = cli(dsn, "runs", "purge", "--tenant", "acme", run, "--yes", "--json", ok=False)
    assert json.loads(p.stdout)["runs"] == 1, p.stderr
    out = cli(dsn, "tenants", "purge", "acme", "--yes").stdout
    assert "tenants        1" in out and "agents         1" in out
    p = cli(dsn, "runs", "list", "--tenant", "acme", ok=False)
    assert p.returncode == 3 and "no tenant" in p.stderr
