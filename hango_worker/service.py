"""`hango-worker run`: the worker plus its metrics endpoint, tracing and signals."""

from __future__ import annotations

import asyncio
import logging
import signal

from hango_worker.config import Settings
from hango_worker.provider.types import Provider
from hango_worker.run.execute import RunDeps, RunObserver
from hango_worker.run.providers import make_provider
from hango_worker.run.worker import Worker, WorkerStats
from hango_worker.store import db
from hango_worker.telemetry.logs import setup_logging
from hango_worker.tool.registry import Registry

log = logging.getLogger(__name__)


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
) -> WorkerStats:
    if logs:
        setup_logging(settings.log_level, settings.log_format)
    provider = provider or make_provider(settings)
    registry = registry or Registry.default()
    pool = await db.create_pool(dsn, min_size=2, max_size=settings.worker_concurrency + 4)
    deps = RunDeps(pool, settings, registry, provider, settings.effective_worker_id(), observer)
    worker = Worker(deps, dsn)
    if install_signals:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.request_shutdown)
    try:
        return await worker.run(until_idle=until_idle)
    finally:
        await pool.close()
