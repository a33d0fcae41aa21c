"""The console closes a connection that sends no request head, or half of one, within
its head timeout (console/protocol.py); a complete request is served as before."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from hango_worker.console import protocol
from tests.console_helpers import console


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the server sent before it closed the connection (fails after `seconds`)."""
    async with asyncio.timeout(seconds):
        return await reader.read()


@pytest.mark.parametrize(
    "sent", [b"", b"GET /login HTTP/1.1\r\nHost: x\r\n"], ids=["nothing", "half a head"]
)
async def test_a_connection_without_a_whole_head_is_closed(
    dsn: str, monkeypatch: pytest.MonkeyPatch, sent: bytes
) -> None:
    """Proves: before, uvicorn kept such a connection open for ever (its keep-alive
    timeout starts only after a response)."""
    monkeypatch.setattr(protocol, "HEAD_TIMEOUT_S", 0.5)
    async with console(dsn) as url:
        u = urlsplit(url)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        try:
            writer.write(sent)
            await writer.drain()
            assert await _closed_within(reader, 20) == b""  # closed, nothing answered
        finally:
            writer.close()


async def test_a_whole_request_is_served_and_the_next_head_timed_again(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(protocol, "HEAD_TIMEOUT_S", 0.5)
    async with console(dsn) as url:
        u = urlsplit(url)
        reader, writer = await asyncio.open_connection(u.hostname, u.port)
        try:
            writer.write(b"GET /login HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            rest = await _closed_within(reader, 20)  # served, then idle: closed again
            assert rest.startswith(b"HTTP/1.1 200")
        finally:
            writer.close()
