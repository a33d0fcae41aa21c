"""Versions that meet safely: a worker claims only while the database's schema serves its
code (run/schema_gate.py), and the previous code serves runs on this code's schema.

docs/operations.md, "Upgrades and rollback".
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.run.schema_gate import SchemaGate, schema_mismatch
from hango_worker.run.worker import Worker
from hango_worker.service import serve
from hango_worker.store import migrate
from hango_worker.tool.registry import Registry
from tests.helpers import scripted
from tests.procs import start_worker, stderr_of, stop_worker, wait_all_finished, worker_env
from tests.test_migrations import newer_migrations, upgrade_with
from tests.worker_helpers import enqueue, make_agent, settings

REPO = Path(__file__).resolve().parent.parent
GATE_LOG = "hango_worker.run.schema_gate"


async def _until(pred: Callable[[], bool], timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not pred():
            await asyncio.sleep(0.02)


async def _status(pool: asyncpg.Pool, run_id: str) -> tuple[str, int]:
    row = await pool.fetchrow("SELECT status, attempt FROM runs WHERE id = $1", run_id)
    return str(row["status"]), int(row["attempt"])


class _Serving:
    """A worker serving in the background (schema checked every 0.05 s)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.worker: Worker | None = None
        self.task: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> Worker:
        ready = asyncio.Event()

        def on_ready(worker: Worker, _server: Any) -> None:
            self.worker = worker
            ready.set()

        self.task = asyncio.create_task(
            serve(
                settings(self.dsn, poll_interval_s=0.05, schema_check_interval_s=0.05),
                self.dsn,
                provider=scripted({"text": "done"}),
                registry=Registry([]),
                logs=False,
                on_ready=on_ready,
            )
        )
        await asyncio.wait_for(ready.wait(), 20)
        assert self.worker is not None
        return self.worker

    async def __aexit__(self, *exc: object) -> None:
        assert self.worker is not None and self.task is not None
        self.worker.request_shutdown()
        await asyncio.wait_for(self.task, 20)


