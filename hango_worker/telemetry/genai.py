"""OpenTelemetry GenAI semantic-convention spans and metrics for the loop.

Duck-typed on purpose (telemetry is a leaf and imports nothing from the
rest of hango_worker). Contents (messages, tool arguments and results) are
recorded only when capture_content is on (HANGO_CAPTURE_CONTENT=true).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Span, SpanKind, get_current_span

from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import (
    current_tool_call,
    current_turn_span,
    mark_error,
    tool_call_scope,
    tracer,
)

OP = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
MODEL = "gen_ai.request.model"


def agent_attributes(agent: Any, state: Any, provider_name: str) -> dict[str, Any]:
    return {
        OP: "invoke_agent",
        PROVIDER: provider_name,
        "gen_ai.agent.id": agent.id,
        "gen_ai.agent.name": agent.name,
        "gen_ai.conversation.id": state.session_id,
        MODEL: agent.model,
        "hango.run.id": state.run_id,
        "hango.tenant.id": state.tenant_id,
    }


def input_tokens(usage: Any) -> int:
    """GenAI conventions for Anthropic: input = input + cache read + cache creation."""
    return int(
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    )


def set_usage(span: Span, usage: Any) -> None:
    span.set_attribute("gen_ai.usage.input_tokens", input_tokens(usage))
    span.set_attribute("gen_ai.usage.output_tokens", int(usage.output_tokens))
    span.set_attribute("gen_ai.usage.cache_read.input_tokens", int(usage.cache_read_input_tokens))
    span.set_attribute(
        "gen_ai.usage.cache_creation.input_tokens", int(usage.cache_creation_input_tokens)
    )
    if usage.cache_creation_1h_input_tokens:
        span.set_attribute(
            "hango.usage.cache_creation_1h.input_tokens", usage.cache_creation_1h_input_tokens
        )
    if usage.thinking_tokens:  # a part of output_tokens
        span.set_attribute("hango.usage.thinking_tokens", usage.thinking_tokens)
    for unit, n in (usage.server_tool_use or {}).items():
        span.set_attribute(f"hango.usage.server_tool_use.{unit}", n)
    if usage.service_tier is not None:
        span.set_attribute("hango.usage.service_tier", usage.service_tier)
    if usage.service_tiers:  # a run's total: its responses per tier
        for tier, n in usage.service_tiers.items():
            span.set_attribute(f"hango.usage.service_tiers.{tier}", n)


@contextmanager
def chat_span(request: Any, provider_name: str) -> Iterator[Span]:
    attrs: dict[str, Any] = {
        OP: "chat",
        PROVIDER: provider_name,
        MODEL: request.model,
        "gen_ai.request.max_tokens": request.max_tokens,
    }
    if request.temperature is not None:
        attrs["gen_ai.request.temperature"] = request.temperature
    with tracer().start_as_current_span(
        f"chat {request.model}", kind=SpanKind.CLIENT, attributes=attrs
    ) as span:
        yield span


def capture_chat_content(span: Span, request: Any, resp: Any) -> None:
    """Opt-in (HANGO_CAPTURE_CONTENT=true): the newest input message and the output.

    Only the newest input message, not the whole history: the history is already
    on earlier chat spans, and resending it on every span would make a turn's
    cost grow with the length of the run."""
    if request.messages:
        span.set_attribute("gen_ai.input.messages", json.dumps([request.messages[-1].to_dict()]))
    span.set_attribute("gen_ai.output.messages", json.dumps([resp.message.to_dict()]))
    if request.system:
        span.set_attribute(
            "gen_ai.system_instructions", json.dumps([b.to_dict() for b in request.system])
        )


def end_chat_span(span: Span, request: Any, resp: Any, provider_name: str, started: float) -> None:
    span.set_attribute("gen_ai.response.id", resp.id)
    span.set_attribute("gen_ai.response.model", resp.model or request.model)
    span.set_attribute("gen_ai.response.finish_reasons", [str(resp.stop_reason)])
    set_usage(span, resp.usage)
    if resp.time_to_first_chunk_s is not None:
        span.set_attribute("gen_ai.response.time_to_first_chunk", resp.time_to_first_chunk_s)
    duration, tokens_in, tokens_out = _chat_series(provider_name, request.model)
    duration.observe(time.perf_counter() - started)
    u = resp.usage
    tokens_in.observe(input_tokens(u))
    tokens_out.observe(u.output_tokens)
    for series, n in zip(
        _TOKEN_SERIES,
        (u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens),
        strict=True,
    ):
        if n:  # adding 0 changes nothing (the series exist from the start)
            series.inc(n)
    if u.thinking_tokens:
        _THINKING.inc(u.thinking_tokens)
    if u.server_tool_use or u.service_tier is not None:
        _units(request.model, u)


def _units(model: str, u: Any) -> None:
    """A response's server-tool units and service tier, in their counters."""
    for unit, n in (u.server_tool_use or {}).items():
        if n:
            metrics.child(metrics.SERVER_TOOL_UNITS, model, unit).inc(n)
    if u.service_tier is not None:
        metrics.child(metrics.MODEL_RESPONSES_BY_TIER, model, u.service_tier).inc()


