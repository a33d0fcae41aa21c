"""The anthropic SDK's own retries, counted: `hango_model_sdk_retries_total{error_type}`.

Inside one `messages.create` the SDK retries 408/409/429/>=500 and connection failures by
itself (`max_retries`, HANGO_ANTHROPIC_MAX_RETRIES, default 2) before hango's loop sees an
error, so `hango_model_retries_total` (the loop's retries) never counts them. Every retry
goes out with the header `x-stainless-retry-count: N` (N >= 1): a request hook on the
HTTP client the provider builds counts those, labelled with the error type of the attempt
before it, which a response hook keeps in a context variable (the SDK's retry loop runs
in the caller's task). A retry also adds the span event `model.sdk_retried` to the
current span. Cost: one header lookup per HTTP request and one comparison per response.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import httpx2
from opentelemetry.trace import get_current_span

from hango_worker.telemetry import metrics
from hango_worker.vocab import ErrorType

RETRY_HEADER = "x-stainless-retry-count"
_NO_RESPONSE = str(ErrorType.API_CONNECTION_ERROR)  # an attempt that got no answer
_last_error: ContextVar[str] = ContextVar("hango_sdk_previous_attempt", default=_NO_RESPONSE)


def error_type_of(status: int) -> str:
    """The error type a retryable HTTP status stands for (the API's own names)."""
    if status == 429:
        return str(ErrorType.RATE_LIMIT_ERROR)
    if status == 529:
        return str(ErrorType.OVERLOADED_ERROR)
    if status == 408:
        return str(ErrorType.API_TIMEOUT_ERROR)
    return str(ErrorType.API_ERROR)


async def _on_request(request: httpx2.Request) -> None:
    retry = request.headers.get(RETRY_HEADER)
    if retry is not None and retry != "0":
        etype = _last_error.get()
        metrics.child(metrics.MODEL_SDK_RETRIES, etype).inc()
        span = get_current_span()
        if span.is_recording():
            span.add_event("model.sdk_retried", {"error.type": etype, "hango.retry.attempt": retry})
    _last_error.set(_NO_RESPONSE)


async def _on_response(response: httpx2.Response) -> None:
    status = response.status_code
    if status >= 500 or status in (408, 409, 429):
        _last_error.set(error_type_of(status))


def event_hooks() -> dict[str, list[Any]]:
    """httpx event hooks for the SDK's HTTP client (`DefaultAsyncHttpxClient(event_hooks=…)`)."""
    return {"request": [_on_request], "response": [_on_response]}
