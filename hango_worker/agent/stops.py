"""How a response's stop reason ends, continues or repeats a turn (agent/loop.py).

- `end_turn`, `stop_sequence`: the answer; the run succeeds.
- `tool_use`: the tool batch runs and the loop goes on.
- `pause_turn` (a long server-tool turn the API paused): the response joins the history
  and is sent back as it is, which continues it; each continuation is a turn of its own,
  so `max_turns` and every other limit count it (`model.pause_turn` span event,
  `hango_model_stops_total{stop_reason="pause_turn", then="continued"}`).
- `refusal`: the run ends `failed` with `{type: "refusal", message, stop_details}` (the
  API's category and explanation, when it gave them). It is recorded, never retried: the
  same request would be refused again (`model.refusal` span event,
  `hango_model_stops_total{stop_reason="refusal", then="failed"}`).
- `max_tokens` with the last tool call cut off: as the API documents, the same request
  is sent again, once, with twice the `max_tokens` (at most `MAX_TOKENS_RETRY_CAP`, and
  never past the output tokens the run's `max_output_tokens` budget has left); the
  cut response is dropped and its usage counted. If the retry is cut off too, or the API
  refuses the larger `max_tokens` (400), the cut response stands: its cut call is never
  executed and the model is told to send it again (agent/batch.py). `max_tokens` with no
  tool call fails the run (`max_tokens`: raise the agent's max_tokens).
- `model_context_window_exceeded`: the compaction middleware (agent/middlewares/summarize.py)
  compacts the history at once and asks again, once; a response still stopped so (or one
  of an agent without compaction) fails the run with `model_context_window_exceeded`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from hango_worker.agent.middleware import ModelRequest, ModelResponse
from hango_worker.provider.types import ModelError, StopReason, Usage
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import current_turn_span
from hango_worker.vocab import ErrorType

MAX_TOKENS_RETRY_CAP = 64_000  # the largest max_tokens a retry asks for
REFUSAL_EVENT = "model.refusal"
PAUSE_EVENT = "model.pause_turn"
CUT_EVENT = "model.tool_call_cut"
# stop reasons that end the run whatever the response holds (tool calls included)
ENDS_RUN = frozenset((StopReason.REFUSAL, StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED))


def stopped(reason: str, then: str) -> None:
    metrics.child(metrics.MODEL_STOPS, reason, then).inc()


def final_error(resp: ModelResponse) -> dict[str, Any] | None:
    """The error of a response that ends the run without an answer (None: an answer,
    or a paused turn to continue)."""
    stop = resp.stop_reason
    if stop == StopReason.MAX_TOKENS:
        msg = "the model hit max_tokens before finishing its answer; raise the agent's max_tokens"
        return {"type": ErrorType.MAX_TOKENS, "message": msg}
    if stop == StopReason.REFUSAL:
        return refusal(resp)
    if stop == StopReason.MODEL_CONTEXT_WINDOW_EXCEEDED:
        stopped(stop, "failed")
        return {
            "type": ErrorType.MODEL_CONTEXT_WINDOW_EXCEEDED,
            "message": "the model stopped: its context window is full "
            "(model_context_window_exceeded) and compaction could not make room; lower "
            "the agent's compact_trigger or compact_target, or shorten its input",
        }
    if stop == StopReason.PAUSE_TURN:
        stopped(stop, "continued")
        current_turn_span().add_event(PAUSE_EVENT, {})
    return None


def refusal(resp: ModelResponse) -> dict[str, Any]:
    """A refusal, recorded: the API's stop_details kept as they came."""
    details = resp.stop_details or {}
    category, why = details.get("category"), details.get("explanation")
    msg = "the model declined to answer (stop_reason refusal)"
    if category:
        msg += f"; category {category}"
    if why:
        msg += f": {why}"
    stopped(StopReason.REFUSAL, "failed")
    attrs = {"hango.refusal.category": str(category or "")}
    current_turn_span().add_event(REFUSAL_EVENT, attrs)
    error: dict[str, Any] = {"type": ErrorType.REFUSAL, "message": msg}
    if resp.stop_details is not None:
        error["stop_details"] = resp.stop_details
    return error


def cut_tool_call(resp: ModelResponse) -> bool:
    """A response cut off by max_tokens in the middle of a tool call."""
    if resp.stop_reason != StopReason.MAX_TOKENS:
        return False
    uses = resp.message.tool_uses()
    return bool(uses) and not uses[-1].complete


async def retry_cut_tool_call(
    req: ModelRequest,
    resp: ModelResponse,
    call: Callable[[ModelRequest], Awaitable[ModelResponse]],
    count: Callable[[Usage], None],
    room: int | None = None,
) -> ModelResponse:
    """The request of `resp` (cut off in a tool call) once more with twice the room;
    the response to keep (see the module docstring). `count` gets a dropped response's
    usage; `room`: the output tokens the run's budget has left (None: no budget), which
    the retry's max_tokens never exceeds."""
    was = req.request.max_tokens
    more = min(2 * was, MAX_TOKENS_RETRY_CAP)
    if room is not None:
        more = min(more, room)
    span = current_turn_span()
    if more <= was:
        stopped(StopReason.MAX_TOKENS, "kept")
        return resp
    try:
        again = await call(req.with_request(max_tokens=more))
    except ModelError as e:
        if e.retryable or e.type != ErrorType.INVALID_REQUEST_ERROR:
            raise
        stopped(StopReason.MAX_TOKENS, "kept")  # e.g. more than the model's limit
        span.add_event(CUT_EVENT, {"hango.max_tokens": was, "hango.retry.refused": e.message})
        return resp
    count(resp.usage)
    stopped(StopReason.MAX_TOKENS, "retried")
    span.add_event(CUT_EVENT, {"hango.max_tokens": was, "hango.retry.max_tokens": more})
    return again
