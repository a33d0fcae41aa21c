"""FakeAnthropic: a local server speaking the Anthropic Messages API, for offline tests.

Point the real `anthropic` SDK at it (``base_url=fake.base_url`` or
``ANTHROPIC_BASE_URL``)::

    with FakeAnthropic([{"text": "Hello!"}]) as fake:          # a thread: any event loop
        client = anthropic.AsyncAnthropic(api_key="test", base_url=fake.base_url)
        ...
        assert fake.requests[0].body["messages"][0]["role"] == "user"

    async with FakeAnthropic(script) as fake:                   # on the running loop
        ...

It listens on 127.0.0.1 (by default) and serves ``POST /v1/messages``: streaming
(SSE frames ``event: <type>\\ndata: <json>\\n\\n``, with ``ping`` frames, in
the order the API uses) and non-streaming. It accepts the key as
``x-api-key`` or ``Authorization: Bearer`` (any key, unless ``api_key=`` is
given: then another key gets a 401), and records every request it receives
(`requests`: body and headers).

**Script.** A list of turns in the scripted model's format (`ScriptedTurn`:
``text``, ``tool_calls``, ``thinking``, ``blocks``, ``stop_reason``, ``usage``,
``delay_s``, ``error``, ``stop_details``) plus ``faults``, ``chunk_delay_s`` and
``stop_sequence``. Any ``stop_reason`` the API has can be scripted (``pause_turn``,
``refusal`` with its ``stop_details``, ``model_context_window_exceeded``, …).
``usage`` is laid over the usage the fake counts, as the API's usage object:
``output_tokens_details`` (``thinking_tokens``), ``cache_creation``,
``server_tool_use``, ``service_tier``, ``speed``, ``inference_geo`` and fields
nobody knows yet; ``server_tool_use`` and ``output_tokens_details`` are sent
final in ``message_delta``, as the API does. ``blocks`` are content blocks of any
type, streamed as the API
streams them: a text block's ``citations`` as ``citations_delta`` frames, a
``server_tool_use`` input as ``input_json_delta``, every other block whole in its
``content_block_start`` (redacted_thinking, server tools' results, compaction, a
type nobody knows yet). As in the scripted model, turn N answers a request whose
history holds N assistant messages, and tool_use ids are
``toolu_s{N:04d}_{j}``, so the same script gives the same transcript through
either model. ``"stop_reason": "max_tokens"`` on a turn that ends with a
tool call cuts that call's JSON arguments in half, as a real cut-off does. A
request past the end of the script gets a 400 saying so. Instead of a list,
``handler=`` takes a function of the `RecordedRequest` (sync or async)
returning a turn or a fault (dicts work).

**Faults.** ``{"fault": K, "times": 1, "retry_after": s, "message": m}``
where K is ``"429"`` (rate_limit_error, with ``retry-after``, default 1 s),
``"529"`` (overloaded_error), ``"500"`` (api_error), any other HTTP error
status (``"400"``, ``"401"``, ``"403"``, ``"404"``, ``"413"``, …),
``"drop"`` (the connection is closed without a response),
``"midstream_overloaded"`` (the stream starts, then an ``error`` event with
``overloaded_error``), ``"midstream_drop"`` (the stream starts, then the
connection is cut) or ``"midstream_garbage"`` (the stream starts, then a frame
whose data is not JSON: ``message``, default ``{not json``). A status fault's
``request_id`` replaces the generated ``request-id`` header and body field;
``{api_key}`` in it becomes the key the client presented (an endpoint that
echoes credentials). A turn's ``"inputs_in_start": true`` sends each tool
call's input whole in ``content_block_start`` instead of as
``input_json_delta`` frames; a tool call's ``input`` may be any JSON value.
Faults are served to the first attempts of a turn: give
them in the turn (``"faults": [...]``) or as entries of their own just before
it in the list. ``fake.inject(...)`` queues faults for the next requests,
whatever the turn. Slow streams: ``chunk_delay_s`` (per turn or for the whole
server) sleeps before every SSE frame.

**Round trips.** Every assistant message the fake returns is remembered, and a
request that sends one back changed in any way (a block dropped, reordered or
edited; `cache_control` aside) gets a 400 naming the first difference; with
``thinking`` on, a tool loop whose assistant message does not start with its
thinking gets the API's 400 (`roundtrip.py`). ``fake.hold_after_first_delta()``
holds the next stream after its first content delta until the event it returns
is set: a stream provably still going while the client reads it.

**Validation,** with the real API's messages: empty ``messages``; a
``tool_use`` not answered by ``tool_result`` blocks first in the next user
message; a ``tool_result`` with no ``tool_use`` in the previous message;
images and documents as the API checks them (media types, base64, the bytes matching
the media type, 5 MB per image, 100 images, 100 PDF pages: `media.py`);
more than 4 ``cache_control`` blocks; a ``"ttl": "1h"`` breakpoint after a
5 min one; missing ``model``/``max_tokens``/``anthropic-version``. Each gives
a 400 ``invalid_request_error``.

**Files API** (`files.py`): ``POST /v1/files`` (the SDK's multipart upload),
``GET`` and ``DELETE /v1/files/{id}``; a ``file`` source in a message (the request
must carry the ``files-api-2025-04-14`` beta) is checked as the bytes uploaded to it,
like an inline one. ``fake.files`` holds the uploads (``uploads`` counts them);
``fake.files.forget(id)`` drops a file as if the API had lost it, and a message naming
it gets the API's 404 ``not_found_error``.

**Platforms** (`platforms.py`): the Vertex AI route (``POST [/v1]/projects/{project}/
locations/{region}/publishers/anthropic/models/{model}:rawPredict`` and
``:streamRawPredict``) and the Bedrock runtime's (``POST /model/{id}/invoke`` and
``/model/{id}/invoke-with-response-stream``, in AWS event-stream framing: each SSE
event's JSON base64'd in a ``chunk`` event). The body is the Messages API's without
``model`` (taken from the path) and with ``anthropic_version``; the request needs a
Bearer token or (Bedrock) a SigV4 signature, any value. The SDK's own
``AsyncAnthropicVertex`` (``access_token="dummy"``, ``base_url=fake.base_url + "/v1"``)
and ``AsyncAnthropicBedrock`` (dummy ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
``base_url=fake.base_url``) run against it; ``RecordedRequest.platform`` says which
route a request came by.

**Structured outputs** (`structured.py`, docs/structured-output.md):
``output_config.format`` must be ``{"type": "json_schema", "schema": ...}`` with a
valid JSON Schema, and is refused for a model known not to have structured outputs;
a forced ``tool_choice`` (``any``, ``tool``) is refused with thinking on. A turn's
``"output": VALUE`` is sent as its text, compact JSON.

**Context window and token counting.** Tokens are counted deterministically
(`tokens.count_tokens`): ``ceil(chars / 4)`` per tool definition, system block
and message content block (a block's text; a tool_use's name plus compact JSON
input; canonical JSON for anything else), plus 4 per tool definition and 4 per
message. A request counting more than its model's window
(``context_window=``, default 200 000, or ``context_windows={model: n}``)
gets the API's 400 ``invalid_request_error`` "prompt is too long: N tokens > M
maximum". ``POST /v1/messages/count_tokens`` (the SDK's
``messages.count_tokens``) answers ``{"input_tokens": N}`` with the same
count, and a response's ``input_tokens + cache_read_input_tokens +
cache_creation_input_tokens`` adds up to it. Each `RecordedRequest` keeps its
count in ``input_tokens``.

**Prompt cache,** reported truthfully: the prefix (tools, then system, then
messages, per model) up to each ``cache_control`` breakpoint is hashed; a
prefix seen before (looking back up to 20 blocks from each breakpoint, within
its TTL: 5 min, or 1 h with ``"ttl": "1h"``) is read
(``cache_read_input_tokens``), the rest up to the last breakpoint is written
(``cache_creation_input_tokens``; ``cache_creation`` splits it by the TTL of
the breakpoint ending each written span), in the tokens counted above;
prefixes shorter than ``min_cacheable_tokens`` (default 1024, like the real
models) are not cached.

**Rate limits.** ``rate_limit=FakeRateLimit(requests_per_minute=N,
input_tokens_per_minute=M, window_s=60)``: a token bucket like the API's (refilled
continuously, holding at most ``N * window_s / 60``); a request it cannot take gets
the API's 429 ``rate_limit_error`` with ``retry-after`` and the
``anthropic-ratelimit-*`` headers, which successful answers carry too. It counts
what it accepted (``accepted``, ``max_in_window()``) and refused (``refused``).

**CLI.** ``python -m hango_worker.testing.fake_anthropic --port P --script FILE
[--context-window N]`` (no console script: the image leaves this package out; not a
subcommand of the production CLI) serves a script file until SIGINT/SIGTERM:
`serve_forever(port, script_path)` (blocking, its own loop) or
`serve_script(...)` (a coroutine, on the running loop); `main(argv)` is the
whole command.

**Modules:** `ratelimit`, `script` (turns, faults, `RecordedRequest`), `validate`,
`media`, `files`, `platforms`,
`tokens`, `cache`, `sse` (answers and their SSE frames), `wire` (HTTP/1.1), `server`
(`FakeAnthropic`), `cli`. Everything is re-exported here.

**Layering.** Part of `testing`. May import: `hango_worker`, `agent`, `client`,
`config`, `console`, `provider`, `render`, `run`, `store`, `telemetry`, `tool`,
`vocab`, `watch`. Never imports `cli`, `demo` or `service`; production code never
imports it (import-linter contracts in `.importlinter`, `make lint`).
"""

