"""AnthropicProvider: Claude through the official `anthropic` SDK (2.x), streaming.

One `complete()` is one `messages.create(stream=True)` call. The raw stream
events are folded into our types as they arrive: text (each text delta is
handed to `on_text`, and nothing else is done per delta), tool_use with its
partial JSON (a call cut off by `max_tokens` mid-arguments comes back with
`complete=False` and `input={}`; it must not be executed), thinking blocks
with their signature, every stop reason, usage including the cache counters,
the response id and model, and the time to the first streamed chunk.

Errors become `ModelError`:

- the SDK itself retries 408/409/429/>=500 and connection errors
  (`max_retries`, default 2, honouring `retry-after`); what is left after that
  is `retryable=True` (with `retry_after_s` from `retry-after-ms`/`retry-after`
  when the server sent one), so the agent loop backs off and tries again;
- an `error` event in the middle of a stream (e.g. `overloaded_error`) reaches
  us as an `APIStatusError` with status 200, which the SDK never retries: it is
  `retryable=True` unless its type says the request itself is bad;
- a dropped connection mid-stream is `retryable=True` (`api_connection_error`);
- 400/401/403/404/413 (and other 4xx) are `retryable=False` and carry
  `{type, message, request_id}` from the API's error body;
- an SSE frame whose data is not JSON, or an event of an unexpected shape, is
  `malformed_stream`, `retryable=True` (most likely a glitch between us and
  the API; a model call has no side effects, and the loop's retries are bounded).

The API key never appears in an error: messages are built from the error body
only, every string of a ModelError (type, message, request_id) has the
client's credentials and anything shaped like an Anthropic key replaced by
`[redacted]` and is cut to 2,000 characters, and the SDK exception is not
chained (`raise ... from None`).

Output that cannot be stored is made storable by one rule (`sanitize.py`): NUL
and lone surrogates become U+FFFD. Tool arguments that are not a JSON object
(or not JSON) give a call with `input={}` and `input_error` set, which the loop
answers with an error result instead of executing it.

OpenTelemetry: the SDK emits its own CLIENT span `anthropic.messages.create`
per call (and injects `traceparent`). hango_worker's loop already emits the
GenAI `chat` span, so by default (`open_telemetry=False`) this provider turns
the SDK's span off: a client it builds gets `open_telemetry=False`, a client
passed in whose spans are on is replaced by `client.with_options(
open_telemetry=False)`. With `open_telemetry=True` the SDK's span is kept: a
client built here then follows the SDK's defaults and its environment
variables (`ANTHROPIC_OPEN_TELEMETRY=false` still turns it off), and a client
passed in is used as it is.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import anthropic
import httpx2
from anthropic.types import (
    InputJSONDelta,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawContentBlockStopEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStreamEvent,
    SignatureDelta,
    TextDelta,
    ThinkingDelta,
)

from hango_worker.provider.sanitize import clean_message, clean_text, record_sanitized
from hango_worker.provider.types import (
    Block,
    Message,
    ModelError,
    Request,
    Response,
    StopReason,
    TextBlock,
    TextSink,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
    tool_input,
)
from hango_worker.vocab import FATAL_MODEL_ERROR_TYPES, ErrorType

FATAL_ERROR_TYPES = FATAL_MODEL_ERROR_TYPES  # vocab.py: retrying cannot help
_TYPE_BY_STATUS = {
    400: ErrorType.INVALID_REQUEST_ERROR,
    401: ErrorType.AUTHENTICATION_ERROR,
    403: ErrorType.PERMISSION_ERROR,
    404: ErrorType.NOT_FOUND_ERROR,
    413: ErrorType.REQUEST_TOO_LARGE,
    429: ErrorType.RATE_LIMIT_ERROR,
    529: ErrorType.OVERLOADED_ERROR,
}
_STOP_REASONS = {s.value: s for s in StopReason}
REDACTED = "[redacted]"
# Anthropic API keys, wherever they turn up (e.g. a proxy echoing one in a header).
_KEY_PATTERN = re.compile(r"sk-ant-[A-Za-z0-9_\-]{8,}")
MAX_ERROR_STRING = 2000  # characters kept of each string stored from a provider error
MALFORMED_STREAM = ErrorType.MALFORMED_STREAM


class MissingCredentialsError(ValueError):
    """No API key (or other Anthropic credential) could be found."""


class AnthropicProvider:
    """Claude via `anthropic.AsyncAnthropic`, streaming. See the module docstring."""

    name = "anthropic"
    label = "Claude (Anthropic Messages API)"

    def __init__(
        self,
        client: anthropic.AsyncAnthropic | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        open_telemetry: bool = False,
    ) -> None:
        """Without `client`, build one from `api_key`/`base_url` (else the SDK's
        `ANTHROPIC_API_KEY`/`ANTHROPIC_BASE_URL`). Raises MissingCredentialsError
        when no credential is found, so a misconfigured worker stops at start-up."""
        if client is None:
            client = _build_client(api_key, base_url, max_retries, open_telemetry)
        elif not open_telemetry and client.open_telemetry["traces"]["enabled"]:
            client = client.with_options(open_telemetry=False)
        self.client = client
        self._secrets = tuple(s for s in (client.api_key, client.auth_token) if s)

    async def aclose(self) -> None:
        """Close the SDK client's connection pool."""
        await self.client.close()

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        try:
            return await self._complete(request, on_text)
        except ModelError as e:  # every string of it is stored: no key, no NUL, bounded
            raise e.redacted(self._scrub) from None

    def _scrub(self, text: str) -> str:
        return clean_text(redact(text, self._secrets))[0][:MAX_ERROR_STRING]

    async def _complete(self, request: Request, on_text: TextSink | None) -> Response:
        started = time.perf_counter()
        acc = _Accumulator(on_text)
        try:
            stream = await self._create(request)
            limits = rate_limit_headers(stream.response.headers)
            async with stream:
                await _consume(stream, acc, started)
        except anthropic.APIStatusError as e:
            raise status_error(e, self._secrets) from None
        except anthropic.APIConnectionError as e:
            raise connection_error(e, self._secrets) from None
        except httpx2.TransportError as e:
            msg = f"the connection failed mid-stream ({type(e).__name__}: {e})"
            raise ModelError(
                ErrorType.API_CONNECTION_ERROR, redact(msg, self._secrets), retryable=True
            ) from None
        except json.JSONDecodeError as e:  # an SSE frame whose data is not JSON
            raise ModelError(
                MALFORMED_STREAM,
                f"the API sent a stream frame that is not JSON ({e.msg} at character {e.pos})",
                retryable=True,
            ) from None
        except anthropic.AnthropicError as e:  # credentials, response validation, …
            auth = isinstance(e, anthropic.CredentialsError)
            etype = ErrorType.AUTHENTICATION_ERROR if auth else ErrorType.API_ERROR
            msg = f"{type(e).__name__}: {e}"
            raise ModelError(etype, redact(msg, self._secrets), retryable=False) from None
        resp = acc.response(request.model)
        resp.rate_limit_headers = limits or None
        return resp

    async def _create(self, request: Request) -> anthropic.AsyncStream[RawMessageStreamEvent]:
        # Called untyped: the SDK's overloads over TypedDict params cost mypy more than
        # they check here (our dicts come from to_dict()).
        create: Any = self.client.messages.create
        try:
            stream: anthropic.AsyncStream[RawMessageStreamEvent] = await create(
                **request_params(request), stream=True
            )
            return stream
        except TypeError as e:
            if "authentication" not in str(e):
                raise
            raise ModelError(
                ErrorType.AUTHENTICATION_ERROR,
                "no Anthropic credentials: set ANTHROPIC_API_KEY",
                retryable=False,
            ) from None


