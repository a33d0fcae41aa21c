"""AnthropicProvider: Claude through the official `anthropic` SDK (2.x), streaming.

One `complete()` is one `messages.create(stream=True)` call. The raw stream
events are folded into our types as they arrive (provider/accumulate.py): every
content block whole, as the API returned it (text with its citations, tool_use
with its partial JSON, thinking with its signature, and every other type kept
as it came; each text delta is handed to `on_text`), every stop reason, usage
including the cache counters, the response id and model, and the time to the
first streamed chunk. A call cut off by `max_tokens` mid-arguments comes back
with `complete=False` and `input={}`; it must not be executed.

Errors become `ModelError`:

- the SDK itself retries 408/409/429/>=500 and connection errors
  (`max_retries`, default 2, honouring `retry-after`; each of those retries is counted
  in `hango_model_sdk_retries_total` by provider/sdk_retries.py on a client built
  here, not on a client passed in); what is left after that
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

A request of an agent with `files_api: true` (`Request.files`) sends its stored images
and documents as Files API files (provider/files.py): uploaded once, the id kept; a call
the API refuses naming a file it no longer has is answered by uploading it again and
calling once more.

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
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import anthropic
import httpx2
from anthropic.types import RawMessageStreamEvent

from hango_worker.provider import sdk_retries
from hango_worker.provider.accumulate import Accumulator
from hango_worker.provider.files import (
    FileUploads,
    StoredBlob,
    stored_blobs,
    vanished,
    with_file_ids,
)
from hango_worker.provider.params import uses_beta
from hango_worker.provider.platforms import PROVIDER_NAMES, AnyClient, Target, build_client
from hango_worker.provider.sanitize import clean_text
from hango_worker.provider.types import (
    Block,
    FileIds,
    Message,
    ModelError,
    Request,
    Response,
    TextSink,
    ToolResultBlock,
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
        client: AnyClient | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int = 2,
        open_telemetry: bool = False,
        require_key: bool = True,
        platform_options: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Without `client`, build one from `api_key`/`base_url` (else the SDK's
        `ANTHROPIC_API_KEY`/`ANTHROPIC_BASE_URL`). Raises MissingCredentialsError
        when no credential is found (unless `require_key=False`: a fleet on Bedrock or
        Vertex), so a misconfigured worker stops at start-up. `platform_options`: extra
        arguments of each platform's SDK client (provider/platforms.py)."""
        if client is None:
            client = _build_client(api_key, base_url, max_retries, open_telemetry, require_key)
        elif not open_telemetry and client.open_telemetry["traces"]["enabled"]:
            client = client.with_options(open_telemetry=False)
        self.client = client
        secrets = (getattr(client, "api_key", None), getattr(client, "auth_token", None))
        self._secrets = tuple(s for s in secrets if isinstance(s, str) and s)
        self._uploads: FileUploads | None = None  # made at the first files_api call
        self._max_retries, self._open_telemetry = max_retries, open_telemetry
        self._platform_options = dict(platform_options or {})
        self._platforms: dict[Target, AnthropicProvider] = {}

    def on_platform(self, target: Target) -> AnthropicProvider:
        """This provider on another platform: its client built once per platform, region
        and project (provider/platforms.py), named for the spans (`gen_ai.provider.name`)."""
        if target.platform == "anthropic":
            return self
        found = self._platforms.get(target)
        if found is None:
            client = build_client(
                target,
                max_retries=self._max_retries,
                open_telemetry=self._open_telemetry,
                options=self._platform_options.get(target.platform, {}),
            )
            found = AnthropicProvider(
                client, max_retries=self._max_retries, open_telemetry=self._open_telemetry
            )
            found.name = PROVIDER_NAMES[target.platform]
            found.label = f"Claude on {target.platform}"
            self._platforms[target] = found
        return found

    async def aclose(self) -> None:
        """Close the SDK clients' connection pools."""
        for other in self._platforms.values():
            await other.aclose()
        await self.client.close()

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        try:
            if request.files is not None:
                return await self._complete_with_files(request, request.files, on_text)
            return await self._complete(request, on_text)
        except ModelError as e:  # every string of it is stored: no key, no NUL, bounded
            raise e.redacted(self._scrub) from None

    async def _complete_with_files(
        self, request: Request, files: FileIds, on_text: TextSink | None
    ) -> Response:
        """Stored blocks sent as Files API files (provider/files.py); a call refused
        because the API no longer has a file sent uploads it again and is made once more."""
        blobs = stored_blobs(request.messages)
        if not blobs:
            return await self._complete(replace(request, files=None), on_text)
        if self._uploads is None:
            if not isinstance(self.client, anthropic.AsyncAnthropic):
                raise ModelError(
                    ErrorType.INVALID_REQUEST_ERROR,
                    f"the Files API is not available on {self.name}",
                    retryable=False,
                )
            self._uploads = FileUploads(self.client)
        ids = await self._resolve(files, blobs, None)
        try:
            return await self._complete(with_file_ids(request, ids), on_text)
        except ModelError as e:
            gone = vanished(e, ids)
            if not gone:
                raise
        ids = await self._resolve(files, blobs, gone)
        return await self._complete(with_file_ids(request, ids), on_text)

    async def _resolve(
        self, files: FileIds, blobs: dict[str, StoredBlob], gone: set[str] | None
    ) -> dict[str, str]:
        assert self._uploads is not None
        try:
            return await self._uploads.resolve(files, blobs, gone)
        except anthropic.APIStatusError as e:
            raise status_error(e, self._secrets) from None
        except anthropic.APIConnectionError as e:
            raise connection_error(e, self._secrets) from None

    def _scrub(self, text: str) -> str:
        return clean_text(redact(text, self._secrets))[0][:MAX_ERROR_STRING]

    async def _complete(self, request: Request, on_text: TextSink | None) -> Response:
        started = time.perf_counter()
        acc = Accumulator(on_text)
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
        beta = bool(request.params) and uses_beta(request.params or {})
        client: Any = self.client
        create: Any = client.beta.messages.create if beta else client.messages.create
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
    api_key: str | None,
    base_url: str | None,
    max_retries: int,
    open_telemetry: bool,
    require_key: bool = True,
) -> anthropic.AsyncAnthropic:
    # the SDK's defaults (timeouts, limits), plus hooks that count its own retries
    http = anthropic.DefaultAsyncHttpxClient(event_hooks=sdk_retries.event_hooks())
    try:
        if open_telemetry:
            client = anthropic.AsyncAnthropic(
                api_key=api_key, base_url=base_url, max_retries=max_retries, http_client=http
            )
        else:
            client = anthropic.AsyncAnthropic(
                api_key=api_key,
                base_url=base_url,
                max_retries=max_retries,
                open_telemetry=False,
                http_client=http,
            )
    except anthropic.CredentialsError as e:  # a configured but broken SDK profile
        raise MissingCredentialsError(
            f"the anthropic SDK found no usable credentials: {e}"
        ) from None
    if (
        require_key
        and client.api_key is None
        and client.auth_token is None
        and client.credentials is None
    ):
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
    if request.tools or request.server_tools:
        params["tools"] = [t.to_dict() for t in request.tools] + (request.server_tools or [])
    if request.tool_choice:
        params["tool_choice"] = request.tool_choice
    if request.thinking:
        params["thinking"] = request.thinking
    if request.temperature is not None:
        # SDK 2.x has no `temperature` argument any more; the API field is sent as is.
        params["extra_body"] = {"temperature": request.temperature}
    if request.params:  # the agent's API parameters (provider/params.py), disjoint from ours
        params.update(request.params)
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
    stream: anthropic.AsyncStream[RawMessageStreamEvent], acc: Accumulator, started: float
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
