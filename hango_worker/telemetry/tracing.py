"""Span helpers shared by every layer (the OpenTelemetry API only; set-up is in setup.py).

Middleware events land on the *turn* span: the loop publishes it in a
context variable so a wrapper deep in the onion (or a tool span) can find it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

TRACER_NAME = "hango_worker"
MW_NAME = "hango.middleware.name"

_turn_span: ContextVar[Span | None] = ContextVar("hango_turn_span", default=None)


@dataclass(slots=True)
class ToolCallNote:
    """What happened to the tool call in flight, as middlewares report it."""

    span: Span
    denied_by: str | None = None


_tool_call: ContextVar[ToolCallNote | None] = ContextVar("hango_tool_call", default=None)


def tracing_off() -> bool:
    """No span can record: no global provider is set (the API's proxy), or it is the
    no-op one, or it says it has nothing to record to (`hango_idle`: telemetry/setup.py's
    switch between set-ups)."""
    # the global provider as set_tracer_provider left it; trace.get_tracer_provider()
    # would read the environment on every call while none is set
    p = getattr(trace, "_TRACER_PROVIDER", None)
    if p is None:
        p = trace.get_tracer_provider()
    if isinstance(p, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return True
    idle = getattr(p, "hango_idle", None)
    return idle is not None and bool(idle())


class _Current:
    """`span` current for a `with` block (tracing off): a class, not a generator."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span, token: object | None) -> None:
        self.span = span
        self.token = token

    def __enter__(self) -> Span:
        return self.span

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            otel_context.detach(self.token)  # type: ignore[arg-type]


class _Tracer(trace.Tracer):
    """The worker's tracer. With tracing off, `start_as_current_span` does what the API's
    no-op tracer does (the span is the parent's if that is a non-recording span, else
    INVALID_SPAN, current for the block) without its layers of context managers: about
    5 % of a one-turn run's worker CPU went there (python -m bench.cpu_per_run --profile).
    It returns a plain context manager (used only in `with`), hence the override note."""

    def __init__(self, inner: trace.Tracer) -> None:
        self._inner = inner

    def start_span(self, *args: Any, **kwargs: Any) -> Span:
        return self._inner.start_span(*args, **kwargs)

    def start_as_current_span(  # type: ignore[override]
        self, *args: Any, **kwargs: Any
    ) -> AbstractContextManager[Span]:
        if not tracing_off():
            return self._inner.start_as_current_span(*args, **kwargs)
        context = kwargs.get("context", args[1] if len(args) > 1 else None)
        span = trace.get_current_span(context)
        if not isinstance(span, trace.NonRecordingSpan):
            span = trace.INVALID_SPAN
        if span is trace.get_current_span():  # already current: nothing to attach
            return _Current(span, None)
        return _Current(span, otel_context.attach(trace.set_span_in_context(span)))


_tracer: _Tracer | None = None


def tracer() -> trace.Tracer:
    """The worker's tracer, looked up once (`trace.get_tracer` reads the environment on
    each call while no global provider is set). Safe to keep: before a global provider
    is set it is the API's proxy tracer, which follows the provider once one is set, and
    telemetry/setup.py's provider follows every later set-up itself."""
    global _tracer
    if _tracer is None:
        _tracer = _Tracer(trace.get_tracer(TRACER_NAME))
    return _tracer


def current_traceparent() -> str | None:
    """The W3C traceparent of the current span (None outside a recording span): what a
    child run is given so its spans join this trace."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def current_turn_span() -> Span:
    span = _turn_span.get()
    return span if span is not None else trace.get_current_span()


@contextmanager
def turn_span(name: str, attributes: dict[str, Any]) -> Iterator[Span]:
    with tracer().start_as_current_span(name, kind=SpanKind.INTERNAL, attributes=attributes) as s:
        token = _turn_span.set(s)
        try:
            yield s
        finally:
            _turn_span.reset(token)


def middleware_event(event: str, middleware: str, reason: str = "", **attrs: Any) -> None:
    """Record `middleware.*` on the enclosing turn span (seed: Instrumentation)."""
    attributes: dict[str, Any] = {MW_NAME: middleware}
    if reason:
        attributes["hango.middleware.reason"] = reason
    attributes.update(attrs)
    current_turn_span().add_event(event, attributes)


@contextmanager
def tool_call_scope(span: Span) -> Iterator[ToolCallNote]:
    """Around one `execute_tool` span: lets a middleware deep in the onion report
    on the call (`deny_tool_call`). The note is shared, not copied, so a report
    made in a child task still reaches the span's owner."""
    note = ToolCallNote(span)
    token = _tool_call.set(note)
    try:
        yield note
    finally:
        _tool_call.reset(token)


def current_tool_call() -> ToolCallNote | None:
    return _tool_call.get()


def deny_tool_call(middleware: str, reason: str, **attrs: Any) -> None:
    """A middleware refused the tool call in flight by policy (it never ran).

    That is an expected, recorded outcome, not a failure: the `execute_tool` span
    gets `hango.tool.denied_by` and a `tool.denied` event, and its status is left
    unset, so denials do not fill error views. Outside a tool span it is a no-op."""
    note = _tool_call.get()
    if note is None:
        return
    note.denied_by = middleware
    attributes: dict[str, Any] = {MW_NAME: middleware, "hango.middleware.reason": reason}
    attributes.update(attrs)
    note.span.set_attribute("hango.tool.denied_by", middleware)
    note.span.add_event("tool.denied", attributes)


def state_missing(middleware: str) -> None:
    trace.get_current_span().add_event("middleware.state_missing", {MW_NAME: middleware})


def mark_error(span: Span, error_type: str, message: str = "") -> None:
    span.set_status(Status(StatusCode.ERROR, message[:200]))
    span.set_attribute("error.type", error_type)