def _build_client(
    api_key: str | None, base_url: str | None, max_retries: int, open_telemetry: bool
) -> anthropic.AsyncAnthropic:
    try:
        if open_telemetry:
            client = anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, max_retries=max_retries
            )
        else:
            client = anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, max_retries=max_retries, open_telemetry=False
            )
    except anthropic.CredentialsError as e:  # a configured but broken SDK profile
        raise MissingCredentialsError(
            f"the anthropic SDK found no usable credentials: {e}"
        ) from None
    if client.api_key is None and client.auth_token is None and client.credentials is None:
        raise MissingCredentialsError(
            "the anthropic provider needs an API key: set ANTHROPIC_API_KEY "
            "(or choose the scripted model for an offline demo)"
        )
    return client


def request_params(request: Request) -> dict[str, Any]:
    """The Messages API parameters for our Request (without `stream`)."""
    params: dict[str, Any] = {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "messages": message_dicts(request.messages),
    }
    if request.system:
        params["system"] = [b.to_dict() for b in request.system]
    if request.tools:
        params["tools"] = [t.to_dict() for t in request.tools]
    if request.tool_choice:
        params["tool_choice"] = request.tool_choice
    if request.thinking:
        params["thinking"] = request.thinking
    if request.temperature is not None:
        # SDK 2.x has no `temperature` argument any more; the API field is sent as is.
        params["extra_body"] = {"temperature": request.temperature}
    return params


