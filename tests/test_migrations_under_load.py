"""Every migration, one step at a time, while a busy fleet writes to the queue.

One fresh database, stepped from empty to head. Before each step a background load runs
short transactions the way workers do (insert a run, a message and a run event, then
update the run), touching only columns that exist since 0001_initial, so the same SQL
works at every revision. Each step is applied with the shipped timeouts (alembic/env.py:
lock_timeout 5s) while the load keeps going. Asserted, per step:

- the step is applied; a step refused by `lock_timeout` (SQLSTATE 55P03) or picked as a
  deadlock victim (40P01) is migrated again, which is the documented advice
  (docs/operations.md "Migration privileges and timeouts"); two such refusals in a row
  fail the test;
- the step rewrites no table (a rewrite holds ACCESS EXCLUSIVE for as long as copying
  the table takes: the table's storage file would change);
- the load saw no error at all (no deadlock: a step that alters several tables locks
  them up front in the order the fleet's own statements do), and it committed
  transactions before, during and after the step. "During" counts from the call, so it
  includes alembic's start-up before the step takes any lock: it shows the load is not
  stalled, while the printed gap shows how long the step's locks held it.

Timing is printed, not asserted (`pytest -s`): the longest gap between two of the load's
commits during each step, i.e. how long a step held a lock the load had to wait for.
After the last step the current worker runs a run on the migrated database.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import asyncpg
import pytest

from hango_worker.store import db, migrate, repo
from tests.helpers import scripted
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

RETRYABLE = {"55P03", "40P01"}  # lock_not_available, deadlock_detected: migrate again


@dataclass
class Load:
    """Short worker-like transactions on one connection, until stopped."""

    dsn: str
    tenant: str = field(default_factory=lambda: str(uuid.uuid4()))
    agent: str = field(default_factory=lambda: str(uuid.uuid4()))
    session: str = field(default_factory=lambda: str(uuid.uuid4()))
    commits: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    seq: int = 0
    step: str = "0001_initial"  # the revision being applied (errors name it)

    async def seed(self) -> None:
        """A tenant, agent and session of the load's own (0001_initial columns)."""
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(
                "INSERT INTO tenants (id, name) VALUES ($1, 'load-tenant')", self.tenant
            )
            await conn.execute(
                "INSERT INTO agents (id, tenant_id, name, model) "
                "VALUES ($1, $2, 'load-agent', 'claude-test')",
                self.agent,
                self.tenant,
            )
            await conn.execute(
                "INSERT INTO sessions (id, tenant_id, agent_id) VALUES ($1, $2, $3)",
                self.session,
                self.tenant,
                self.agent,
            )
        finally:
            await conn.close()

    async def run(self, stop: asyncio.Event) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            while not stop.is_set():
                try:
                    await self._one(conn)
                except asyncpg.PostgresError as e:
                    self.errors[f"{self.step} {e.sqlstate}"] += 1
                else:
                    self.commits.append(time.monotonic())
                await asyncio.sleep(0)  # let the event loop run the migration's thread
        finally:
            await conn.close()

    async def _one(self, conn: asyncpg.Connection) -> None:
        run_id = str(uuid.uuid4())
        self.seq += 1
        text = json.dumps({"text": f"load {self.seq}"})
        async with conn.transaction():
            # finished at once, so the worker never claims the load's runs
            await conn.execute(
                "INSERT INTO runs (id, tenant_id, session_id, agent_id, status, input) "
                "VALUES ($1, $2, $3, $4, 'running', $5::jsonb)",
                run_id,
                self.tenant,
                self.session,
                self.agent,
                text,
            )
            await conn.execute(
                "INSERT INTO messages (session_id, seq, run_id, role, content) "
                "VALUES ($1, $2, $3, 'user', $4::jsonb)",
                self.session,
                self.seq,
                run_id,
                json.dumps([{"type": "text", "text": f"load {self.seq}"}]),
            )
            await conn.execute(
                "INSERT INTO run_events (run_id, seq, type) VALUES ($1, 1, 'claimed')", run_id
            )
            await conn.execute(
                "UPDATE runs SET status = 'succeeded', attempt = attempt + 1, "
                "finished_at = now() WHERE id = $1",
                run_id,
            )

    def between(self, start: float, end: float) -> int:
        return sum(1 for t in self.commits if start <= t <= end)

    def longest_gap(self, start: float, end: float) -> float:
        marks = [start, *(t for t in self.commits if start < t < end), end]
        return max(b - a for a, b in itertools.pairwise(marks))


async def _step(dsn: str, revision: str) -> int:
    """Upgrade one step; returns how many times it was refused and migrated again."""
    refused = 0
    while True:
        try:
            await migrate.upgrade(dsn, revision)
            return refused
        except Exception as e:  # alembic wraps the driver's error (sqlalchemy DBAPIError)
            sqlstate = getattr(getattr(e, "orig", None), "sqlstate", None)
            if sqlstate not in RETRYABLE or refused:
                raise
            refused += 1


async def _filenodes(dsn: str) -> dict[str, int]:
    """Each table's storage file: a step that rewrites a table gives it a new one."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT c.relname, c.relfilenode FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
        )
        return {r["relname"]: r["relfilenode"] for r in rows}
    finally:
        await conn.close()


async def _until_commits(load: Load, n: int) -> None:
    """Waits for the load's next `n` commits (progress, not time)."""
    target = len(load.commits) + n
    while len(load.commits) < target:
        assert not load.errors, load.errors
        await asyncio.sleep(0.01)


@pytest.mark.timeout(240)
async def test_every_migration_steps_up_while_a_busy_fleet_keeps_committing(
    empty_dsn: str,
) -> None:
    chain = [r.revision for r in migrate.revisions()]
    await migrate.upgrade(empty_dsn, chain[0])
    load = Load(empty_dsn)
    await load.seed()
    stop = asyncio.Event()
    task = asyncio.create_task(load.run(stop))
    report: list[str] = []
    try:
        for revision in chain[1:]:
            await _until_commits(load, 5)  # busy before the step
            load.step = revision
            files = await _filenodes(empty_dsn)
            start = time.monotonic()
            refused = await _step(empty_dsn, revision)
            end = time.monotonic()
            after = await _filenodes(empty_dsn)
            rewritten = sorted(t for t, node in files.items() if after.get(t) != node)
            during = load.between(start, end)
            await _until_commits(load, 5)  # and still busy after it
            assert during > 0, f"{revision}: the load made no progress during the step"
            assert rewritten == [], f"{revision} rewrites {rewritten} under an exclusive lock"
            report.append(
                f"{revision}: {end - start:.2f}s, {during} load commits during, longest "
                f"gap {load.longest_gap(start, end):.3f}s, refused {refused}x"
            )
    finally:
        stop.set()
        await task
    print("\nmigrations under load:\n" + "\n".join(report))
    assert not load.errors, load.errors
    assert len(load.commits) >= 10 * (len(chain) - 1)
    await _worker_runs_a_run(empty_dsn)


async def _worker_runs_a_run(dsn: str) -> None:
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    try:
        async with pool.acquire() as conn:
            await repo.ensure_default_tenant(conn)
        await make_agent(pool)
        run_id = await enqueue(pool, "after the migrations")
        stats = await run_until_idle(dsn, scripted({"text": "done"}))
        assert stats.finished == {"succeeded": 1}
        assert (await details(pool, run_id))["status"] == "succeeded"
        loads = await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'succeeded'")
        assert loads > 1  # the load's rows are there, finished, untouched by the worker
    finally:
        await pool.close()
