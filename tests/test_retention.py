"""Retention policies (store/retention.py): the fleet default, a tenant's policy and an
agent's override, each kind falling through on its own; a pass deletes exactly what
is past its policy and never a run not finished, or the parent or child of one."""

from __future__ import annotations

import json

import asyncpg
from prometheus_client import REGISTRY

from hango_worker.run.retention import record
from hango_worker.store.retention import LOCK_KEY, enforce, list_policies, set_policy
from tests import test_purge
from tests.test_cli import cli
from tests.test_purge import Tenant, _run, _session

DAY = 86_400


async def _age(pool: asyncpg.Pool, run: str, days: float) -> None:
    await pool.execute(
        "UPDATE runs SET finished_at = now() - make_interval(secs => $2) WHERE id = $1",
        run,
        days * DAY,
    )


async def _tenant(pool: asyncpg.Pool, name: str) -> Tenant:
    """test_purge's tenant (rows in every table), without its retention policies."""
    t = await test_purge._tenant(pool, name)
    await pool.execute("DELETE FROM retention WHERE tenant_id = $1", t.id)
    return t


async def _counts(pool: asyncpg.Pool, t: Tenant) -> dict[str, int]:
    out = {}
    for table in ("run_events", "run_files", "messages"):
        out[table] = await pool.fetchval(
            f"SELECT count(*) FROM {table} WHERE run_id = ANY($1::uuid[])", t.runs
        )
    for table in ("runs", "sessions", "memories", "blobs"):
        out[table] = await pool.fetchval(f"SELECT count(*) FROM {table} WHERE tenant_id = $1", t.id)
    return out


async def test_policies_fall_through_kind_by_kind(pool: asyncpg.Pool) -> None:
    acme = await _tenant(pool, "acme")
    await set_policy(pool, None, None, {"events": DAY, "runs": 30 * DAY})
    await set_policy(pool, acme.id, None, {"runs": 7 * DAY})
    await set_policy(pool, acme.id, acme.agents[0], {"files": 3600})
    await set_policy(pool, acme.id, acme.agents[0], {"events": 60})  # files stays
    rows = await list_policies(pool, acme.id)
    assert [(r["tenant"], r["agent"]) for r in rows] == [
        (None, None),
        ("acme", None),
        ("acme", "bot"),
    ]
    assert (rows[2]["files_s"], rows[2]["events_s"], rows[2]["runs_s"]) == (3600, 60, None)
    await set_policy(pool, acme.id, acme.agents[0], {"events": None})
    assert (await list_policies(pool, acme.id))[2]["events_s"] is None


async def test_a_pass_removes_what_is_past_its_policy_and_nothing_alive(
    pool: asyncpg.Pool,
) -> None:
    acme, other = await _tenant(pool, "acme"), await _tenant(pool, "other")
    fork_session = acme.sessions[2]
    fork = acme.runs[3]
    for run in acme.runs + other.runs:
        await _age(pool, run, 10)
    await _age(pool, fork, 1)  # recent
    live_session = await _session(pool, acme)
    old_in_live = await _run(pool, acme, live_session)
    await _age(pool, old_in_live, 10)
    await _run(pool, acme, live_session, "queued")  # keeps its session's history
    orphan = await _session(pool, acme)
    await pool.execute(
        "UPDATE sessions SET created_at = now() - interval '10 days' WHERE id = $1", orphan
    )
    await pool.execute(
        "UPDATE memories SET updated_at = now() - interval '10 days' WHERE tenant_id = $1",
        acme.id,
    )
    policy = {k: 5 * DAY for k in ("runs", "events", "files", "sessions", "memories")}
    await set_policy(pool, acme.id, None, policy)  # the other tenant: no policy
    others = await _counts(pool, other)

    result = await enforce(pool, batch_size=3)

    assert result.ran
    left = await pool.fetch("SELECT id::text FROM runs WHERE tenant_id = $1", acme.id)
    names = {fork: "fork", old_in_live: "old_in_live", acme.runs[-1]: "queued"}
    assert sorted(names.get(r["id"], r["id"]) for r in left) == ["fork", "old_in_live", "queued"]
    # the recent fork keeps its events; the old run of the live session loses them
    assert await pool.fetchval("SELECT count(*) FROM run_events WHERE run_id = $1", fork) == 1
    assert (
        await pool.fetchval("SELECT count(*) FROM run_events WHERE run_id = $1", old_in_live) == 0
    )
    assert (
        await pool.fetchval("SELECT count(*) FROM messages WHERE run_id = $1", old_in_live) == 1
    )  # its history stays while the session goes on
    sessions = await pool.fetch("SELECT id::text FROM sessions WHERE tenant_id = $1", acme.id)
    assert sorted(r["id"] for r in sessions) == sorted([fork_session, live_session])
    # s1's session memory went with s1; a queued run of the agent keeps the agent's
    # memories (it may read them)
    assert await pool.fetchval("SELECT count(*) FROM memories WHERE tenant_id = $1", acme.id) == 1
    assert await _counts(pool, other) == others
    assert result.deleted["runs"] == 3 and result.deleted["sessions"] == 3

    # once the queued run is finished, the agent's old memories go too
    await pool.execute(
        "UPDATE runs SET status = 'cancelled', finished_at = now() WHERE tenant_id = $1 "
        "AND status = 'queued'",
        acme.id,
    )
    again = await enforce(pool)
    assert again.deleted.get("memories") == 1
    before = (
        REGISTRY.get_sample_value("hango_retention_rows_removed_total", {"table": "memories"})
        or 0.0
    )
    record(again)
    assert (
        REGISTRY.get_sample_value("hango_retention_rows_removed_total", {"table": "memories"})
        == before + 1
    )
    assert (REGISTRY.get_sample_value("hango_retention_oldest_run_seconds") or 0) > 0