def message_dicts(messages: list[Message]) -> list[dict[str, Any]]:
    """The API shape of the history; in user messages tool_result blocks come first,
    as the API requires (a stable move, only when something else precedes one)."""
    out = []
    for m in messages:
        d = m.to_dict()
        if m.role == "user" and _results_not_first(m.content):
            results = [b for b in d["content"] if b["type"] == "tool_result"]
            others = [b for b in d["content"] if b["type"] != "tool_result"]
            d["content"] = results + others
        out.append(d)
    return out


def _results_not_first(content: list[Block]) -> bool:
    seen_other = False
    for b in content:
        if isinstance(b, ToolResultBlock):
            if seen_other:
                return True
        else:
            seen_other = True
    return False


async def _consume(
    stream: anthropic.AsyncStream[RawMessageStreamEvent], acc: _Accumulator, started: float
) -> None:
    async for event in stream:
        if acc.first_chunk_s is None:
            acc.first_chunk_s = time.perf_counter() - started
        try:
            acc.feed(event)
        except (AttributeError, TypeError, KeyError, ValueError) as e:
            kind = getattr(event, "type", type(event).__name__)
            raise ModelError(
                MALFORMED_STREAM,
                f"the API sent a {str(kind)[:40]!r} event of an unexpected shape "
                f"({type(e).__name__})",
                retryable=True,
            ) from None


class _Accumulator:
    """Folds raw stream events into a Response. `feed` is the per-event hot path."""

    __slots__ = ("_blocks", "_parts", "_usage", "first_chunk_s", "id", "model", "on_text", "stop")

    def __init__(self, on_text: TextSink | None) -> None:
        self.on_text = on_text
        self._blocks: dict[int, Block] = {}
        self._parts: dict[int, list[str]] = {}
        self._usage = Usage()
        self.stop: str | None = None
        self.id = ""
        self.model = ""
        self.first_chunk_s: float | None = None

    def feed(self, event: RawMessageStreamEvent) -> None:
        if isinstance(event, RawContentBlockDeltaEvent):
            delta = event.delta
            parts = self._parts.get(event.index)
            if parts is None:
                return  # a block we do not keep (server tools, redacted thinking)
            if isinstance(delta, TextDelta):
                parts.append(delta.text)
                if self.on_text is not None:
                    self.on_text(delta.text)
            elif isinstance(delta, InputJSONDelta):
                parts.append(delta.partial_json)
            elif isinstance(delta, ThinkingDelta):
                parts.append(delta.thinking)
            elif isinstance(delta, SignatureDelta):
                block = self._blocks.get(event.index)
                if isinstance(block, ThinkingBlock):
                    block.signature += delta.signature
        elif isinstance(event, RawContentBlockStartEvent):
            self._start(event)
        elif isinstance(event, RawContentBlockStopEvent):
            self._finish(event.index)
        elif isinstance(event, RawMessageStartEvent):
            self._message_start(event)
        elif isinstance(event, RawMessageDeltaEvent):
            self._message_delta(event)

    def _start(self, event: RawContentBlockStartEvent) -> None:
        cb = event.content_block
        block: Block
        if cb.type == "text":
            block = TextBlock(text=cb.text)
        elif cb.type == "thinking":
            block = ThinkingBlock(thinking=cb.thinking, signature=cb.signature)
        elif cb.type == "tool_use":
            args, problem = tool_input({} if cb.input is None else cb.input)
            block = ToolUseBlock(id=cb.id, name=cb.name, input=args, input_error=problem)
        else:
            return  # server-tool and redacted blocks have no counterpart in our types
        self._blocks[event.index] = block
        self._parts[event.index] = []

    def _finish(self, index: int) -> None:
        block = self._blocks.get(index)
        parts = self._parts.pop(index, None)
        if block is None or parts is None:
            return
        if isinstance(block, TextBlock):
            block.text += "".join(parts)
        elif isinstance(block, ThinkingBlock):
            block.thinking += "".join(parts)
        elif isinstance(block, ToolUseBlock):
            _set_tool_input(block, "".join(parts))

    def _message_start(self, event: RawMessageStartEvent) -> None:
        msg = event.message
        self.id = msg.id
        self.model = msg.model
        u = msg.usage
        self._usage = Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_read_input_tokens=u.cache_read_input_tokens or 0,
            cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
            # the 1 h part of the writes (only message_start carries the split)
            cache_creation_1h_input_tokens=(
                u.cache_creation.ephemeral_1h_input_tokens if u.cache_creation else 0
            ),
        )

    def _message_delta(self, event: RawMessageDeltaEvent) -> None:
        if event.delta.stop_reason is not None:
            self.stop = event.delta.stop_reason
        u = event.usage
        self._usage.output_tokens = u.output_tokens
        if u.input_tokens is not None:
            self._usage.input_tokens = u.input_tokens
        if u.cache_read_input_tokens is not None:
            self._usage.cache_read_input_tokens = u.cache_read_input_tokens
        if u.cache_creation_input_tokens is not None:
            self._usage.cache_creation_input_tokens = u.cache_creation_input_tokens

    def response(self, requested_model: str) -> Response:
        if self.stop is None:
            raise ModelError(
                ErrorType.API_CONNECTION_ERROR,
                "the response stream ended before the message was complete",
                retryable=True,
            )
        stop = _STOP_REASONS.get(self.stop)
        if stop is None:
            raise ModelError(
                "unsupported_stop_reason",
                f"the API stopped with {self.stop!r}, which this worker does not know",
                retryable=False,
            )
        for index in list(self._parts):  # blocks the stream never closed
            self._finish(index)
            block = self._blocks[index]
            if isinstance(block, ToolUseBlock):
                block.complete, block.input = False, {}
        message = Message(role="assistant", content=list(self._blocks.values()))
        record_sanitized("model_output", clean_message(message))
        return Response(
            message=message,
            stop_reason=stop,
            usage=self._usage,
            id=self.id,
            model=self.model or requested_model,
            time_to_first_chunk_s=self.first_chunk_s,
        )


