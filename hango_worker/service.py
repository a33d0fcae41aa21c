"""`hango-worker run`: the worker plus its metrics endpoint, tracing and signals."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

import asyncpg

from hango_worker.config import ConfigError, Settings
from hango_worker.provider.types import Provider
from hango_worker.run.execute import RunDeps, RunObserver
from hango_worker.run.providers import make_provider
from hango_worker.run.worker import Worker, WorkerStats
from hango_worker.store import db
from hango_worker.store.migrate import read_schema_state, schema_problem
from hango_worker.telemetry.logs import setup_logging
from hango_worker.telemetry.metrics_server import MetricsServer, NotReady, start_metrics_server
from hango_worker.telemetry.setup import setup_tracing
from hango_worker.tool.registry import Registry

log = logging.getLogger(__name__)


READY_CACHE_S = 1.0  # concurrent and back-to-back /readyz probes share one check


def pool_size(concurrency: int) -> int:
    return min(concurrency, 16) + 4


def readiness(dsn: str) -> Callable[[], Awaitable[bool]]:
    """`/readyz`: the database answers and its schema serves this code (store/migrate.py:
    at this code's head, or newer but still serving it; never behind it).

    A connection of its own per probe: a probe that times out must not leave a
    half-cancelled query on a connection the runs share. When not ready, the reason
    (naming both revisions) is the 503 body, and logged once each time it changes."""
    last: list[str | None] = [None]

    async def check() -> bool:
        async with asyncio.timeout(3):
            conn = await db.connect(dsn)
        try:
            async with asyncio.timeout(3):
                problem = schema_problem(*await read_schema_state(conn))
        finally:
            conn.terminate()
        if problem != last[0]:
            last[0] = problem
            if problem is not None:
                log.warning("not ready: %s", problem)
        if problem is not None:
            raise NotReady(problem)
        return True

    return check


async def start_metrics(settings: Settings, dsn: str) -> MetricsServer:
    """The metrics endpoint, up before anything touches the database, so `/healthz`
    answers as soon as the process runs. A port in use is a configuration error."""
    try:
        server = await start_metrics_server(
            settings.metrics_port,
            readiness(dsn),
            settings.metrics_host,
            ready_cache_s=READY_CACHE_S,
        )
    except OSError as e:
        raise ConfigError(
            f"configuration error: cannot listen on {settings.metrics_host}:"
            f"{settings.metrics_port} ({e.strerror or e}): set HANGO_METRICS_PORT to a free "
            "port (0 = any) or stop what holds it"
        ) from None
    log.info("metrics on %s:%d/metrics", server.host, server.port)
    return server


async def serve(
    settings: Settings,
    dsn: str,
    *,
    until_idle: bool = False,
    install_signals: bool = False,
    provider: Provider | None = None,
    registry: Registry | None = None,
    observer: RunObserver | None = None,
    metrics: bool = True,
    logs: bool = True,
    on_ready: Callable[[Worker, MetricsServer | None], None] | None = None,
) -> WorkerStats:
    """Run a worker until it is shut down (or, with until_idle, the queue is empty).
    `on_ready` receives the worker and its metrics server once both are up.

    Start-up failures raise one-line errors and start nothing: `ConfigError` (a bad
    setting, the metrics port in use) and `db.Unavailable` (the database is
    unreachable, missing, refuses the credentials, or is not migrated)."""
    if logs:
        setup_logging(settings.log_level, settings.log_format, settings.capture_content)
    server = await start_metrics(settings, dsn) if metrics else None
    own_provider = provider is None
    pool: asyncpg.Pool | None = None
    tracing = None
    try:
        provider = provider or make_provider(settings)
        registry = registry or Registry.default(modules=settings.tool_modules)
        await db.require_migrated(dsn)
        # Runs hold a connection only for one statement at a time, so the pool is
        # sized per worker, not per run: 200 runs in flight must not mean 200 connections.
        pool = await db.open_pool(dsn, min_size=2, max_size=pool_size(settings.worker_concurrency))
        tracing = setup_tracing()
        deps = RunDeps(pool, settings, registry, provider, settings.effective_worker_id(), observer)
        worker = Worker(deps, dsn)
        if on_ready is not None:
            on_ready(worker, server)
        if install_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, worker.request_shutdown)
        return await worker.run(until_idle=until_idle)
    finally:
        if server is not None:
            await server.close()
        if pool is not None:
            await pool.close()
        if tracing is not None:
            tracing.shutdown()
        close = getattr(provider, "aclose", None)
        if own_provider and close is not None:
            await close()
