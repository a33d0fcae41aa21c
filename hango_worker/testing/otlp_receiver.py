"""A local OTLP/HTTP receiver for tests: what the real exporter sends, decoded.

Point the standard exporter at it and assert on plain dataclasses::

    with OTLPReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        handle = setup_tracing()
        ...  # code under test makes spans
        handle.force_flush()
        spans = receiver.wait_for(3)
        run = receiver.find("invoke_agent demo")
        assert [c.name for c in receiver.children(run)] == [...]

It listens on 127.0.0.1 (a thread, so it works with any event loop), accepts
``POST /v1/traces`` as protobuf (``application/x-protobuf``, optionally gzip
or deflate encoded) or OTLP/JSON (``application/json``), and also
``/v1/metrics`` and ``/v1/logs`` (kept as decoded protobuf messages).
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

MAX_BODY_BYTES = 64 * 1024 * 1024
TRACES_PATH = "/v1/traces"
METRICS_PATH = "/v1/metrics"
LOGS_PATH = "/v1/logs"
_REQUEST_TYPES: dict[str, Any] = {
    TRACES_PATH: trace_service_pb2.ExportTraceServiceRequest,
    METRICS_PATH: metrics_service_pb2.ExportMetricsServiceRequest,
    LOGS_PATH: logs_service_pb2.ExportLogsServiceRequest,
}
_RESPONSE_TYPES: dict[str, Any] = {
    TRACES_PATH: trace_service_pb2.ExportTraceServiceResponse,
    METRICS_PATH: metrics_service_pb2.ExportMetricsServiceResponse,
    LOGS_PATH: logs_service_pb2.ExportLogsServiceResponse,
}
_HEX_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id"})
_HEX_ID_KEYS |= {"parent_span_id"}

SpanPredicate = Callable[[list["ReceivedSpan"]], bool]


@dataclass(frozen=True)
class ReceivedEvent:
    name: str
    attributes: dict[str, Any]
    time_unix_nano: int = 0


@dataclass(frozen=True)
class ReceivedLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span. Ids are lower-case hex; kind/status are short names."""

    name: str
    kind: str  # "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER", "UNSPECIFIED"
    trace_id: str
    span_id: str
    parent_span_id: str | None
    attributes: dict[str, Any]
    events: list[ReceivedEvent]
    links: list[ReceivedLink]
    status_code: str  # "UNSET", "OK", "ERROR"
    status_message: str
    resource: dict[str, Any]
    scope_name: str
    scope_version: str = ""
    start_time_unix_nano: int = 0
    end_time_unix_nano: int = 0

    @property
    def duration_s(self) -> float:
        return (self.end_time_unix_nano - self.start_time_unix_nano) / 1e9

    def events_named(self, name: str) -> list[ReceivedEvent]:
        return [e for e in self.events if e.name == name]

    def event(self, name: str) -> ReceivedEvent:
        """The first event called ``name``; LookupError (listing the names) if none."""
        for e in self.events:
            if e.name == name:
                return e
        raise LookupError(f"span {self.name!r} has no event {name!r}; has {_names(self.events)}")


@dataclass(frozen=True)
class ReceivedRequest:
    """One export request as received (body decompressed)."""

    path: str
    content_type: str
    headers: dict[str, str]
    body: bytes
    message: Any = None  # the decoded Export*ServiceRequest, None if it did not decode