async def test_a_parent_or_child_of_a_live_run_stays(pool: asyncpg.Pool) -> None:
    acme = await _tenant(pool, "acme")
    first, second, child, fork = acme.runs
    await pool.execute(
        "UPDATE runs SET status = 'running', finished_at = NULL WHERE id = $1", child
    )
    for run in (first, second, fork):
        await _age(pool, run, 10)
    await set_policy(pool, acme.id, None, {"runs": DAY})
    result = await enforce(pool)
    left = {r["id"] for r in await pool.fetch("SELECT id::text FROM runs")}
    assert left == {first, second, child}  # the fork went; the running child's parent stays
    assert result.deleted["runs"] == 1


async def test_one_process_at_a_time(pool: asyncpg.Pool) -> None:
    acme = await _tenant(pool, "acme")
    for run in acme.runs:
        await _age(pool, run, 10)
    await set_policy(pool, None, None, {"events": DAY})
    async with pool.acquire() as other:
        assert await other.fetchval("SELECT pg_try_advisory_lock($1)", LOCK_KEY)
        skipped = await enforce(pool)
        await other.fetchval("SELECT pg_advisory_unlock($1)", LOCK_KEY)
    assert not skipped.ran and skipped.deleted == {}
    assert (await enforce(pool)).deleted == {"run_events": 4}


def test_the_cli_sets_shows_and_removes_policies(dsn: str) -> None:
    cli(dsn, "tenants", "create", "acme")
    cli(dsn, "agents", "create", "--tenant", "acme", "--name", "bot", "--model", "m")
    cli(dsn, "retention", "set", "--fleet", "--events", "30d")
    cli(dsn, "retention", "set", "--tenant", "acme", "--runs", "30d", "--events", "7d")
    cli(dsn, "retention", "set", "--tenant", "acme", "--agent", "bot", "--files", "12h")
    shown = json.loads(cli(dsn, "retention", "show", "--tenant", "acme", "--json").stdout)
    assert [(r["tenant"], r["agent"], r["events_s"]) for r in shown] == [
        (None, None, 30 * DAY),
        ("acme", None, 7 * DAY),
        ("acme", "bot", None),
    ]
    text = cli(dsn, "retention", "show", "--tenant", "acme").stdout
    assert "runs=30d events=7d" in text and "files=12h" in text
    for args, code, words in [
        (("retention", "set", "--tenant", "acme"), 2, "at least one"),
        (("retention", "set", "--runs", "soon"), 2, "invalid age"),
        (
            ("retention", "set", "--tenant", "acme", "--agent", "nobot", "--runs", "1d"),
            3,
            "no agent",
        ),
        (("retention", "rm", "--tenant", "acme", "--agent", "bot"), 0, ""),
        (("retention", "rm", "--tenant", "acme", "--agent", "bot"), 3, "no such policy"),
    ]:
        p = cli(dsn, *args, ok=False)
        assert p.returncode == code and words in p.stderr, (args, p.stderr)
