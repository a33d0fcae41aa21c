"""Shared fixtures: a real Postgres (embedded by default), a migrated template
database created once per session, and a fresh database per test cloned from it.

HANGO_DATABASE_URL points the suite at another server (its database is used
only to create and drop per-test databases).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hango_worker.store import db, migrate
from hango_worker.telemetry.setup import TracingHandle, setup_tracing
from hango_worker.testing.network import require_loopback_anthropic


def pytest_sessionstart(session: pytest.Session) -> None:
    """No test may reach the network: the real Anthropic API above all."""
    try:
        require_loopback_anthropic()
    except RuntimeError as e:
        raise pytest.UsageError(str(e)) from None
    os.environ.pop("ANTHROPIC_API_KEY", None)
    os.environ["ANTHROPIC_OPEN_TELEMETRY"] = "false"
    for k in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[k]


# -- a hang is a failure naming the test, with every stack ------------------------------
# pytest-timeout (pyproject.toml: `timeout`, method "thread") ends the session when a test
# outlives its timeout, after dumping every thread's stack. Most of the suite runs on one
# event loop, where a hang is a task waiting forever, invisible in the thread stacks: this
# timer names the test and prints every asyncio task's stack first.
_LOOP: list[asyncio.AbstractEventLoop] = []


@pytest.fixture(autouse=True)
async def _no_worker_left_behind() -> AsyncIterator[None]:
    """A worker process a test started and did not stop (it failed half-way) is
    killed when the test ends, so it cannot run on into later tests."""
    yield
    from tests.procs import reap_workers

    await reap_workers()


@pytest.fixture(scope="session", autouse=True)
async def _session_loop() -> None:
    """The suite's event loop, for the timeout's task dump."""
    _LOOP[:] = [asyncio.get_running_loop()]


def _dump_tasks(nodeid: str, seconds: float) -> None:
    out = sys.stderr
    out.write(f"\n+++ {nodeid} did not finish within {seconds:g}s +++\n")
    for loop in _LOOP:
        try:
            tasks = asyncio.all_tasks(loop)
        except RuntimeError as e:  # the loop's set changed meanwhile: best effort
            out.write(f"(asyncio tasks not listed: {e})\n")
            continue
        for task in tasks:
            out.write(f"--- asyncio task {task.get_name()} ---\n")
            task.print_stack(file=out)
    out.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    if settings.method != "thread" or not settings.timeout:
        return None
    import pytest_timeout

    def fire() -> None:
        _dump_tasks(item.nodeid, settings.timeout)
        pytest_timeout.timeout_timer(item, settings)  # thread stacks, then the exit

    timer = threading.Timer(settings.timeout, fire)
    timer.name = f"hango-test-timeout {item.nodeid}"
    timer.daemon = True

    def cancel() -> None:
        timer.cancel()
        timer.join()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]
    timer.start()
    return True


def with_database(dsn: str, name: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    url = os.environ.get("HANGO_DATABASE_URL")
    if url:
        yield url
        return
    from hango_worker.store import embedded

    root = tempfile.mkdtemp(prefix="hango-test-")
    server, dsn = embedded.start(root)
    try:
        yield dsn
    finally:
        embedded.stop(server)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
async def template_db(pg_admin_dsn: str) -> AsyncIterator[str]:
    name = f"hango_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        dsn = with_database(pg_admin_dsn, name)
        await migrate.upgrade_and_seed(dsn)
        yield name
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@asynccontextmanager
async def fresh_database(
    admin_dsn: str, prefix: str, template: str | None = None
) -> AsyncIterator[str]:
    """CREATE DATABASE (optionally from a template), yield its DSN, DROP it afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    clause = f' TEMPLATE "{template}"' if template else ""
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"{clause}')
        yield with_database(admin_dsn, name)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def dsn(pg_admin_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test (cloned from the template: fast)."""
    async with fresh_database(pg_admin_dsn, "hango_t", template_db) as d:
        yield d


@pytest.fixture
async def empty_dsn(pg_admin_dsn: str) -> AsyncIterator[str]:
    """A fresh database with no schema at all (migration tests)."""
    async with fresh_database(pg_admin_dsn, "hango_e") as d:
        yield d


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await db.create_pool(dsn, min_size=1, max_size=8)
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture(scope="session")
def tracing() -> Iterator[tuple[TracingHandle, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    handle = setup_tracing(exporter=exporter)
    yield handle, exporter
    handle.shutdown()


class SpanReader:
    """Finished spans from the SDK's in-memory exporter (flushed on every read)."""

    def __init__(self, handle: TracingHandle, exporter: InMemorySpanExporter) -> None:
        self.handle, self.exporter = handle, exporter

    def all(self) -> list[Any]:
        self.handle.force_flush()
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[Any]:
        return [s for s in self.all() if s.name.startswith(prefix)]

    def events(self, name: str) -> list[Any]:
        return [e for s in self.all() for e in s.events if e.name == name]


@pytest.fixture
def spans(tracing: tuple[TracingHandle, InMemorySpanExporter]) -> SpanReader:
    handle, exporter = tracing
    handle.force_flush()
    exporter.clear()
    return SpanReader(handle, exporter)