from hango_worker.provider.scripted import ScriptError
from hango_worker.testing.fake_anthropic.cache import (
    CACHE_LOOKBACK_BLOCKS,
    DEFAULT_MIN_CACHEABLE_TOKENS,
    CacheUsage,
    PromptCache,
)
from hango_worker.testing.fake_anthropic.cli import main, serve_forever, serve_script
from hango_worker.testing.fake_anthropic.files import FILES_PATH, FakeFile, FakeFiles
from hango_worker.testing.fake_anthropic.platforms import (
    BEDROCK_ROUTE,
    VERTEX_ROUTE,
    bedrock_frame,
    event_message,
)
from hango_worker.testing.fake_anthropic.ratelimit import FakeRateLimit
from hango_worker.testing.fake_anthropic.script import (
    STATUS_BY_TYPE,
    TYPE_BY_STATUS,
    FakeTurn,
    Fault,
    RecordedRequest,
    load_fake_script,
    parse_fake_script,
)
from hango_worker.testing.fake_anthropic.server import (
    COUNT_TOKENS_PATH,
    DEFAULT_CONTEXT_WINDOW,
    MESSAGES_PATH,
    FakeAnthropic,
    Handler,
)
from hango_worker.testing.fake_anthropic.sse import build_answer, stream_frames
from hango_worker.testing.fake_anthropic.tokens import (
    MESSAGE_OVERHEAD_TOKENS,
    TOOL_OVERHEAD_TOKENS,
    count_tokens,
)
from hango_worker.testing.fake_anthropic.validate import (
    MAX_CACHE_BREAKPOINTS,
    ApiError,
    check_tool_pairing,
    validate_request,
)

__all__ = [
    "BEDROCK_ROUTE",
    "CACHE_LOOKBACK_BLOCKS",
    "COUNT_TOKENS_PATH",
    "DEFAULT_CONTEXT_WINDOW",
    "DEFAULT_MIN_CACHEABLE_TOKENS",
    "FILES_PATH",
    "MAX_CACHE_BREAKPOINTS",
    "MESSAGES_PATH",
    "MESSAGE_OVERHEAD_TOKENS",
    "STATUS_BY_TYPE",
    "TOOL_OVERHEAD_TOKENS",
    "TYPE_BY_STATUS",
    "VERTEX_ROUTE",
    "ApiError",
    "CacheUsage",
    "FakeAnthropic",
    "FakeFile",
    "FakeFiles",
    "FakeRateLimit",
    "FakeTurn",
    "Fault",
    "Handler",
    "PromptCache",
    "RecordedRequest",
    "ScriptError",
    "bedrock_frame",
    "build_answer",
    "check_tool_pairing",
    "count_tokens",
    "event_message",
    "load_fake_script",
    "main",
    "parse_fake_script",
    "serve_forever",
    "serve_script",
    "stream_frames",
    "validate_request",
]
