"""7. Claim latency: the fair claim (store/sql.py CLAIM) on a deep queue, one tenant
beside 1,000.

Each case is a fresh database holding the queued runs (each in its own session); a
claim of 8 runs is timed (wall clock) again and again, the statement alone and with its
commit, on a connection opened as the worker opens its claim connection (store/db.py
`create_pool` with `server_settings=sql.CLAIM_SESSION_SETTINGS`, the statement from
asyncpg's statement cache, as run/worker.py `_claim` runs it); the claimed runs stay
running. Cases:
one tenant with 1,000 and with 100,000 queued runs (the cost must not follow the
queue's depth), 100,000 over 1,000 tenants (the claim reads each tenant's head of
queue), and the same with max_running set on every tenant (the per-tenant advisory
lock and running count).
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import asyncpg

from bench.common import Sizes, create_database, drop_database, log
from hango_worker.store import db, repo, sql

BATCH = 8
WARMUP = 5  # claims before timing


def cases(sizes: Sizes) -> list[tuple[str, int, int, bool]]:
    """(label, queued runs, tenants, max_running on every tenant)."""
    big = 10_000 if sizes.name == "smoke" else 100_000
    many = 20 if sizes.name == "smoke" else 1_000
    return [
        (f"1 tenant, {big // 100:,} queued", big // 100, 1, False),
        (f"1 tenant, {big:,} queued", big, 1, False),
        (f"{many:,} tenants, {big:,} queued", big, many, False),
        (f"{many:,} tenants, {big:,} queued, max_running each", big, many, True),
    ]


async def _fill(conn: asyncpg.Connection, runs: int, tenants: int, limited: bool) -> None:
    await repo.ensure_default_tenant(conn)
    ids = [repo.DEFAULT_TENANT_ID] + [str(uuid.uuid4()) for _ in range(tenants - 1)]
    await conn.executemany(
        "INSERT INTO tenants (id, name) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        [(t, f"t{i}") for i, t in enumerate(ids)],
    )
    await conn.execute(
        "INSERT INTO agents (id, tenant_id, name, model) "
        "SELECT gen_random_uuid(), id, 'agent', 'm' FROM tenants"
    )
    # round-robin over tenants, oldest first, as producers would have queued them
    await conn.execute(
        """
        WITH t AS (SELECT row_number() OVER (ORDER BY t.id) - 1 AS k, t.id, a.id AS agent
                   FROM tenants t JOIN agents a ON a.tenant_id = t.id),
        n AS (SELECT g, (SELECT count(*) FROM t) AS c FROM generate_series(0, $1 - 1) g),
        s AS (INSERT INTO sessions (id, tenant_id, agent_id)
              SELECT gen_random_uuid(), t.id, t.agent FROM n JOIN t ON t.k = n.g % n.c
              RETURNING id, tenant_id, agent_id)
        INSERT INTO runs (id, tenant_id, session_id, agent_id, input, created_at)
        SELECT gen_random_uuid(), s.tenant_id, s.id, s.agent_id, '{"text": "go"}',
            clock_timestamp() FROM s
        """,
        runs,
    )
    if limited:
        await conn.execute("UPDATE tenants SET max_running = 1000")
    await conn.execute("VACUUM ANALYZE")


async def _time(conn: asyncpg.Connection, claims: int) -> tuple[list[float], list[float], int]:
    """(statement ms, with commit ms, runs claimed) of `claims` claims after a warm-up."""
    for _ in range(WARMUP):  # warm the plan and the cache
        await conn.fetch(sql.CLAIM, "bench", BATCH, 60.0)
    ms, total, got = [], [], 0
    for _ in range(claims):
        t0 = time.perf_counter()
        async with conn.transaction():
            rows = await conn.fetch(sql.CLAIM, "bench", BATCH, 60.0)
            ms.append((time.perf_counter() - t0) * 1000)
        total.append((time.perf_counter() - t0) * 1000)
        got += len(rows)
    return ms, total, got


async def _one(admin: str, runs: int, tenants: int, limited: bool, claims: int) -> dict[str, Any]:
    claims = min(claims, runs // BATCH - WARMUP)
    dsn = await create_database(admin, "claim", migrated=True)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            await _fill(conn, runs, tenants, limited)
        finally:
            await conn.close()
        # the worker's claim connection (run/worker.py `_open_claim_pool`)
        pool = await db.create_pool(
            dsn, min_size=1, max_size=1, server_settings=sql.CLAIM_SESSION_SETTINGS
        )
        try:
            async with pool.acquire() as claim_conn:
                ms, total, got = await _time(claim_conn, claims)
        finally:
            await pool.close()
        assert got == claims * BATCH, f"claimed {got} of {claims * BATCH}"
    finally:
        await drop_database(admin, dsn)
    ms.sort()
    total.sort()
    return {
        "runs": runs,
        "tenants": tenants,
        "limited": limited,
        "claims": claims,
        "batch": BATCH,
        "p50_ms": statistics.median(ms),
        "p95_ms": ms[int(len(ms) * 0.95) - 1],
        "mean_ms": statistics.fmean(ms),
        "p50_with_commit_ms": statistics.median(total),
    }


async def measure(admin: str, sizes: Sizes) -> dict[str, Any]:
    claims = 20 if sizes.name == "smoke" else 200
    out: dict[str, Any] = {"batch": BATCH, "cases": {}}
    for label, runs, tenants, limited in cases(sizes):
        out["cases"][label] = await _one(admin, runs, tenants, limited, claims)
        log(f"claim {label}: p50 {out['cases'][label]['p50_ms']:.2f} ms")
    return out


def section(r: dict[str, Any]) -> str:
    """docs/benchmarks.md's claim-latency section (empty when not measured)."""
    c = r.get("claim")
    if not c:
        return ""
    lines = [
        "## 8. Claim latency: one tenant beside 1,000",
        "",
        f"One claim of {c['batch']} runs (store/sql.py `CLAIM`: fair across tenants, "
        "priority then age within one, max_running enforced), timed on one connection: "
        "the statement, and with its commit (the WAL flush, durable); the claimed runs "
        "stay running (`bench/claim.py`).",
        "",
        "| queue | claims | p50 ms | p95 ms | mean ms | p50 ms with commit |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for label, v in c["cases"].items():
        lines.append(
            f"| {label} | {v['claims']} | {v['p50_ms']:.2f} | {v['p95_ms']:.2f} "
            f"| {v['mean_ms']:.2f} | {v['p50_with_commit_ms']:.2f} |"
        )
    return "\n".join(lines) + "\n"
