"""The metrics endpoint under load: liveness never depends on it, readiness is bounded."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import REGISTRY

from hango_worker.config import ConfigError, load_settings
from hango_worker.telemetry import metrics_server
from hango_worker.telemetry.metrics_server import MAX_CONNECTIONS, start_metrics_server


async def _request(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _until(cond: object, what: str) -> None:
    for _ in range(2000):
        if callable(cond) and cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"gave up waiting for {what}")


async def test_healthz_answers_while_half_open_clients_hold_every_slot() -> None:
    async with await start_metrics_server(0, None, host="127.0.0.1") as server:
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(40)]
        await _until(lambda: len(server._tasks) >= MAX_CONNECTIONS, "the budget to fill")
        for _ in range(3):
            reply = await _request(server.port, "/healthz")
            assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok\n")
        for _, w in idle:
            w.close()


async def test_healthz_answers_when_every_slot_is_busy_answering(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_server, "EVICT_AFTER_S", 3600.0)
    release = asyncio.Event()

    async def slow_check() -> bool:
        await release.wait()
        return True

    async with await start_metrics_server(0, slow_check, host="127.0.0.1") as server:
        probes = [asyncio.create_task(_request(server.port, "/readyz")) for _ in range(40)]
        await _until(
            lambda: len(server._tasks) >= MAX_CONNECTIONS and not server._waiting,
            "every slot to be busy answering /readyz",
        )
        before = sample("hango_http_connections_shed_total", reason="over_budget")
        health = await _request(server.port, "/healthz")
        assert health.startswith(b"HTTP/1.1 200") and health.endswith(b"ok\n")
        assert sample("hango_http_connections_shed_total", reason="over_budget") == before + 1
        busy = await _request(server.port, "/metrics")
        assert busy.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in busy
        release.set()
        replies = await asyncio.gather(*probes)
    answered = [r for r in replies if r]
    assert answered and all(r.startswith((b"HTTP/1.1 200", b"HTTP/1.1 503")) for r in answered)
    assert sum(r.startswith(b"HTTP/1.1 200") for r in replies) >= MAX_CONNECTIONS


async def test_concurrent_readiness_probes_share_one_check() -> None:
    release = asyncio.Event()
    running = 0
    most = 0

    async def check() -> bool:
        nonlocal running, most
        running += 1
        most = max(most, running)
        try:
            await release.wait()
        finally:
            running -= 1
        return True

    async with await start_metrics_server(0, check, host="127.0.0.1", ready_cache_s=60) as server:
        ready_before = sample("hango_readiness_checks_total", result="ready")
        probes = [asyncio.create_task(_request(server.port, "/readyz")) for _ in range(32)]
        await _until(
            lambda: len(server._tasks) == 32 and not server._waiting, "32 probes in flight"
        )
        release.set()
        replies = await asyncio.gather(*probes)
        assert all(r.startswith(b"HTTP/1.1 200") for r in replies)
        assert most == 1 and server.ready_checks == 1
        assert sample("hango_readiness_checks_total", result="ready") == ready_before + 1
        # within the cache window a later probe reuses the result
        assert (await _request(server.port, "/readyz")).startswith(b"HTTP/1.1 200")
        assert server.ready_checks == 1


async def test_readiness_is_checked_again_once_the_cache_expires() -> None:
    answers = iter([False, True])

    async def check() -> bool:
        return next(answers)

    async with await start_metrics_server(0, check, host="127.0.0.1", ready_cache_s=0) as server:
        assert (await _request(server.port, "/readyz")).startswith(b"HTTP/1.1 503")
        assert (await _request(server.port, "/readyz")).startswith(b"HTTP/1.1 200")
        assert server.ready_checks == 2


async def test_a_client_that_never_sends_its_head_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_server, "HEAD_TIMEOUT_S", 0.2)
    async with await start_metrics_server(0, None, host="127.0.0.1") as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()
        await _until(lambda: not server._tasks, "the slot to be freed")


async def test_idle_clients_yield_their_slots_to_new_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_server, "EVICT_AFTER_S", 0.0)
    async with await start_metrics_server(0, None, host="127.0.0.1") as server:
        idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(40)]
        await _until(lambda: len(server._tasks) >= MAX_CONNECTIONS, "the budget to fill")
        before = sample("hango_http_connections_shed_total", reason="evicted_idle")
        reply = await _request(server.port, "/metrics")
        assert reply.startswith(b"HTTP/1.1 200") and b"hango_http_connections_shed_total" in reply
        assert sample("hango_http_connections_shed_total", reason="evicted_idle") == before + 1
        for _, w in idle:
            w.close()


async def test_metrics_host_setting_binds_that_address(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANGO_METRICS_HOST", "127.0.0.1")
    settings = load_settings()
    assert settings.metrics_host == "127.0.0.1"
    async with await start_metrics_server(0, None, host=settings.metrics_host) as server:
        assert server.host == "127.0.0.1"
    monkeypatch.setenv("HANGO_METRICS_HOST", "not a host!")
    with pytest.raises(ConfigError, match="HANGO_METRICS_HOST='not a host!' is not valid"):
        load_settings()
    monkeypatch.delenv("HANGO_METRICS_HOST")
    assert load_settings().metrics_host == "0.0.0.0"
