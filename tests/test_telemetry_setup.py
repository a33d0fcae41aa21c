"""Tracing set-up through the real OTLP exporter, the OTLP receiver, the metrics server."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import AnyValue
from prometheus_client.parser import text_string_to_metric_families

from hango_worker.telemetry import metrics
from hango_worker.telemetry.metrics_server import MetricsServer, start_metrics_server
from hango_worker.telemetry.setup import (
    PROTOCOL_GRPC,
    PROTOCOL_HTTP,
    TracingHandle,
    resolve_protocol,
    setup_tracing,
)
from hango_worker.telemetry.tracing import mark_error, tracer
from hango_worker.testing.otlp_receiver import OTLPReceiver, ReceivedSpan


@pytest.fixture(autouse=True)
def clean_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("OTEL_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as r:
        yield r


@pytest.fixture
def handles() -> Iterator[list[TracingHandle]]:
    made: list[TracingHandle] = []
    yield made
    for h in made:
        h.shutdown()


def _make_tree(t: trace.Tracer) -> tuple[str, str]:
    with t.start_as_current_span("other") as other:
        pass
    link = Link(other.get_span_context(), {"hango.link.reason": "previous_attempt"})
    attrs: dict[str, AnyValue] = {
        "s": "x",
        "i": 7,
        "f": 1.5,
        "b": True,
        "ls": ["a", "b"],
        "li": [1, 2],
    }
    with t.start_as_current_span("invoke_agent demo", attributes=attrs) as root:
        root.add_event("agent.middleware_stack", {"hango.middleware.names": ["a", "b", "c"]})
        with t.start_as_current_span("chat m", kind=SpanKind.CLIENT, links=[link]) as chat:
            chat.set_attribute("gen_ai.usage.input_tokens", 12)
        with t.start_as_current_span("execute_tool t") as tool:
            mark_error(tool, "tool_error", "boom")
    return format(other.get_span_context().span_id, "016x"), format(
        root.get_span_context().trace_id, "032x"
    )


def test_span_tree_round_trips_through_http_exporter(
    receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch, handles: list[TracingHandle]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test,team=infra")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-test-token=abc")
    handle = setup_tracing(set_global=False)
    handles.append(handle)
    assert handle.enabled and handle.protocol == PROTOCOL_HTTP and not handle.installed_global
    assert handle.provider is not None
    other_id, trace_id = _make_tree(handle.provider.get_tracer("test-scope"))
    handle.shutdown()  # flushes

    receiver.wait_for(4)
    root = receiver.find("invoke_agent demo")
    assert root.kind == "INTERNAL" and root.parent_span_id is None
    assert root.trace_id == trace_id and root.scope_name == "test-scope"
    assert root.attributes == {
        "s": "x",
        "i": 7,
        "f": 1.5,
        "b": True,
        "ls": ["a", "b"],
        "li": [1, 2],
    }
    assert root.event("agent.middleware_stack").attributes == {
        "hango.middleware.names": ["a", "b", "c"]
    }
    assert root.resource["service.name"] == "hango-worker"
    assert root.resource["deployment.environment"] == "test"
    assert root.resource["team"] == "infra"
    chat, tool = receiver.children(root)
    assert (chat.name, chat.kind, chat.status_code) == ("chat m", "CLIENT", "UNSET")
    assert chat.attributes["gen_ai.usage.input_tokens"] == 12
    assert [(lk.span_id, lk.attributes) for lk in chat.links] == [
        (other_id, {"hango.link.reason": "previous_attempt"})
    ]
    assert (tool.status_code, tool.status_message) == ("ERROR", "boom")
    assert tool.attributes["error.type"] == "tool_error"
    assert tool.parent_span_id == root.span_id and receiver.children(tool) == []
    assert receiver.requests("/v1/traces")[0].headers["x-test-token"] == "abc"
    assert receiver.errors == []


def test_gzip_compression_and_service_name(
    receiver: OTLPReceiver, monkeypatch: pytest.MonkeyPatch, handles: list[TracingHandle]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.traces_endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "my-worker")
    handle = setup_tracing(set_global=False)
    handles.append(handle)
    assert handle.provider is not None
    with handle.provider.get_tracer("t").start_as_current_span("zipped"):
        pass
    assert handle.force_flush()
    (span,) = receiver.wait_for("zipped")
    assert span.resource["service.name"] == "my-worker"
    assert receiver.requests()[0].headers["content-encoding"] == "gzip"


def test_global_setup_twice_follows_the_latest(
    monkeypatch: pytest.MonkeyPatch, handles: list[TracingHandle]
) -> None:
    with OTLPReceiver() as first, OTLPReceiver() as second:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", first.endpoint)
        from hango_worker.telemetry import setup as setup_module

        before = setup_module._SWITCH.current  # e.g. the test session's own provider
        h1 = setup_tracing()
        handles.append(h1)
        if not h1.installed_global:
            pytest.skip("another global TracerProvider was set in this process")
        early = tracer()  # handed out before the second set-up
        with early.start_as_current_span("one"):
            pass
        h1.shutdown()
        assert setup_module._SWITCH.current is before  # the previous provider is back
        if before is None:
            assert not early.start_span("after-shutdown").is_recording()

        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", second.endpoint)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "second")
        h2 = setup_tracing()
        handles.append(h2)
        assert h2.installed_global
        with early.start_as_current_span("two"), tracer().start_as_current_span("two-child"):
            pass
        h2.shutdown()
        assert [s.name for s in first.wait_for(1)] == ["one"]
        spans = second.wait_for(2)
        assert sorted(s.name for s in spans) == ["two", "two-child"]
        assert spans[0].resource["service.name"] == "second"
        assert second.children(second.find("two")) == [second.find("two-child")]


def test_explicit_exporter_needs_no_endpoint(handles: list[TracingHandle]) -> None:
    exporter = InMemorySpanExporter()
    handle = setup_tracing(set_global=False, exporter=exporter)
    handles.append(handle)
    assert handle.provider is not None
    with handle.provider.get_tracer("t").start_as_current_span("mem"):
        pass
    handle.force_flush()
    assert [s.name for s in exporter.get_finished_spans()] == ["mem"]


def test_no_endpoint_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    before = trace.get_tracer_provider()
    handle = setup_tracing()
    assert not handle.enabled and handle.provider is None and handle.exporter is None
    assert trace.get_tracer_provider() is before
    assert handle.force_flush()
    handle.shutdown()
    handle.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert not setup_tracing().enabled
    monkeypatch.delenv("OTEL_SDK_DISABLED")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert not setup_tracing().enabled


def test_grpc_protocol_selects_grpc_exporter(
    monkeypatch: pytest.MonkeyPatch, handles: list[TracingHandle]
) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcSpanExporter,
    )

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    handle = setup_tracing(set_global=False)
    handles.append(handle)
    assert handle.protocol == PROTOCOL_GRPC
    assert isinstance(handle.exporter, GrpcSpanExporter)


def test_protocol_resolution() -> None:
    assert resolve_protocol({}) == PROTOCOL_HTTP
    assert resolve_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == PROTOCOL_GRPC
    env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    }
    assert resolve_protocol(env) == PROTOCOL_HTTP
    assert resolve_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}) == PROTOCOL_HTTP
    with pytest.raises(ValueError):
        resolve_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"})


# -- receiver edge cases ------------------------------------------------------


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), bytes(err.read())


def test_receiver_accepts_json_metrics_and_refuses_garbage(receiver: OTLPReceiver) -> None:
    doc = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "j"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {"name": "js"},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "eee19b7ec3c1b173",
                                "name": "json-span",
                                "kind": 3,
                                "attributes": [{"key": "n", "value": {"intValue": "3"}}],
                                "status": {"code": 2, "message": "bad"},
                            }
                        ],
                    }
                ],
            }
        ]
    }
    url = receiver.traces_endpoint
    status, _ = _post(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    assert status == 200
    span: ReceivedSpan = receiver.find("json-span")
    assert (span.trace_id, span.span_id, span.parent_span_id) == (
        "5b8efff798038103d269b633813fc60c",
        "eee19b7ec3c1b174",
        "eee19b7ec3c1b173",
    )
    assert (span.kind, span.status_code, span.attributes) == ("CLIENT", "ERROR", {"n": 3})
    assert span.resource == {"service.name": "j"} and span.scope_name == "js"

    body = gzip.compress(metrics_service_pb2.ExportMetricsServiceRequest().SerializeToString())
    headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
    assert _post(receiver.endpoint + "/v1/metrics", body, headers)[0] == 200
    assert _post(receiver.endpoint + "/v1/logs", b"", headers={})[0] == 200
    assert len(receiver.metrics_requests()) == 1 and len(receiver.logs_requests()) == 1
    assert receiver.errors == []

    assert _post(url, b"\xff\xfe not protobuf", {})[0] == 400
    assert _post(receiver.endpoint + "/v2/nope", b"", {})[0] == 404
    assert len(receiver.errors) == 2
    receiver.clear()
    assert receiver.spans() == [] and receiver.errors == []
    with pytest.raises(TimeoutError, match="json-span"):
        receiver.wait_for("json-span", timeout=0.05)
    with pytest.raises(LookupError):
        receiver.find("json-span")


# -- metrics server -------------------------------------------------------------


async def _get(server: MetricsServer, path: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        url = f"http://127.0.0.1:{server.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return int(resp.status), resp.read().decode()
        except urllib.error.HTTPError as err:
            return int(err.code), err.read().decode()

    return await asyncio.to_thread(fetch)


async def _raw(server: MetricsServer, data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(data)
    await writer.drain()
    reply = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return reply


async def test_metrics_endpoint_parses_without_created_series() -> None:
    metrics.RUNS_CLAIMED.inc()
    metrics.TOOL_CALLS.labels("grep", "ok").inc()
    metrics.RUN_DURATION.labels("succeeded").observe(0.2)
    server = await start_metrics_server(0, None, host="127.0.0.1")
    try:
        status, text = await _get(server, "/metrics")
    finally:
        await server.close()
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["hango_runs_claimed"].type == "counter"
    assert families["hango_run_duration_seconds"].type == "histogram"
    tool_samples = [s for s in families["hango_tool_calls"].samples if s.name.endswith("_total")]
    assert any(s.labels == {"gen_ai_tool_name": "grep", "outcome": "ok"} for s in tool_samples)
    all_samples = [s.name for f in families.values() for s in f.samples]
    assert all_samples and not [n for n in all_samples if n.endswith("_created")]


async def test_health_and_readiness() -> None:
    state: dict[str, object] = {"ready": False}

    async def check() -> bool:
        if state["ready"] == "raise":
            raise RuntimeError("postgres://user:secret@db down")
        return state["ready"] is True

    async with await start_metrics_server(0, check, host="127.0.0.1") as server:
        assert await _get(server, "/healthz") == (200, "ok\n")
        status, body = await _get(server, "/readyz")
        assert status == 503 and "not ready" in body
        state["ready"] = "raise"
        status, body = await _get(server, "/readyz")
        assert status == 503 and "RuntimeError" in body and "secret" not in body
        state["ready"] = True
        assert await _get(server, "/readyz") == (200, "ready\n")
        assert (await _get(server, "/nope"))[0] == 404
    async with await start_metrics_server(0, None, host="127.0.0.1") as server:
        assert (await _get(server, "/readyz"))[0] == 200


async def test_metrics_server_survives_bad_and_slow_clients() -> None:
    server = await start_metrics_server(0, None, host="127.0.0.1")
    try:
        assert (await _raw(server, b"garbage\r\n\r\n")).startswith(b"HTTP/1.1 400")
        assert (await _raw(server, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
        huge = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"
        assert (await _raw(server, huge)).startswith(b"HTTP/1.1 431")
        head = await _raw(server, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and head.endswith(b"\r\n\r\n")
        _, idle = await asyncio.open_connection("127.0.0.1", server.port)  # never sends
        assert (await _get(server, "/healthz"))[0] == 200
    finally:
        await asyncio.wait_for(server.close(), 2)
    idle.close()
