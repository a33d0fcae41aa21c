"""Spans with tracing off (telemetry/tracing.py's fast path): the same spans the API's
no-op tracer gives, so a run still passes its trace on (a previous attempt's parent, a
child run's traceparent) when this worker records nothing."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from hango_worker.telemetry import tracing
from hango_worker.telemetry.tracing import current_traceparent, tracer, tracing_off

TRACE_ID, SPAN_ID = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
PARENT = f"00-{TRACE_ID:032x}-{SPAN_ID:016x}-01"


@pytest.fixture
def off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tracing off, whatever earlier tests of this process installed."""
    monkeypatch.setattr(tracing, "tracing_off", lambda: True)


def test_with_tracing_off_a_parent_context_becomes_current_and_is_passed_on(off: None) -> None:
    sc = SpanContext(TRACE_ID, SPAN_ID, True, TraceFlags(1))
    parent = trace.set_span_in_context(NonRecordingSpan(sc))
    assert current_traceparent() is None
    with tracer().start_as_current_span("invoke_agent x", context=parent) as span:
        assert span.get_span_context() == sc
        assert current_traceparent() == PARENT
        with tracer().start_as_current_span("turn 1") as inner:  # nested: the same
            assert inner.get_span_context() == sc
            assert current_traceparent() == PARENT
        assert current_traceparent() == PARENT
    assert current_traceparent() is None  # detached on exit
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_with_tracing_off_a_span_without_parent_is_invalid(off: None) -> None:
    with tracer().start_as_current_span("turn 1") as span:
        assert span is trace.INVALID_SPAN
        assert not span.is_recording()


def test_an_installed_provider_turns_the_fast_path_off(tracing: object) -> None:
    assert not tracing_off()
    with tracer().start_as_current_span("turn 1") as span:
        assert span.is_recording()