def decode_any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as plain Python (arrays → list, kvlists → dict)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [decode_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return decode_attributes(value.kvlist_value.values)
    return getattr(value, kind)


def decode_attributes(key_values: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: decode_any_value(kv.value) for kv in key_values}


def decode_spans(request: Any) -> list[ReceivedSpan]:
    """Flatten an ``ExportTraceServiceRequest`` into ``ReceivedSpan`` objects."""
    out: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        resource = decode_attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            out.extend(_decode_span(s, resource, scope) for s in scope_spans.spans)
    return out


def _decode_span(span: Any, resource: dict[str, Any], scope: Any) -> ReceivedSpan:
    events = [
        ReceivedEvent(e.name, decode_attributes(e.attributes), int(e.time_unix_nano))
        for e in span.events
    ]
    links = [
        ReceivedLink(lk.trace_id.hex(), lk.span_id.hex(), decode_attributes(lk.attributes))
        for lk in span.links
    ]
    kind = trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_")
    status = trace_pb2.Status.StatusCode.Name(span.status.code).removeprefix("STATUS_CODE_")
    return ReceivedSpan(
        name=span.name,
        kind=kind,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex() or None,
        attributes=decode_attributes(span.attributes),
        events=events,
        links=links,
        status_code=status,
        status_message=span.status.message,
        resource=dict(resource),
        scope_name=scope.name,
        scope_version=scope.version,
        start_time_unix_nano=int(span.start_time_unix_nano),
        end_time_unix_nano=int(span.end_time_unix_nano),
    )


def parse_otlp_json(body: bytes, message_type: Any) -> Any:
    """OTLP/JSON → protobuf message (ids are hex in OTLP/JSON, not base64)."""
    return json_format.ParseDict(
        _hex_ids_to_base64(json.loads(body)), message_type(), ignore_unknown_fields=True
    )


def _hex_ids_to_base64(node: Any) -> Any:
    if isinstance(node, list):
        return [_hex_ids_to_base64(v) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _HEX_ID_KEYS and isinstance(value, str):
            out[key] = base64.b64encode(bytes.fromhex(value)).decode()
        else:
            out[key] = _hex_ids_to_base64(value)
    return out


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


def _names(items: Iterable[ReceivedSpan | ReceivedEvent]) -> list[str]:
    return [i.name for i in items]


class OTLPReceiver:
    """A local OTLP/HTTP endpoint that records what it receives. See the module docstring."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host = host
        self._port = port
        self._cond = threading.Condition()
        self._spans: list[ReceivedSpan] = []
        self._requests: list[ReceivedRequest] = []
        self._errors: list[str] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------
    def start(self) -> OTLPReceiver:
        if self._server is not None:
            return self
        server = _Server((self._host, self._port), _Handler)
        server.receiver = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.name = f"otlp-receiver-{self.port}"
        self._thread.start()
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("OTLPReceiver is not started")
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """Base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter appends /v1/traces)."""
        return f"http://{self._host}:{self.port}"

    @property
    def traces_endpoint(self) -> str:
        """Full URL for ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``."""
        return self.endpoint + TRACES_PATH

    # -- queries -----------------------------------------------------------
    def spans(self) -> list[ReceivedSpan]:
        """A snapshot of every span received so far, in arrival order."""
        with self._cond:
            return list(self._spans)

    def requests(self, path: str | None = None) -> list[ReceivedRequest]:
        """Raw export requests (all, or those to ``path`` such as ``/v1/metrics``)."""
        with self._cond:
            return [r for r in self._requests if path is None or r.path == path]

    def metrics_requests(self) -> list[Any]:
        return [r.message for r in self.requests(METRICS_PATH) if r.message is not None]

    def logs_requests(self) -> list[Any]:
        return [r.message for r in self.requests(LOGS_PATH) if r.message is not None]

    @property
    def errors(self) -> list[str]:
        """Requests that were refused (bad path, body or encoding), for assertions."""
        with self._cond:
            return list(self._errors)

    def clear(self) -> None:
        with self._cond:
            self._spans.clear()
            self._requests.clear()
            self._errors.clear()

    def wait_for(
        self, what: int | str | SpanPredicate = 1, timeout: float = 10.0
    ) -> list[ReceivedSpan]:
        """Block until ``what`` holds, then return the spans snapshot.

        ``what`` is a span count (at least that many), a span name (one such
        span arrived) or a predicate over the list of all spans received.
        Raises TimeoutError (listing the names received) after ``timeout`` s.
        """
        predicate = _as_predicate(what)
        with self._cond:
            if self._cond.wait_for(lambda: predicate(self._spans), timeout):
                return list(self._spans)
            names = _names(self._spans)
        raise TimeoutError(f"OTLPReceiver: {what!r} not met in {timeout}s; received {names}")

    def find_all(self, name: str) -> list[ReceivedSpan]:
        """Spans called ``name``, ordered by start time."""
        return sorted(
            (s for s in self.spans() if s.name == name), key=lambda s: s.start_time_unix_nano
        )

    def find(self, name: str) -> ReceivedSpan:
        """The earliest span called ``name``; LookupError (listing the names) if none."""
        found = self.find_all(name)
        if not found:
            raise LookupError(f"no span {name!r}; received {sorted(set(_names(self.spans())))}")
        return found[0]

    def children(self, span: ReceivedSpan) -> list[ReceivedSpan]:
        """Direct children of ``span``, ordered by start time."""
        kids = [
            s
            for s in self.spans()
            if s.parent_span_id == span.span_id and s.trace_id == span.trace_id
        ]
        return sorted(kids, key=lambda s: s.start_time_unix_nano)

    def roots(self) -> list[ReceivedSpan]:
        """Spans without a parent, ordered by start time."""
        roots = [s for s in self.spans() if s.parent_span_id is None]
        return sorted(roots, key=lambda s: s.start_time_unix_nano)

    # -- called from the handler thread ------------------------------------
    def _record(self, request: ReceivedRequest, spans: list[ReceivedSpan]) -> None:
        with self._cond:
            self._requests.append(request)
            self._spans.extend(spans)
            self._cond.notify_all()

    def _record_error(self, error: str) -> None:
        with self._cond:
            self._errors.append(error)
            self._cond.notify_all()


def _as_predicate(what: int | str | SpanPredicate) -> SpanPredicate:
    if isinstance(what, bool):
        raise TypeError("wait_for expects a count, a span name or a predicate")
    if isinstance(what, int):
        count = what
        return lambda spans: len(spans) >= count
    if isinstance(what, str):
        name = what
        return lambda spans: any(s.name == name for s in spans)
    return what


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: OTLPReceiver


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in _REQUEST_TYPES:
            self._refuse(HTTPStatus.NOT_FOUND, f"unknown path {path}")
            return
        try:
            body = _decompress(self._read_body(), self.headers.get("Content-Encoding", ""))
            content_type = self.headers.get("Content-Type", "application/x-protobuf")
            is_json = content_type.split(";")[0].strip().lower() == "application/json"
            message = self._parse(path, body, is_json)
        except Exception as err:  # a bad request must not kill the receiver
            self._refuse(HTTPStatus.BAD_REQUEST, f"{path}: {type(err).__name__}: {err}")
            return
        spans = decode_spans(message) if path == TRACES_PATH else []
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = ReceivedRequest(path, content_type, headers, body, message)
        self.server.receiver._record(request, spans)
        response = _RESPONSE_TYPES[path]()
        if is_json:
            self._reply(HTTPStatus.OK, json_format.MessageToJson(response).encode(), content_type)
        else:
            self._reply(HTTPStatus.OK, response.SerializeToString(), "application/x-protobuf")

    def do_GET(self) -> None:
        self._reply(HTTPStatus.METHOD_NOT_ALLOWED, b"POST only\n", "text/plain")

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._read_chunked()
        length = int(self.headers.get("Content-Length", "0"))
        if length < 0 or length > MAX_BODY_BYTES:
            raise ValueError(f"bad Content-Length {length}")
        return self.rfile.read(length)

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            size = int(self.rfile.readline(1024).split(b";")[0].strip(), 16)
            total += size
            if total > MAX_BODY_BYTES:
                raise ValueError("chunked body too large")
            if size == 0:
                while self.rfile.readline(1024).strip():  # trailers
                    pass
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline(16)

    @staticmethod
    def _parse(path: str, body: bytes, is_json: bool) -> Any:
        message_type = _REQUEST_TYPES[path]
        if is_json:
            return parse_otlp_json(body, message_type)
        message = message_type()
        message.ParseFromString(body)
        return message

    def _refuse(self, status: HTTPStatus, error: str) -> None:
        self.server.receiver._record_error(error)
        self.close_connection = True
        self._reply(status, (error + "\n").encode(), "text/plain")

    def _reply(self, status: HTTPStatus, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