def _set_tool_input(block: ToolUseBlock, raw: str) -> None:
    """Parse the streamed arguments. Unparseable JSON (a cut-off, or garbage) marks the
    call incomplete; JSON that is not an object is answered to the model as an error."""
    if not raw:
        return  # no argument deltas: the input sent with content_block_start stands
    try:
        value = json.loads(raw)
    except ValueError:
        block.complete, block.input = False, {}
        block.input_error = "its arguments are not valid JSON"
        return
    block.input, block.input_error = tool_input(value)


# -- errors --------------------------------------------------------------------------------


def redact(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with the client's own credentials and anything shaped like an API key
    replaced by `[redacted]`."""
    for s in secrets:
        if s and s in text:
            text = text.replace(s, REDACTED)
    return _KEY_PATTERN.sub(REDACTED, text) if "sk-ant-" in text else text


def rate_limit_headers(headers: Any) -> dict[str, str]:
    """The `anthropic-ratelimit-*` headers of a response (limits, remaining, resets)."""
    prefix = "anthropic-ratelimit-"
    return {k.lower(): v for k, v in headers.items() if k.lower().startswith(prefix)}


def retry_after_s(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `retry-after` (seconds form), if present."""
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


def _body_error(body: object) -> tuple[str | None, str | None, str | None]:
    """(type, message, request_id) from an API error body, where present."""
    if not isinstance(body, dict):
        return None, None, None
    err = body.get("error")
    err = err if isinstance(err, dict) else {}
    etype, msg, rid = err.get("type"), err.get("message"), body.get("request_id")
    return (
        etype if isinstance(etype, str) else None,
        msg if isinstance(msg, str) else None,
        rid if isinstance(rid, str) else None,
    )


def status_error(e: anthropic.APIStatusError, secrets: tuple[str, ...] = ()) -> ModelError:
    """Map an SDK status error (incl. a mid-stream `error` event, status 200) to ModelError."""
    status = e.status_code
    body_type, body_msg, body_rid = _body_error(e.body)
    etype = body_type or (str(e.type) if e.type else None) or _TYPE_BY_STATUS.get(status)
    etype = etype or (
        ErrorType.API_ERROR if status >= 500 or status == 200 else ErrorType.INVALID_REQUEST_ERROR
    )
    message = body_msg or e.api_message or f"HTTP {status} from the Anthropic API"
    if status == 200:
        retryable = etype not in FATAL_ERROR_TYPES
    else:
        retryable = status in (408, 409, 429) or status >= 500
    return ModelError(
        etype,
        redact(message, secrets),
        retryable=retryable,
        status=status,
        request_id=redact(rid, secrets) if (rid := e.request_id or body_rid) else None,
        retry_after_s=retry_after_s(e.response.headers) if retryable else None,
    )


def connection_error(e: anthropic.APIConnectionError, secrets: tuple[str, ...] = ()) -> ModelError:
    timeout = isinstance(e, anthropic.APITimeoutError)
    etype = ErrorType.API_TIMEOUT_ERROR if timeout else ErrorType.API_CONNECTION_ERROR
    return ModelError(etype, redact(e.message, secrets), retryable=True)
