"""Worker processes the benchmarks start (besides `hango-worker run` itself).

    python -m bench.workers floor DSN        raw asyncpg claim-and-complete loop
    python -m bench.workers pgq DSN          pgqueuer (PgQueuer.run defaults), no-op jobs
    python -m bench.workers hango-stamp DSN  the real worker (serve) whose model prints
                                             "T <input> <monotonic>" at each run's first call

Each prints "started" once set up. Timestamps use time.monotonic(), which on
Linux is one system-wide clock, so the parent can compare them with its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from typing import Any

import asyncpg

FLOOR_CHANNEL = "bench_jobs"
FLOOR_CONCURRENCY = 8  # = hango-worker's default HANGO_WORKER_CONCURRENCY

FLOOR_SCHEMA = """
CREATE TABLE IF NOT EXISTS bench_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
);
CREATE INDEX IF NOT EXISTS bench_jobs_queued ON bench_jobs (created_at) WHERE status = 'queued';
"""

FLOOR_ENQUEUE = """
WITH ins AS (INSERT INTO bench_jobs (payload) SELECT '{"text": "go"}'::jsonb
             FROM generate_series(1, $1) RETURNING 1)
SELECT count(*) FROM ins
"""

FLOOR_CLAIM = """
UPDATE bench_jobs SET status = 'running'
WHERE id IN (SELECT id FROM bench_jobs WHERE status = 'queued'
             ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT $1)
RETURNING id, payload
"""

FLOOR_COMPLETE = "UPDATE bench_jobs SET status = 'done', finished_at = now() WHERE id = $1"


async def floor(dsn: str) -> None:
    """The least a Postgres job worker can do: batch claim, one commit per job."""
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=FLOOR_CONCURRENCY + 2)
    wake = asyncio.Event()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener(FLOOR_CHANNEL, lambda *_: wake.set())
    inflight: set[asyncio.Task[Any]] = set()
    print("started", flush=True)
    while True:
        wake.clear()
        free = FLOOR_CONCURRENCY - len(inflight)
        rows = await pool.fetch(FLOOR_CLAIM, free) if free > 0 else []
        for r in rows:
            t = asyncio.create_task(pool.execute(FLOOR_COMPLETE, r["id"]))
            inflight.add(t)
            t.add_done_callback(inflight.discard)
        if rows and len(rows) == free:
            continue
        waiter = asyncio.ensure_future(wake.wait())
        await asyncio.wait([waiter, *inflight], timeout=2.0, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()


async def pgq(dsn: str) -> None:
    """pgqueuer as its README sets it up: PgQueuer on one asyncpg connection, run() defaults."""
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    conn = await asyncpg.connect(dsn)
    pgq = PgQueuer.from_asyncpg_connection(conn)

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        if job.payload:
            print(f"T {job.payload.decode()} {time.monotonic()}", flush=True)

    print("started", flush=True)
    await pgq.run()


async def hango_stamp(dsn: str) -> None:
    """The real worker (serve, defaults) with a model that stamps each run's first call."""
    from hango_worker.config import load_settings
    from hango_worker.provider.scripted import ScriptedProvider
    from hango_worker.provider.types import Request, Response, TextBlock, TextSink
    from hango_worker.service import serve
    from hango_worker.tool.registry import Registry

    class Stamping(ScriptedProvider):
        async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
            if not any(m.role == "assistant" for m in request.messages):
                first = request.messages[0].content[0]
                text = first.text if isinstance(first, TextBlock) else "?"
                print(f"T {text} {time.monotonic()}", flush=True)
            return await super().complete(request, on_text)

    settings = load_settings(database_url=dsn, metrics_port=0, log_level="WARNING")
    print("started", flush=True)
    await serve(
        settings,
        dsn,
        install_signals=True,
        provider=Stamping([{"text": "done"}]),
        registry=Registry.default(load_entry_points=False),
        logs=False,
    )


def main() -> None:
    kind, dsn = sys.argv[1], sys.argv[2]
    entry = {"floor": floor, "pgq": pgq, "hango-stamp": hango_stamp}[kind]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(entry(dsn))


if __name__ == "__main__":
    main()
