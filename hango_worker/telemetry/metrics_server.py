"""A tiny HTTP/1.1 server for ``/metrics``, ``/healthz`` and ``/readyz``.

It runs inside the worker's asyncio event loop (no thread). Every request is
bounded: the request head must fit in ``MAX_HEAD_BYTES`` and the whole
exchange must finish within ``REQUEST_TIMEOUT_S``; at most
``MAX_CONNECTIONS`` are served at once (extra ones are closed at once).
Responses always carry ``Connection: close``.

``/metrics`` is prometheus-client's exposition of the default registry (the
format is negotiated from ``Accept``), with the ``_created`` series turned
off through ``prometheus_client.disable_created_metrics()``. ``/healthz`` is
200 while the loop is alive. ``/readyz`` is 200 when ``ready_check()``
returns True, else 503 with a short reason (an exception's type only, never
its message, which could hold a DSN — except ``NotReady``, whose message is
written to be shown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import prometheus_client
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], Awaitable[bool]]

MAX_HEAD_BYTES = 8192
REQUEST_TIMEOUT_S = 10.0
READY_CHECK_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32
TEXT = "text/plain; charset=utf-8"


@dataclass
class _Response:
    status: HTTPStatus
    body: bytes = b""
    content_type: str = TEXT
    headers: dict[str, str] = field(default_factory=dict)


class NotReady(Exception):
    """Raised by a ready check: not ready, and the message (safe to show) says why."""


class _BadRequest(Exception):
    def __init__(self, status: HTTPStatus) -> None:
        super().__init__(status.phrase)
        self.status = status


class MetricsServer:
    """A running metrics server; ``await close()`` to stop it."""

    def __init__(self, ready_check: ReadyCheck | None, registry: CollectorRegistry) -> None:
        self._ready_check = ready_check
        self._registry = registry
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.host = ""
        self.port = 0

    async def _start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(
            self._on_connection, host, port, limit=MAX_HEAD_BYTES
        )
        sockname = self._server.sockets[0].getsockname()
        self.host, self.port = str(sockname[0]), int(sockname[1])

    async def close(self) -> None:
        """Stop listening and drop in-flight connections. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> MetricsServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if len(self._tasks) >= MAX_CONNECTIONS or task is None:
            writer.close()
            return
        self._tasks.add(task)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await self._serve_one(reader, writer)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("metrics server: unexpected error")
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head_only = False
        try:
            method, path, headers = await _read_head(reader)
            head_only = method == "HEAD"
            response = await self._route(method, path, headers)
        except _BadRequest as err:
            response = _Response(err.status, f"{err.status.phrase}\n".encode())
        except Exception:  # e.g. a broken collector: answer 500, keep serving
            log.exception("metrics server: error while answering a request")
            response = _Response(HTTPStatus.INTERNAL_SERVER_ERROR, b"internal error\n")
        writer.write(_encode(response, head_only))
        await writer.drain()

    async def _route(self, method: str, path: str, headers: dict[str, str]) -> _Response:
        if method not in ("GET", "HEAD"):
            allow = {"Allow": "GET, HEAD"}
            return _Response(HTTPStatus.METHOD_NOT_ALLOWED, b"method not allowed\n", TEXT, allow)
        if path == "/metrics":
            encoder, content_type = choose_encoder(headers.get("accept", ""))
            return _Response(HTTPStatus.OK, encoder(self._registry), content_type)
        if path == "/healthz":
            return _Response(HTTPStatus.OK, b"ok\n")
        if path == "/readyz":
            reason = await self._not_ready_reason()
            if reason is None:
                return _Response(HTTPStatus.OK, b"ready\n")
            return _Response(HTTPStatus.SERVICE_UNAVAILABLE, f"not ready: {reason}\n".encode())
        return _Response(HTTPStatus.NOT_FOUND, b"not found\n")

    async def _not_ready_reason(self) -> str | None:
        if self._ready_check is None:
            return None
        try:
            async with asyncio.timeout(READY_CHECK_TIMEOUT_S):
                ok = await self._ready_check()
        except TimeoutError:
            return "check timed out"
        except NotReady as err:
            return str(err)
        except Exception as err:
            return f"check failed ({type(err).__name__})"
        return None if ok is True else "check returned false"


async def _read_head(reader: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
    """Request line and headers; the body (if any) is ignored, the connection closes."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError as err:
        raise _BadRequest(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE) from err
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
        raise _BadRequest(HTTPStatus.BAD_REQUEST)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(HTTPStatus.BAD_REQUEST)
        headers[name.strip().lower()] = value.strip()
    return parts[0].upper(), parts[1].split("?", 1)[0], headers


def _encode(response: _Response, head_only: bool) -> bytes:
    status = response.status
    head = [
        f"HTTP/1.1 {status.value} {status.phrase}",
        f"Content-Type: {response.content_type}",
        f"Content-Length: {len(response.body)}",
        "Connection: close",
        "Cache-Control: no-store",
        *(f"{k}: {v}" for k, v in response.headers.items()),
    ]
    data = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1")
    return data if head_only else data + response.body


async def start_metrics_server(
    port: int,
    ready_check: ReadyCheck | None = None,
    host: str = "0.0.0.0",
    *,
    registry: CollectorRegistry = REGISTRY,
) -> MetricsServer:
    """Start serving on ``host:port`` (port 0 picks a free one; see ``.port``)."""
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    server = MetricsServer(ready_check, registry)
    await server._start(host, port)
    log.info("metrics server listening on %s:%d", server.host, server.port)
    return server
