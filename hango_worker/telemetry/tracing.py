"""Span helpers shared by every layer (the OpenTelemetry API only; set-up is in setup.py).

Middleware events land on the *turn* span: the loop publishes it in a
context variable so a wrapper deep in the onion (or a tool span) can find it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

TRACER_NAME = "hango_worker"
MW_NAME = "hango.middleware.name"

_turn_span: ContextVar[Span | None] = ContextVar("hango_turn_span", default=None)


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


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


def state_missing(middleware: str) -> None:
    trace.get_current_span().add_event("middleware.state_missing", {MW_NAME: middleware})


def mark_error(span: Span, error_type: str, message: str = "") -> None:
    span.set_status(Status(StatusCode.ERROR, message[:200]))
    span.set_attribute("error.type", error_type)
