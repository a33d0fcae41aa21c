"""`hango-worker run`: the worker plus its metrics endpoint, tracing and signals."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable

import asyncpg

from hango_worker.config import ConfigError, Settings
from hango_worker.provider.types import Provider
from hango_worker.run.bounded import close_pool, within
from hango_worker.run.execute import RunDeps, RunObserver
from hango_worker.run.providers import make_provider
from hango_worker.run.worker import CLOSE_WAIT_S, STOP_BOUND_S, Worker, WorkerStats
from hango_worker.store import db
from hango_worker.store.migrate import read_schema_state, schema_problem
from hango_worker.telemetry.logs import setup_logging
from hango_worker.telemetry.metrics_server import MetricsServer, NotReady, start_metrics_server
from hango_worker.telemetry.setup import setup_tracing
from hango_worker.tool.registry import Registry

log = logging.getLogger(__name__)


READY_CACHE_S = 1.0  # concurrent and back-to-back /readyz probes share one check
TRACING_FLUSH_S = 5.0  # the spans still buffered at exit get this long to export
# After the worker returned: the pool, endpoint and client close (CLOSE_WAIT_S), the
# spans export (TRACING_FLUSH_S), then the interpreter exits. The watchdog ends the
# process if all that has not happened AFTER_RUN_S after the worker returned, or
# `HANGO_SHUTDOWN_GRACE_S` + PROCESS_BOUND_S after the signal.
AFTER_RUN_S = CLOSE_WAIT_S + TRACING_FLUSH_S + 5.0
PROCESS_BOUND_S = STOP_BOUND_S + AFTER_RUN_S
# `hango-worker run` exits with this code when its own shutdown outlasted its bound
# (the watchdog below: something did not stop; the log says what was abandoned).
STUCK_EXIT = 6


class ExitWatchdog:
    """The last resort of a process that must stop: armed when the shutdown starts
    (SIGTERM, or the end of `--until-idle`), it ends the process once the bound has
    passed (one line on stderr, exit code STUCK_EXIT), whatever is still waiting: a
    thread, a task that ignores its cancel, the interpreter's own exit. A shutdown
    that goes as designed ends well before it (docs/system-architecture.md)."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self._timer: threading.Timer | None = None

    def arm(self, seconds: float) -> None:
        """Exit at most `seconds` from now (an earlier deadline armed already stands)."""
        deadline = time.monotonic() + seconds
        if self.deadline is not None and self.deadline <= deadline:
            return
        if self._timer is not None:
            self._timer.cancel()
        self.deadline = deadline
        self._timer = threading.Timer(seconds, self._fire, args=(seconds,))
        self._timer.daemon = True
        self._timer.start()

    def _fire(self, seconds: float) -> None:
        line = (
            f"hango-worker: the shutdown did not finish within {seconds:g}s of its start; "
            "exiting now (runs still held are reclaimed when their leases expire)\n"
        )
        try:
            os.write(2, line.encode())
        finally:
            os._exit(STUCK_EXIT)


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
    watchdog = ExitWatchdog()
    pool: asyncpg.Pool | None = None
    tracing = None
    try:
        provider = provider or make_provider(settings)
        registry = registry or Registry.default(modules=settings.tool_modules)
        _check_grace(settings.shutdown_grace_s, registry)
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
            _install_signals(worker, watchdog, settings.shutdown_grace_s)
        return await worker.run(until_idle=until_idle)
    finally:
        if install_signals:
            watchdog.arm(AFTER_RUN_S)
        await _close_all(server, pool, provider if own_provider else None)
        if tracing is not None:
            await _in_daemon_thread(tracing.shutdown, TRACING_FLUSH_S, "exporting the last spans")


def _check_grace(grace_s: float, registry: Registry) -> None:
    """One line at start-up when a deploy would cut a tool call off: the shutdown grace
    is shorter than the longest tool timeout (docs/operations.md, "Crashes, deploys")."""
    tools = list(registry.view(registry.names()))
    if not tools:
        return
    longest = max(tools, key=lambda t: t.limit_s)
    if longest.limit_s > grace_s:
        log.warning(
            "shutdown grace %gs is shorter than tool %s's timeout (%gs): a deploy cuts its "
            "calls off mid-flight; set HANGO_SHUTDOWN_GRACE_S to at least %g and the "
            "container's stop timeout 25 s above it",
            grace_s,
            longest.name,
            longest.limit_s,
            longest.limit_s + 5,
        )


def _install_signals(worker: Worker, watchdog: ExitWatchdog, grace_s: float) -> None:
    """SIGTERM/SIGINT: the worker's shutdown, with the process's bound armed."""

    def on_signal() -> None:
        watchdog.arm(grace_s + PROCESS_BOUND_S)
        worker.request_shutdown()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)


async def _close_all(
    server: MetricsServer | None, pool: asyncpg.Pool | None, provider: Provider | None
) -> None:
    """The metrics endpoint, the pool and the provider's client, together and bounded."""
    steps: list[Awaitable[object]] = []
    if server is not None:
        steps.append(within(server.close(), CLOSE_WAIT_S, "the metrics endpoint"))
    if pool is not None:
        steps.append(close_pool(pool, CLOSE_WAIT_S, "the database pool"))
    close = getattr(provider, "aclose", None)
    if close is not None:
        steps.append(within(close(), CLOSE_WAIT_S, "the model provider's client"))
    await asyncio.gather(*steps)


async def _in_daemon_thread(fn: Callable[[], object], seconds: float, what: str) -> None:
    """`fn()` in a daemon thread, waited for at most `seconds` (a blocking flush to a
    collector that does not answer must hold neither the loop nor the exit)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    def run() -> None:
        try:
            fn()
        except Exception as e:
            log.warning("shutdown: %s failed: %s", what, e)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(finish)

    threading.Thread(target=run, name="hango-shutdown", daemon=True).start()
    await within(done, seconds, what)
