"""Tracing set-up from the standard ``OTEL_*`` environment variables.

``setup_tracing()`` builds an SDK ``TracerProvider`` with a batch span
processor and an OTLP exporter when an endpoint is configured
(``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``).
Without one it installs nothing and returns a no-op handle: the API's
no-op tracer stays in place and spans cost (almost) nothing.

What the SDK already reads from the environment is left to it: the exporters
read the endpoint, ``*_HEADERS``, ``*_TIMEOUT``, ``*_COMPRESSION`` and TLS
variables; ``Resource.create`` reads ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES``; the batch processor reads ``OTEL_BSP_*``. This
module only picks the protocol (``OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL``:
``http/protobuf`` by default, ``grpc`` on request) and the default service name.

OpenTelemetry lets the global tracer provider be set once per process. So the
first global set-up installs a small delegating provider, and every later
``setup_tracing(set_global=True)`` (tests, a restarted worker) re-points it at
the newly built SDK provider; ``TracingHandle.shutdown()`` flushes and
detaches it. Tracers handed out earlier follow the switch.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import (
    SERVICE_NAME,
    SERVICE_VERSION,
    OTELResourceDetector,
    Resource,
)
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span
from opentelemetry.util._decorator import _agnosticcontextmanager
from opentelemetry.util.types import Attributes

log = logging.getLogger(__name__)

PROTOCOL_HTTP = "http/protobuf"
PROTOCOL_GRPC = "grpc"
_PROTOCOL_HTTP_JSON = "http/json"
DEFAULT_SERVICE_NAME = "hango-worker"
_TRUE = ("true", "1", "yes", "on")


@dataclass
class TracingHandle:
    """What ``setup_tracing`` installed. ``provider is None`` means tracing is off."""

    provider: TracerProvider | None = None
    exporter: SpanExporter | None = None
    protocol: str | None = None
    installed_global: bool = False
    _closed: bool = field(default=False, repr=False)

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every ended span now; True when everything was exported."""
        if self.provider is None or self._closed:
            return True
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop exporting. Idempotent; a no-op when tracing is off."""
        if self.provider is None or self._closed:
            return
        self._closed = True
        if self.installed_global:
            _SWITCH.release(self.provider)
        self.provider.shutdown()


def tracing_configured(env: Mapping[str, str] | None = None) -> bool:
    """True when the environment asks for OTLP trace export."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return bool(
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    )


def resolve_protocol(env: Mapping[str, str] | None = None) -> str:
    """The OTLP protocol for traces: the signal-specific variable wins."""
    env = os.environ if env is None else env
    raw = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "").strip()
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip()
        or PROTOCOL_HTTP
    ).lower()
    if raw == _PROTOCOL_HTTP_JSON:
        log.warning("OTLP protocol http/json is not supported in Python; using http/protobuf")
        return PROTOCOL_HTTP
    if raw not in (PROTOCOL_HTTP, PROTOCOL_GRPC):
        raise ValueError(f"unsupported OTEL_EXPORTER_OTLP_PROTOCOL {raw!r}")
    return raw


def build_resource(service_name_default: str = DEFAULT_SERVICE_NAME) -> Resource:
    """``Resource.create`` (env attributes win) with our default service name and version."""
    from_env = OTELResourceDetector().detect().attributes
    defaults: dict[str, str] = {}
    if not from_env.get(SERVICE_NAME):
        defaults[SERVICE_NAME] = service_name_default
    if SERVICE_VERSION not in from_env:
        with contextlib.suppress(metadata.PackageNotFoundError):
            defaults[SERVICE_VERSION] = metadata.version("hango-worker")
    return Resource.create(defaults)


def build_exporter(protocol: str) -> SpanExporter:
    """The standard OTLP span exporter; it reads its own ``OTEL_EXPORTER_OTLP_*`` settings."""
    if protocol == PROTOCOL_GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GrpcExporter,
        )

        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
        OTLPSpanExporter as HttpExporter,
    )

    return HttpExporter()


def setup_tracing(
    service_name_default: str = DEFAULT_SERVICE_NAME,
    *,
    set_global: bool = True,
    exporter: SpanExporter | None = None,
) -> TracingHandle:
    """Configure tracing from ``OTEL_*``; see the module docstring.

    ``exporter`` overrides the OTLP exporter (and the endpoint check), e.g. an
    ``InMemorySpanExporter`` in tests. ``set_global=False`` builds a provider
    without touching the process-wide one (use ``handle.provider.get_tracer``).
    """
    protocol: str | None = None
    if exporter is None:
        if not tracing_configured():
            return TracingHandle()
        protocol = resolve_protocol()
        exporter = build_exporter(protocol)
    provider = TracerProvider(resource=build_resource(service_name_default))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    handle = TracingHandle(provider=provider, exporter=exporter, protocol=protocol)
    if set_global:
        handle.installed_global = _SWITCH.install(provider)
    return handle


class _SwitchTracer(trace.Tracer):
    """A tracer that resolves its target on every span, so it follows the switch."""

    def __init__(
        self, switch: _Switch, args: tuple[str, str | None, str | None, Attributes]
    ) -> None:
        self._switch = switch
        self._args = args
        self._cached: tuple[trace.TracerProvider | None, trace.Tracer] | None = None

    def _target(self) -> trace.Tracer:
        provider = self._switch.current
        cached = self._cached
        if cached is not None and cached[0] is provider:
            return cached[1]
        target = trace.NoOpTracer() if provider is None else provider.get_tracer(*self._args)
        self._cached = (provider, target)
        return target

    def start_span(self, *args: Any, **kwargs: Any) -> Span:
        return self._target().start_span(*args, **kwargs)

    @_agnosticcontextmanager
    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Iterator[Span]:
        with self._target().start_as_current_span(*args, **kwargs) as span:
            yield span


class _Switch(trace.TracerProvider):
    """Installed once as the global provider; delegates to the current SDK provider."""

    def __init__(self) -> None:
        self.current: TracerProvider | None = None
        self._installed: list[TracerProvider] = []  # newest last; release restores the previous
        self._lock = threading.Lock()
        self._tracers: dict[tuple[str, str | None, str | None], _SwitchTracer] = {}

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        args = (instrumenting_module_name, instrumenting_library_version, schema_url, attributes)
        if attributes:  # possibly unhashable; rare
            return _SwitchTracer(self, args)
        key = args[:3]
        found = self._tracers.get(key)
        if found is None:  # a benign race at worst: two equivalent tracers
            found = self._tracers.setdefault(key, _SwitchTracer(self, args))
        return found

    def install(self, provider: TracerProvider) -> bool:
        """Point the global provider at ``provider``; False if someone else owns it."""
        with self._lock:
            current_global = trace.get_tracer_provider()
            if current_global is not self:
                if not isinstance(current_global, trace.ProxyTracerProvider):
                    log.warning("a global TracerProvider is already set; not replacing it")
                    return False
                trace.set_tracer_provider(self)
                if trace.get_tracer_provider() is not self:
                    return False
            self._installed.append(provider)
            self.current = provider
            return True

    def hango_idle(self) -> bool:
        """Nothing to record to (telemetry/tracing.py's fast path with tracing off)."""
        return self.current is None

    def release(self, provider: TracerProvider) -> None:
        """Stop using ``provider``; the one installed before it (if still open) takes over."""
        with self._lock:
            self._installed = [p for p in self._installed if p is not provider]
            self.current = self._installed[-1] if self._installed else None


_SWITCH = _Switch()
