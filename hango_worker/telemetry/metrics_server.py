"""A tiny HTTP/1.1 server for ``/metrics``, ``/healthz`` and ``/readyz``.

It runs inside the worker's asyncio event loop (no thread). Every request is
bounded: the request head must fit in ``MAX_HEAD_BYTES`` and arrive within
``HEAD_TIMEOUT_S``, and the whole exchange must finish within
``REQUEST_TIMEOUT_S``. At most ``MAX_CONNECTIONS`` are served at once. When
a new connection finds the budget full, the oldest connection that has waited
``EVICT_AFTER_S`` without sending its request head (an idle or half-open
client) is dropped to make room; otherwise up to ``MAX_OVERFLOW`` more
connections get a cheap answer (``/healthz`` 200, anything else 503 with
``Retry-After``) and the rest are closed. So liveness does not depend on
load: slow or idle clients cannot starve ``/healthz``. Responses always carry ``Connection: close``.

``/metrics`` is prometheus-client's exposition of the default registry (the
format is negotiated from ``Accept``), with the ``_created`` series turned
off through ``prometheus_client.disable_created_metrics()``. ``/healthz`` is
200 while the loop is alive. ``/readyz`` is 200 when ``ready_check()``
returns True, else 503 with a short reason (an exception's type only, never
its message, which could hold a DSN — except ``NotReady``, whose message is
written to be shown). Concurrent ``/readyz`` probes share one
in-flight check (single flight), and its result is reused for
``ready_cache_s`` seconds, so any number of probes costs at most one check
(one database connection) at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus

import prometheus_client
from prometheus_client import REGISTRY, CollectorRegistry, Counter
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

ReadyCheck = Callable[[], Awaitable[bool]]

MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT_S = 3.0
REQUEST_TIMEOUT_S = 10.0
READY_CHECK_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 32
MAX_OVERFLOW = 64
EVICT_AFTER_S = 1.0
TEXT = "text/plain; charset=utf-8"

SHED = Counter(
    "hango_http_connections_shed_total",
    "Connections to the metrics endpoint not served normally: evicted_idle (sent no "
    "request head, dropped for a newer connection), over_budget (answered cheaply: "
    "/healthz 200, else 503), refused (closed at once).",
    ["reason"],
)
READY_CHECKS = Counter(
    "hango_readiness_checks_total",
    "Readiness checks actually run (probes that share or reuse one are not counted).",
    ["result"],
)
for _reason in ("evicted_idle", "over_budget", "refused"):
    SHED.labels(_reason)
for _result in ("ready", "not_ready"):
    READY_CHECKS.labels(_result)


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

    def __init__(
        self,
        ready_check: ReadyCheck | None,
        registry: CollectorRegistry,
        ready_cache_s: float = 0.0,
    ) -> None:
        self._ready_check = ready_check
        self._registry = registry
        self._ready_cache_s = ready_cache_s
        self._ready_cached: tuple[float, str | None] | None = None
        self._ready_inflight: asyncio.Future[str | None] | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._waiting: dict[asyncio.Task[None], float] = {}  # no head yet: since when
        self._overflow: set[asyncio.Task[None]] = set()
        self.host = ""
        self.port = 0
        self.ready_checks = 0  # checks actually run (shared and cached probes excluded)

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
        if self._ready_inflight is not None:
            self._ready_inflight.cancel()
        tasks = [*self._tasks, *self._overflow]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> MetricsServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is None:
            writer.close()
            return
        now = asyncio.get_running_loop().time()
        if len(self._tasks) >= MAX_CONNECTIONS and self._waiting:
            oldest, since = next(iter(self._waiting.items()))
            if now - since >= EVICT_AFTER_S:  # idle or half-open: it yields its slot
                self._release(oldest)
                oldest.cancel()
                SHED.labels("evicted_idle").inc()
        if len(self._tasks) >= MAX_CONNECTIONS:
            self._overflow.add(task)
            try:
                await self._overflowing(reader, writer)
            finally:
                self._overflow.discard(task)
            return
        self._tasks.add(task)
        self._waiting[task] = now
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                await self._serve_one(reader, writer, task)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # evicted while waiting for its head, or the server is closing
        except Exception:
            log.exception("metrics server: unexpected error")
        finally:
            self._release(task)
            await _close(writer)

    def _release(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._waiting.pop(task, None)

    async def _overflowing(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Every slot is busy answering: /healthz still gets its 200, the rest a 503."""
        if len(self._overflow) > MAX_OVERFLOW:
            SHED.labels("refused").inc()
            writer.close()
            return
        SHED.labels("over_budget").inc()
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                method, path, _ = await _read_head(reader)
                if path == "/healthz":
                    response = _Response(HTTPStatus.OK, b"ok\n")
                else:
                    busy = {"Retry-After": "1"}
                    response = _Response(HTTPStatus.SERVICE_UNAVAILABLE, b"busy\n", TEXT, busy)
                writer.write(_encode(response, method == "HEAD"))
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, _BadRequest):
            pass
        finally:
            await _close(writer)

    async def _serve_one(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, task: asyncio.Task[None]
    ) -> None:
        head_only = False
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                method, path, headers = await _read_head(reader)
            self._waiting.pop(task, None)
            head_only = method == "HEAD"
            response = await self._route(method, path, headers)
        except _BadRequest as err:
            response = _Response(err.status, f"{err.status.phrase}\n".encode())
        except TimeoutError:
            return  # no request head in time: close without an answer
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
        loop = asyncio.get_running_loop()
        cached = self._ready_cached
        if cached is not None and loop.time() - cached[0] < self._ready_cache_s:
            return cached[1]
        if self._ready_inflight is None:
            self._ready_inflight = asyncio.ensure_future(self._check_once())
        # shielded: one probe hanging up must not cancel the check the others share
        return await asyncio.shield(self._ready_inflight)

    async def _check_once(self) -> str | None:
        assert self._ready_check is not None
        self.ready_checks += 1
        try:
            async with asyncio.timeout(READY_CHECK_TIMEOUT_S):
                ok = await self._ready_check()
            reason = None if ok is True else "check returned false"
        except TimeoutError:
            reason = "check timed out"
        except NotReady as err:
            reason = str(err)
        except Exception as err:
            reason = f"check failed ({type(err).__name__})"
        finally:
            self._ready_inflight = None
        READY_CHECKS.labels("ready" if reason is None else "not_ready").inc()
        self._ready_cached = (asyncio.get_running_loop().time(), reason)
        return reason


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(writer.wait_closed(), 1.0)


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
    ready_cache_s: float = 0.0,
) -> MetricsServer:
    """Start serving on ``host:port`` (port 0 picks a free one; see ``.port``).
    Raises OSError when the address cannot be bound (e.g. the port is in use)."""
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    server = MetricsServer(ready_check, registry, ready_cache_s)
    await server._start(host, port)
    log.info("metrics server listening on %s:%d", server.host, server.port)
    return server