_TOKEN_SERIES = tuple(
    metrics.child(metrics.MODEL_TOKENS, kind)
    for kind in ("input", "output", "cache_read", "cache_creation")
)
_THINKING = metrics.child(metrics.MODEL_TOKENS, "thinking")  # a part of "output"
_chat_children: dict[tuple[str, str], tuple[Any, Any, Any]] = {}


def _chat_series(provider_name: str, model: str) -> tuple[Any, Any, Any]:
    """The chat call's duration and token histograms for (provider, model), looked up once."""
    key = (provider_name, model)
    found = _chat_children.get(key)
    if found is None:
        labels = ("chat", provider_name, model)
        found = _chat_children[key] = (
            metrics.child(metrics.GENAI_DURATION, *labels, ""),
            metrics.child(metrics.GENAI_TOKENS, *labels, "input"),
            metrics.child(metrics.GENAI_TOKENS, *labels, "output"),
        )
    return found


def end_chat_span_error(
    span: Span, request: Any, provider_name: str, err: Any, started: float
) -> None:
    mark_error(span, str(err.type), str(err.message))
    etype = metrics.error_type_label(err.type)
    metrics.GENAI_DURATION.labels("chat", provider_name, request.model, etype).observe(
        time.perf_counter() - started
    )


def record_retry(err: Any, attempt: int, delay: float) -> None:
    current_turn_span().add_event(
        "model.retried",
        {"error.type": str(err.type), "hango.retry.attempt": attempt, "hango.retry.delay_s": delay},
    )
    metrics.MODEL_RETRIES.labels(metrics.error_type_label(err.type)).inc()


def record_rate_wait(key: str, waited_s: float) -> None:
    """A model call waited `waited_s` for the fleet-wide rate limit on `key`."""
    metrics.RATE_LIMIT_WAIT.labels(key).observe(waited_s)
    get_current_span().add_event(
        "hango.rate_limit.wait",
        {"hango.rate_limit.key": key, "hango.rate_limit.wait_s": round(waited_s, 3)},
    )


def record_model_failure(err: Any) -> None:
    """A model call failed for good (not retryable, or out of retries)."""
    metrics.MODEL_FAILURES.labels(metrics.error_type_label(err.type)).inc()


def record_limit(limit: str, then: str) -> None:
    """A run reached a limit; `then` is what follows: "answer" (wind-up) or "fail"."""
    metrics.RUN_LIMITS.labels(limit, then).inc()


@contextmanager
def tool_span(call: Any, tool: Any, capture_content: bool) -> Iterator[Span]:
    attrs: dict[str, Any] = {
        OP: "execute_tool",
        "gen_ai.tool.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "gen_ai.tool.type": "function",
    }
    if tool is not None and tool.description:
        attrs["gen_ai.tool.description"] = tool.description[:200]
    if capture_content:
        attrs["gen_ai.tool.call.arguments"] = json.dumps(call.input)
    with (
        tracer().start_as_current_span(
            f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attrs
        ) as span,
        tool_call_scope(span),
    ):
        yield span


def end_tool_span(span: Span, name: str, result: Any, capture_content: bool) -> None:
    """Outcome `denied` when a middleware refused the call by policy (expected, so the
    span status stays unset), else the result's own outcome (`vocab.ToolOutcome`); an
    error result marks the span as an error."""
    if capture_content:
        span.set_attribute("gen_ai.tool.call.result", result.content)
    note = current_tool_call()
    if note is not None and note.denied_by is not None:
        outcome = "denied"
    else:
        if result.is_error:
            mark_error(span, "tool_error")
        outcome = getattr(result, "outcome_label", None) or ("error" if result.is_error else "ok")
    metrics.TOOL_CALLS.labels(name, outcome).inc()
