"""What one enqueue costs through the producer SQL API, against the statement it replaced.

    .venv/bin/python -m bench.enqueue [--n 2000] [--reps 3]

Three ways to queue a run on one connection, each `n` times per repetition, alternating:
- `cte (before 0009)`: the single INSERT … RETURNING statement the Python client sent
  before the producer API (kept here only as the reference);
- `python client`: `hango_worker.client.enqueue`, which calls `hango_enqueue_run`;
- `hango_api.enqueue`: what a producer in another language sends.
Each enqueue is its own transaction (a durable commit, as a producer does it) and again
inside one transaction of `n` (the statement's own cost, without the commit's fsync).
Reports the median and p95 per enqueue. The embedded Postgres 18; fsync on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg

from bench.common import (
    check_durable,
    create_database,
    log,
    percentile,
    pg_settings,
    start_server,
)
from hango_worker.client import enqueue as client_enqueue
from hango_worker.store import db, embedded, repo

# store/repo.py's enqueue statement before migration 0009_producer_api (reference only)
BEFORE = """
WITH a AS (
    SELECT id FROM agents WHERE tenant_id = $1 AND (name = $2 OR id::text = $2) LIMIT 1
), new_session AS (
    INSERT INTO sessions (id, tenant_id, agent_id)
    SELECT $3, $1, a.id FROM a WHERE $4::uuid IS NULL
    RETURNING id
), target AS (
    SELECT id FROM new_session
    UNION ALL
    SELECT se.id FROM sessions se, a
    WHERE $4::uuid IS NOT NULL AND se.id = $4::uuid AND se.tenant_id = $1 AND se.agent_id = a.id
), r AS (
    INSERT INTO runs (id, tenant_id, session_id, agent_id, input, idempotency_key)
    SELECT $5, $1, target.id, a.id, $6::text::jsonb, $8::text FROM target, a
    ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, session_id
), n AS (
    SELECT pg_notify($7, r.id::text) FROM r
)
SELECT (SELECT id::text FROM a) AS agent_id, (SELECT session_id::text FROM r) AS session_id,
    (SELECT count(*) FROM n) AS notified
"""

Way = Callable[[asyncpg.Connection, int], Awaitable[object]]


async def before(conn: asyncpg.Connection, i: int) -> object:
    args = (str(uuid.uuid4()), None, str(uuid.uuid4()), json.dumps({"text": f"q {i}"}))
    t = repo.DEFAULT_TENANT_ID
    return await conn.fetchrow(BEFORE, t, "bench", *args, "hango_runs", f"b-{uuid.uuid4()}")


async def python_client(conn: asyncpg.Connection, i: int) -> object:
    return await client_enqueue(
        conn, agent="bench", input=f"q {i}", idempotency_key=f"p-{uuid.uuid4()}"
    )


async def sql_api(conn: asyncpg.Connection, i: int) -> object:
    return await conn.fetchval(
        "SELECT hango_api.enqueue($1, $2::jsonb, idempotency_key => $3)",
        "bench",
        json.dumps({"text": f"q {i}"}),
        f"s-{uuid.uuid4()}",
    )


WAYS: dict[str, Way] = {
    "cte (before 0009)": before,
    "python client": python_client,
    "hango_api.enqueue": sql_api,
}


async def timed(conn: asyncpg.Connection, way: Way, n: int, one_tx: bool) -> list[float]:
    out: list[float] = []
    tx = conn.transaction() if one_tx else None
    if tx is not None:
        await tx.start()
    for i in range(n):
        t0 = time.perf_counter()
        await way(conn, i)
        out.append((time.perf_counter() - t0) * 1000)
    if tx is not None:
        await tx.commit()
    return out


async def main(n: int, reps: int) -> None:
    root = tempfile.mkdtemp(prefix="hango-bench-enqueue-")
    server, admin = start_server(root)
    try:
        check_durable(await pg_settings(admin))
        dsn = await create_database(admin, "bench_enqueue", migrated=True)
        pool = await db.create_pool(dsn, min_size=1, max_size=1)
        await repo.create_agent(
            pool, tenant_id=repo.DEFAULT_TENANT_ID, name="bench", model="m", system=[],
            tools=[], config={},
        )  # fmt: skip
        await pool.close()
        conn = await asyncpg.connect(dsn)  # a producer's plain connection
        for one_tx in (False, True):
            samples: dict[str, list[float]] = {k: [] for k in WAYS}
            for _ in range(reps):
                for name, way in WAYS.items():
                    samples[name] += await timed(conn, way, n, one_tx)
            label = f"one transaction of {n}" if one_tx else "a commit each"
            for name, ms in samples.items():
                med, p95 = statistics.median(ms), percentile(ms, 95)
                log(f"{label:>26} | {name:<18} | median {med:.3f} ms | p95 {p95:.3f} ms")
        await conn.close()
    finally:
        embedded.stop(server)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--reps", type=int, default=3)
    a = p.parse_args()
    asyncio.run(main(a.n, a.reps))