@pytest.fixture
def gate_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The gate's log lines, whatever an earlier test did to propagation (a worker's
    logging set-up stops `hango_worker` propagating to the root logger)."""
    logger = logging.getLogger(GATE_LOG)
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)


def _served() -> float | None:
    return REGISTRY.get_sample_value("hango_schema_served")


def _lines(caplog: pytest.LogCaptureFixture, start: str) -> list[str]:
    # each record once: it reaches the handler on the gate's logger and, while
    # `hango_worker` propagates, the same handler on the root logger
    unique = {id(r): r for r in caplog.records}.values()
    return [
        r.getMessage() for r in unique if r.name == GATE_LOG and r.getMessage().startswith(start)
    ]


async def test_a_worker_on_an_older_schema_claims_nothing_until_it_is_migrated(
    pool: asyncpg.Pool, dsn: str, gate_log: pytest.LogCaptureFixture
) -> None:
    head, previous = migrate.head_revision(), migrate.revisions()[-2].revision
    await make_agent(pool, tools=[])
    run_id = await enqueue(pool)
    # the database says it is one revision behind this code (not migrated yet)
    await pool.execute("UPDATE alembic_version SET version_num = $1", previous)
    async with _Serving(dsn) as worker:
        gate = worker.gate
        # each blocked check stands before a claim the worker did not make
        await _until(lambda: gate.checks >= 5)
        assert gate.problem is not None and previous in gate.problem and head in gate.problem
        assert await _status(pool, run_id) == ("queued", 0)
        assert _served() == 0
        # one line, not one per check: the next comes a minute later
        assert _lines(gate_log, "not claiming") == [f"not claiming: {gate.problem}"]
        await pool.execute("UPDATE alembic_version SET version_num = $1", head)
        async with asyncio.timeout(30):
            while (await _status(pool, run_id))[0] != "succeeded":
                await asyncio.sleep(0.02)
        assert _served() == 1
        assert _lines(gate_log, "claiming again")


async def test_a_contracting_migration_stops_the_claims_of_the_code_it_no_longer_serves(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path, gate_log: pytest.LogCaptureFixture
) -> None:
    """The next release migrates with a revision that no longer serves this code: the
    running worker stops claiming; the downgrade lets it claim again."""
    await make_agent(pool, tools=[])
    newer = newer_migrations(tmp_path)
    async with _Serving(dsn) as worker:
        gate = worker.gate
        await _until(lambda: gate.checks >= 1)
        assert gate.problem is None
        await upgrade_with(newer, dsn, "0099_contract")
        await _until(lambda: gate.problem is not None)
        assert "0099_contract" in str(gate.problem)
        run_id = await enqueue(pool)
        seen = gate.checks
        await _until(lambda: gate.checks >= seen + 5)
        assert await _status(pool, run_id) == ("queued", 0)
        await asyncio.to_thread(_downgrade_with, newer, dsn, migrate.head_revision())
        async with asyncio.timeout(30):
            while (await _status(pool, run_id))[0] != "succeeded":
                await asyncio.sleep(0.02)
        assert len(_lines(gate_log, "not claiming")) == 1


def _downgrade_with(script_location: Path, dsn: str, revision: str) -> None:
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.set_main_option("sqlalchemy.url", migrate.sqlalchemy_url(dsn))
    command.downgrade(cfg, revision)


async def test_the_gate_logs_one_line_a_minute_and_checks_at_once_when_suspected(
    pool: asyncpg.Pool, gate_log: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    gate = SchemaGate(pool, every_s=60, blocked_every_s=5, log_every_s=60, clock=lambda: now[0])
    assert await gate.open() and gate.checks == 1
    assert await gate.open() and gate.checks == 1  # not due: no query
    gate.suspect()
    assert await gate.open() and gate.checks == 2  # suspected: checked at once
    await pool.execute("UPDATE alembic_version SET version_num = 'not-a-revision'")
    gate.suspect()
    assert not await gate.open()
    for step in (5, 5, 5, 50):  # checks 3..6 over 65 s: lines at 0 and 65
        now[0] += step
        assert not await gate.open()
    assert gate.checks == 7
    assert len(_lines(gate_log, "not claiming")) == 2
    # what makes a failed statement suspect the schema: an object it lacks
    assert schema_mismatch(asyncpg.UndefinedColumnError("no column"))
    assert schema_mismatch(asyncpg.UndefinedTableError("no table"))
    assert schema_mismatch(asyncpg.UndefinedFunctionError("no function"))
    assert not schema_mismatch(asyncpg.UniqueViolationError("dup"))
    assert not schema_mismatch(OSError("down"))


def _loaded_from(old: Path) -> str:
    """Where `hango_worker` is imported from with the old code first on the path."""
    return subprocess.run(
        [sys.executable, "-c", "import hango_worker; print(hango_worker.__file__)"],
        env={**os.environ, "PYTHONPATH": str(old)},
        cwd=old,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _previous_code(tmp: Path) -> tuple[Path, str]:
    """This repository's code as it was on main before its newest migration landed
    (git history), extracted to `tmp`; and that code's head revision."""
    head_file = f"alembic/versions/{migrate.head_revision()}.py"

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=False
        )
        assert out.returncode == 0, (
            f"N-1 code is taken from git history: `git {' '.join(args)}` failed "
            f"(a checkout with its history is needed): {out.stderr.strip()}"
        )
        return out.stdout

    commit = None
    for c in git("rev-list", "--first-parent", "HEAD").split():
        if git("ls-tree", "--name-only", c, head_file).strip() == "":
            commit = c
            break
    assert commit is not None, f"no commit on main before {head_file} was added"
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "hango_worker", "alembic"],
        capture_output=True,
        check=True,
    ).stdout
    tmp.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=archive, check=True)
    versions = sorted(p.stem for p in (tmp / "alembic" / "versions").glob("0*.py"))
    return tmp, versions[-1]


async def test_the_previous_code_serves_runs_on_this_schema(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    """N-1 code on the N schema: migrations are expand-then-contract, so the code on main
    before the newest migration (a real, older copy from git history) still claims, runs
    and finishes runs on a database at this code's head."""
    old, old_head = await asyncio.to_thread(_previous_code, tmp_path / "old")
    assert old_head != migrate.head_revision()
    conn = await asyncpg.connect(dsn)
    try:
        rev, _ = await migrate.read_schema_state(conn)
    finally:
        await conn.close()
    assert rev == migrate.head_revision()
    chain = [r.revision for r in migrate.revisions()]
    served_since = migrate.oldest_code_served(migrate.revisions(), rev)
    assert chain.index(served_since) <= chain.index(old_head), (
        f"this schema ({rev}) no longer serves {old_head}: a contracting migration needs "
        "a release in between"
    )
    where = await asyncio.to_thread(_loaded_from, old)
    assert where.startswith(str(old)), f"the old code did not load ({where})"
    await make_agent(pool, tools=[])
    ids = [await enqueue(pool, f"run {i}") for i in range(3)]
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "done"}]))
    wenv = worker_env(dsn, script, PYTHONPATH=str(old))
    del wenv["HANGO_TOOL_MODULES"]  # the test tools of this code, not of the old one
    proc = await start_worker(wenv, until_idle=True, cwd=old)
    try:
        rows = await wait_all_finished(pool, ids, timeout=60)
    finally:
        await stop_worker(proc)
    assert {r["status"] for r in rows} == {"succeeded"}, stderr_of(proc)
    started = await pool.fetch(
        "SELECT DISTINCT worker_id FROM run_events WHERE type = 'run_started' "
        "AND run_id = ANY($1::uuid[])",
        ids,
    )
    assert len(started) == 1
