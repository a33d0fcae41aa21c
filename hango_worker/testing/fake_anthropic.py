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
``text``, ``tool_calls``, ``thinking``, ``stop_reason``, ``usage``,
``delay_s``, ``error``) plus ``faults``, ``chunk_delay_s`` and
``stop_sequence``. As in the scripted model, turn N answers a request whose
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
``overloaded_error``) or ``"midstream_drop"`` (the stream starts, then the
connection is cut). Faults are served to the first attempts of a turn: give
them in the turn (``"faults": [...]``) or as entries of their own just before
it in the list. ``fake.inject(...)`` queues faults for the next requests,
whatever the turn. Slow streams: ``chunk_delay_s`` (per turn or for the whole
server) sleeps before every SSE frame.

**Validation,** with the real API's messages: empty ``messages``; a
``tool_use`` not answered by ``tool_result`` blocks first in the next user
message; a ``tool_result`` with no ``tool_use`` in the previous message;
more than 4 ``cache_control`` blocks; missing ``model``/``max_tokens``/
``anthropic-version``. Each gives a 400 ``invalid_request_error``.

**Prompt cache,** reported truthfully: the prefix (tools, then system, then
messages, per model) up to each ``cache_control`` breakpoint is hashed; a
prefix seen before (looking back up to 20 blocks from each breakpoint, within
its TTL: 5 min, or 1 h with ``"ttl": "1h"``) is read
(``cache_read_input_tokens``), the rest up to the last breakpoint is written
(``cache_creation_input_tokens``). Tokens are approximated as characters // 4;
prefixes shorter than ``min_cacheable_tokens`` (default 1024, like the real
models) are not cached.

**CLI.** ``hango-worker fake-anthropic --port P --script FILE`` serves a script
file until SIGINT/SIGTERM: `serve_forever(port, script_path)` (blocking, its own
loop) or `serve_script(...)` (a coroutine, on the running loop); `main(argv)` is
the whole command, also as ``python -m hango_worker.testing.fake_anthropic``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import inspect
import itertools
import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from hango_worker.provider.scripted import ScriptedTurn, ScriptError

__all__ = [
    "FakeAnthropic",
    "FakeTurn",
    "Fault",
    "RecordedRequest",
    "ScriptError",
    "load_fake_script",
    "main",
    "parse_fake_script",
    "serve_forever",
    "serve_script",
]

MESSAGES_PATH = "/v1/messages"
MAX_CACHE_BREAKPOINTS = 4
CACHE_LOOKBACK_BLOCKS = 20
DEFAULT_MIN_CACHEABLE_TOKENS = 1024
_TTL_S = {"5m": 300.0, "1h": 3600.0}

STATUS_BY_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
TYPE_BY_STATUS = {v: k for k, v in STATUS_BY_TYPE.items()}
_DEFAULT_MESSAGES = {
    429: "Number of request tokens has exceeded your per-minute rate limit",
    500: "Internal server error",
    529: "Overloaded",
}
_FAULT_ALIASES = {"rate_limit": "429", "overloaded": "529", "server_error": "500"}
_STREAM_FAULTS = ("drop", "midstream_overloaded", "midstream_drop")

# -- the script ----------------------------------------------------------------------------


class Fault(BaseModel):
    """One injected failure (see the module docstring for the kinds)."""

    model_config = ConfigDict(extra="forbid")
    fault: str
    times: int = Field(default=1, ge=1)
    retry_after: float | None = None
    message: str | None = None
    type: str | None = None

    @field_validator("fault", mode="before")
    @classmethod
    def _kind(cls, v: Any) -> str:
        kind = _FAULT_ALIASES.get(str(v), str(v))
        if kind in _STREAM_FAULTS or (kind.isdigit() and 400 <= int(kind) <= 599):
            return kind
        raise ValueError(
            f"unknown fault {v!r}: use an HTTP error status (429, 529, 500, 400, …), "
            "'drop', 'midstream_overloaded' or 'midstream_drop'"
        )

    @property
    def status(self) -> int | None:
        return int(self.fault) if self.fault.isdigit() else None


class FakeTurn(ScriptedTurn):
    """A scripted-model turn, plus what only a server can do."""

    faults: list[Fault] = Field(default_factory=list)
    chunk_delay_s: float = 0.0
    stop_sequence: str | None = None

    def all_faults(self) -> list[Fault]:
        """One entry per failing attempt: `faults` (expanded by `times`), then `error`."""
        out = [f for f in self.faults for _ in range(f.times)]
        if self.error is not None:
            status = STATUS_BY_TYPE.get(self.error.type, 500 if self.error.retryable else 400)
            fault = Fault(fault=str(status), type=self.error.type, message=self.error.message)
            out.extend([fault] * self.error.times)
        return out


def _entry(item: Any) -> FakeTurn | Fault:
    if isinstance(item, FakeTurn | Fault):
        return item
    if isinstance(item, ScriptedTurn):
        return FakeTurn.model_validate(item.model_dump())
    if isinstance(item, dict) and "fault" in item:
        return Fault.model_validate(item)
    return FakeTurn.model_validate(item)


def parse_fake_script(raw: Any, source: str = "script") -> list[FakeTurn]:
    """Turns from a JSON list; fault entries are attached to the turn after them."""
    if not isinstance(raw, list):
        raise ScriptError(f"{source}: a script is a JSON list of turns, got {type(raw).__name__}")
    turns: list[FakeTurn] = []
    pending: list[Fault] = []
    for i, item in enumerate(raw):
        try:
            entry = _entry(item)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ScriptError(f"{source}: entry {i}: {loc}: {first['msg']}") from None
        if isinstance(entry, Fault):
            pending.append(entry)
            continue
        if pending:
            entry = entry.model_copy(update={"faults": [*pending, *entry.faults]})
            pending = []
        turns.append(entry)
    if pending:
        raise ScriptError(f"{source}: fault entries at the end are not followed by a turn")
    return turns


def load_fake_script(path: str | Path) -> list[FakeTurn]:
    p = Path(path)
    try:
        raw = json.loads(p.read_text())
    except OSError as e:
        raise ScriptError(f"cannot read script {p}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ScriptError(f"{p}: not JSON: {e.msg} at line {e.lineno}") from None
    return parse_fake_script(raw, str(p))


@dataclass(slots=True)
class RecordedRequest:
    """One request as the server received it (header names in lowercase)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float = field(default_factory=time.time)

    @property
    def api_key(self) -> str | None:
        """The key the client presented, from `x-api-key` or `Authorization: Bearer`."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else None

    @property
    def messages(self) -> list[Any]:
        msgs = self.body.get("messages") if isinstance(self.body, dict) else None
        return msgs if isinstance(msgs, list) else []

    @property
    def turn_index(self) -> int:
        """How many assistant messages the history holds (which turn the script plays)."""
        return sum(1 for m in self.messages if isinstance(m, dict) and m.get("role") == "assistant")


# -- validation ----------------------------------------------------------------------------


class ApiError(Exception):
    """An error response: status, error type and message as the API words them."""

    def __init__(self, status: int, type: str, message: str) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type, message


def _blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _tool_use_ids(message: Any) -> list[str]:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return []
    return [str(b.get("id")) for b in _blocks(message) if b.get("type") == "tool_use"]


def _leading_result_ids(message: Any) -> set[str]:
    ids: set[str] = set()
    if not isinstance(message, dict) or message.get("role") != "user":
        return ids
    for b in _blocks(message):
        if b.get("type") != "tool_result":
            break
        ids.add(str(b.get("tool_use_id")))
    return ids


def check_tool_pairing(messages: list[Any]) -> None:
    """Every tool_use answered first thing in the next user message, and no stray results."""
    for i, m in enumerate(messages):
        uses = _tool_use_ids(m)
        if uses:
            answered = _leading_result_ids(messages[i + 1]) if i + 1 < len(messages) else set()
            missing = [u for u in uses if u not in answered]
            if missing:
                raise ApiError(
                    400,
                    "invalid_request_error",
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have "
                    "a corresponding `tool_result` block in the next message.",
                )
        if isinstance(m, dict) and m.get("role") == "user":
            previous = set(_tool_use_ids(messages[i - 1])) if i > 0 else set()
            for k, b in enumerate(_blocks(m)):
                if b.get("type") == "tool_result" and b.get("tool_use_id") not in previous:
                    raise ApiError(
                        400,
                        "invalid_request_error",
                        f"messages.{i}.content.{k}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {b.get('tool_use_id')}. Each `tool_result` block "
                        "must have a corresponding `tool_use` block in the previous message.",
                    )


def _cache_control_count(body: dict[str, Any]) -> int:
    items: list[Any] = []
    for key in ("system", "tools"):
        if isinstance(body.get(key), list):
            items.extend(body[key])
    for m in body.get("messages") or []:
        items.extend(_blocks(m))
    return sum(1 for b in items if isinstance(b, dict) and b.get("cache_control"))


def validate_request(body: Any, headers: dict[str, str]) -> None:
    """Raise ApiError the way the API does, for the rules this fake knows."""
    if "anthropic-version" not in headers:
        raise ApiError(400, "invalid_request_error", "anthropic-version: header is required")
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request_error", "The request body is not valid JSON.")
    for key in ("model", "max_tokens", "messages"):
        if key not in body:
            raise ApiError(400, "invalid_request_error", f"{key}: Field required")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "invalid_request_error", "messages: at least one message is required")
    check_tool_pairing(messages)
    n = _cache_control_count(body)
    if n > MAX_CACHE_BREAKPOINTS:
        raise ApiError(
            400,
            "invalid_request_error",
            f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {n}.",
        )


# -- prompt cache --------------------------------------------------------------------------


@dataclass(slots=True)
class CacheUsage:
    input_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    creation_ttl: str = "5m"


def _segments(body: dict[str, Any]) -> list[tuple[str, int, Any]]:
    """(canonical text, characters, cache_control) per cacheable block, in prefix order."""
    raw: list[tuple[str, Any]] = []
    for tool in body.get("tools") or []:
        raw.append(("tool", tool))
    system = body.get("system")
    if isinstance(system, str):
        raw.append(("system", {"type": "text", "text": system}))
    elif isinstance(system, list):
        raw.extend(("system", b) for b in system)
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        role = str(m.get("role")) if isinstance(m, dict) else "?"
        if isinstance(content, str):
            raw.append((role, {"type": "text", "text": content}))
        else:
            raw.extend((role, b) for b in _blocks(m))
    out = []
    for where, block in raw:
        if not isinstance(block, dict):
            continue
        cc = block.get("cache_control")
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        canon = where + json.dumps(plain, sort_keys=True, separators=(",", ":"))
        text = plain.get("text")
        out.append((canon, len(text) if isinstance(text, str) else len(canon), cc))
    return out


class PromptCache:
    """Prefix hashes written at cache_control breakpoints, with their expiry times."""

    def __init__(
        self,
        min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_cacheable_tokens = min_cacheable_tokens
        self.clock = clock
        self._entries: dict[bytes, tuple[float, float]] = {}  # digest -> (expires, ttl)
        self._lock = threading.Lock()

    def account(self, body: dict[str, Any]) -> CacheUsage:
        h = hashlib.sha256(str(body.get("model")).encode())
        digests: list[bytes] = []
        chars: list[int] = []
        breakpoints: list[tuple[int, str]] = []
        total = 0
        for i, (canon, n, cc) in enumerate(_segments(body)):
            h.update(canon.encode())
            digests.append(h.copy().digest())
            total += n
            chars.append(total)
            if cc:
                ttl = cc.get("ttl", "5m") if isinstance(cc, dict) else "5m"
                breakpoints.append((i, ttl if ttl in _TTL_S else "5m"))
        with self._lock:
            return self._account(digests, chars, breakpoints, total)

    def _account(
        self, digests: list[bytes], chars: list[int], bps: list[tuple[int, str]], total: int
    ) -> CacheUsage:
        now = self.clock()
        hit = -1
        for b, _ in bps:
            for j in range(b, max(-1, b - CACHE_LOOKBACK_BLOCKS), -1):
                if j <= hit:
                    break
                entry = self._entries.get(digests[j])
                if entry is not None and entry[0] > now:
                    hit = j
                    self._entries[digests[j]] = (now + entry[1], entry[1])
                    break
        read = chars[hit] // 4 if hit >= 0 else 0
        eligible = [(b, t) for b, t in bps if chars[b] // 4 >= self.min_cacheable_tokens]
        usage = CacheUsage(input_tokens=0, cache_read_input_tokens=read)
        cached = read
        if eligible:
            last, usage.creation_ttl = eligible[-1]
            if last > hit:
                usage.cache_creation_input_tokens = chars[last] // 4 - read
                cached = chars[last] // 4
            for b, ttl in eligible:
                self._entries[digests[b]] = (now + _TTL_S[ttl], _TTL_S[ttl])
        usage.input_tokens = max(1, total // 4 - cached)
        return usage


# -- responses -----------------------------------------------------------------------------


def _word_chunks(text: str) -> list[str]:
    out: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch == " " and i > start:
            out.append(text[start:i])
            start = i
    if start < len(text):
        out.append(text[start:])
    return out


def _json_chunks(raw: str, size: int = 24) -> list[str]:
    return [""] + [raw[i : i + size] for i in range(0, len(raw), size)]


@dataclass(slots=True)
class _Answer:
    """A turn made concrete: the message JSON plus what only the stream shows."""

    message: dict[str, Any]
    cut_json: str | None = None  # the truncated arguments of the last tool_use (max_tokens)
    chunk_delay_s: float = 0.0


def build_answer(turn: FakeTurn, index: int, body: dict[str, Any], usage: CacheUsage) -> _Answer:
    content: list[dict[str, Any]] = []
    if turn.thinking is not None:
        content.append(
            {"type": "thinking", "thinking": turn.thinking, "signature": f"scripted-{index}"}
        )
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    for j, call in enumerate(turn.tool_calls):
        tid = call.id or f"toolu_s{index:04d}_{j}"
        content.append({"type": "tool_use", "id": tid, "name": call.name, "input": call.input})
    stop = str(turn.stop_reason or ("tool_use" if turn.tool_calls else "end_turn"))
    cut: str | None = None
    if stop == "max_tokens" and content and content[-1]["type"] == "tool_use":
        full = json.dumps(content[-1]["input"])
        cut = full[: max(1, len(full) // 2)]
        content[-1]["input"] = {}
    out_chars = sum(_output_chars(b) for b in content)
    counts = {
        "input_tokens": usage.input_tokens,
        "output_tokens": max(1, out_chars // 4),
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
    }
    counts.update(turn.usage or {})
    message = {
        "id": "",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": _stop_sequence(turn, stop, body),
        "usage": {**counts, "cache_creation": _creation(counts, usage), "service_tier": "standard"},
    }
    return _Answer(message=message, cut_json=cut, chunk_delay_s=turn.chunk_delay_s)


def _output_chars(block: dict[str, Any]) -> int:
    if block["type"] == "tool_use":
        return len(block["name"]) + len(json.dumps(block["input"]))
    return len(block.get("text") or block.get("thinking") or "")


def _stop_sequence(turn: FakeTurn, stop: str, body: dict[str, Any]) -> str | None:
    if stop != "stop_sequence":
        return None
    given = body.get("stop_sequences") or []
    return turn.stop_sequence or (str(given[0]) if given else "STOP")


def _creation(counts: dict[str, int], usage: CacheUsage) -> dict[str, int]:
    n = counts["cache_creation_input_tokens"]
    one_hour = usage.creation_ttl == "1h"
    return {
        "ephemeral_5m_input_tokens": 0 if one_hour else n,
        "ephemeral_1h_input_tokens": n if one_hour else 0,
    }


Frame = tuple[str, dict[str, Any]]


def _block_frames(i: int, block: dict[str, Any], cut_json: str | None) -> list[Frame]:
    kind = block["type"]
    deltas: list[dict[str, Any]]
    if kind == "text":
        start: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": t} for t in _word_chunks(block["text"])]
    elif kind == "thinking":
        start = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": t} for t in _word_chunks(block["thinking"])
        ]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:
        start = {**block, "input": {}}
        raw = cut_json if cut_json is not None else json.dumps(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in _json_chunks(raw)]
    frames: list[Frame] = [
        ("content_block_start", {"type": "content_block_start", "index": i, "content_block": start})
    ]
    frames += [
        ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
        for d in deltas
    ]
    frames.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    return frames


def stream_frames(answer: _Answer) -> list[Frame]:
    """The SSE frames of a message, in the API's order, with pings."""
    msg = answer.message
    usage = msg["usage"]
    head = {**msg, "content": [], "stop_reason": None, "stop_sequence": None}
    head["usage"] = {**usage, "output_tokens": 1}
    frames: list[Frame] = [
        ("message_start", {"type": "message_start", "message": head}),
        ("ping", {"type": "ping"}),
    ]
    last = len(msg["content"]) - 1
    for i, block in enumerate(msg["content"]):
        frames += _block_frames(i, block, answer.cut_json if i == last else None)
    frames.append(("ping", {"type": "ping"}))
    delta_usage = {
        k: usage[k]
        for k in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
        )
    }
    frames.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"]},
                "usage": delta_usage,
            },
        )
    )
    frames.append(("message_stop", {"type": "message_stop"}))
    return frames


def _sse(frame: Frame) -> bytes:
    return f"event: {frame[0]}\ndata: {json.dumps(frame[1])}\n\n".encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _error_body(err_type: str, message: str, request_id: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": err_type, "message": message},
        "request_id": request_id,
    }


# -- HTTP ----------------------------------------------------------------------------------


@dataclass(slots=True)
class _HttpRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


async def _read_request(reader: asyncio.StreamReader) -> _HttpRequest | None:
    line = await reader.readline()
    if not line.strip():
        return None
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = await _read_chunked(reader)
    else:
        length = int(headers.get("content-length") or 0)
        body = await reader.readexactly(length) if length else b""
    return _HttpRequest(method.upper(), target.split("?", 1)[0], headers, body)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readline()


def _head(status: int, headers: dict[str, str]) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Overloaded" if status == 529 else "Error"
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _json_response(status: int, body: Any, headers: dict[str, str]) -> bytes:
    data = json.dumps(body).encode()
    head = {"content-type": "application/json", "content-length": str(len(data)), **headers}
    return _head(status, head) + data


Handler = Callable[[RecordedRequest], Any]


class FakeAnthropic:
    """The fake Messages API server. See the module docstring."""

    def __init__(
        self,
        script: Sequence[FakeTurn | Fault | ScriptedTurn | dict[str, Any]] | None = None,
        *,
        handler: Handler | None = None,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        chunk_delay_s: float = 0.0,
        min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
    ) -> None:
        if (script is None) == (handler is None):
            raise ValueError("give FakeAnthropic either a script or a handler")
        self.turns = parse_fake_script(list(script)) if script is not None else []
        self.handler = handler
        self.api_key = api_key
        self.host = host
        self.chunk_delay_s = chunk_delay_s
        self.cache = PromptCache(min_cacheable_tokens)
        self.requests: list[RecordedRequest] = []
        self._port = port
        self._injected: list[Fault] = []
        self._attempts: dict[int, int] = {}
        self._ids = itertools.count(1)
        self._server: asyncio.Server | None = None
        self._conns: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def base_url(self) -> str:
        """What to give the SDK as `base_url` / ANTHROPIC_BASE_URL (no `/v1`)."""
        return f"http://{self.host}:{self._port}"

    async def astart(self) -> FakeAnthropic:
        """Serve on the running event loop."""
        self._server = await asyncio.start_server(self._on_connection, self.host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]
        return self

    async def aclose(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._conns.values()):
            writer.transport.abort()  # ends the connection task (no cancel: see 3.11 streams)
        await asyncio.gather(*self._conns, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    def start(self) -> FakeAnthropic:
        """Serve from a thread with its own event loop (works beside any loop)."""
        loop = asyncio.new_event_loop()
        started: list[BaseException | None] = []
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.astart())
                started.append(None)
            except BaseException as e:
                started.append(e)
            ready.set()
            if started[0] is None:
                loop.run_forever()
                loop.run_until_complete(self.aclose())
            loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="fake-anthropic", daemon=True)
        self._thread.start()
        ready.wait()
        if started[0] is not None:
            raise started[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop = self._thread = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> FakeAnthropic:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- control ---------------------------------------------------------------------------

    def inject(self, fault: Fault | dict[str, Any] | str | int, **options: Any) -> None:
        """Serve `fault` to the next request(s), before anything the script says."""
        f = fault if isinstance(fault, Fault) else _as_fault(fault, options)
        self._injected.extend([f] * f.times)

    def load(self, script: Sequence[FakeTurn | Fault | ScriptedTurn | dict[str, Any]]) -> None:
        """Play another script from now on (attempt counters start again)."""
        self.turns = parse_fake_script(list(script))
        self._attempts.clear()

    def clear(self) -> None:
        """Forget the recorded requests."""
        self.requests.clear()

    # -- serving ---------------------------------------------------------------------------

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns[task] = writer
        try:
            while True:
                req = await _read_request(reader)
                if req is None or not await self._serve(req, writer):
                    break
                if req.headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            self._conns.pop(task, None)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, req: _HttpRequest, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must be closed."""
        rid = f"req_fake_{next(self._ids):06d}"
        try:
            body = json.loads(req.body) if req.body else None
        except ValueError:
            body = None
        rec = RecordedRequest(req.method, req.path, dict(req.headers), body)
        self.requests.append(rec)
        if req.method != "POST" or req.path.rstrip("/") != MESSAGES_PATH:
            err = ApiError(404, "not_found_error", f"Not found: {req.method} {req.path}")
            return await self._send_error(writer, err, rid)
        try:
            self._authenticate(rec)
            validate_request(body, rec.headers)
            outcome = await self._pick(rec)
        except ApiError as e:
            return await self._send_error(writer, e, rid)
        if isinstance(outcome, Fault):
            return await self._fault(writer, outcome, rec, rid)
        turn, index = outcome
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        answer = build_answer(turn, index, rec.body, self.cache.account(rec.body))
        answer.message["id"] = f"msg_fake_{rid[9:]}"
        if not rec.body.get("stream"):
            writer.write(_json_response(200, answer.message, {"request-id": rid}))
            await writer.drain()
            return True
        await self._stream(writer, stream_frames(answer), rid, answer.chunk_delay_s)
        return True

    def _authenticate(self, rec: RecordedRequest) -> None:
        key = rec.api_key
        if not key:
            raise ApiError(401, "authentication_error", "x-api-key header is required")
        if self.api_key is not None and key != self.api_key:
            raise ApiError(401, "authentication_error", "invalid x-api-key")

    async def _pick(self, rec: RecordedRequest) -> Fault | tuple[FakeTurn, int]:
        if self._injected:
            return self._injected.pop(0)
        index = rec.turn_index
        if self.handler is not None:
            try:
                out = self.handler(rec)
                if inspect.isawaitable(out):
                    out = await out
                entry = _entry(out)
            except Exception as e:
                raise ApiError(500, "api_error", f"fake-anthropic handler failed: {e!r}") from e
            return entry if isinstance(entry, Fault) else (entry, index)
        if index >= len(self.turns):
            raise ApiError(
                400,
                "invalid_request_error",
                f"fake-anthropic: the script has no turn {index + 1} (it has {len(self.turns)})",
            )
        turn = self.turns[index]
        attempt = self._attempts.get(index, 0)
        self._attempts[index] = attempt + 1
        faults = turn.all_faults()
        return faults[attempt] if attempt < len(faults) else (turn, index)

    async def _send_error(self, writer: asyncio.StreamWriter, e: ApiError, rid: str) -> bool:
        headers = {"request-id": rid}
        writer.write(_json_response(e.status, _error_body(e.type, e.message, rid), headers))
        await writer.drain()
        return True

    async def _fault(
        self, writer: asyncio.StreamWriter, fault: Fault, rec: RecordedRequest, rid: str
    ) -> bool:
        if fault.fault == "drop":
            return False
        status = fault.status
        if status is None:  # a mid-stream fault
            await self._midstream(writer, fault, rec, rid)
            return fault.fault != "midstream_drop"
        etype = fault.type or TYPE_BY_STATUS.get(
            status, "api_error" if status >= 500 else "invalid_request_error"
        )
        message = fault.message or _DEFAULT_MESSAGES.get(
            status, f"fake-anthropic: injected {status}"
        )
        headers = {"request-id": rid}
        if status == 429 or fault.retry_after is not None:
            headers["retry-after"] = _fmt_seconds(
                1.0 if fault.retry_after is None else fault.retry_after
            )
        if status == 529:
            headers["x-should-retry"] = "true"
        writer.write(_json_response(status, _error_body(etype, message, rid), headers))
        await writer.drain()
        return True

    async def _midstream(
        self, writer: asyncio.StreamWriter, fault: Fault, rec: RecordedRequest, rid: str
    ) -> None:
        """Start a real stream (the next turn's), then fail after its first content delta."""
        index = rec.turn_index
        turn = self.turns[index] if index < len(self.turns) else FakeTurn(text="Partial answer")
        answer = build_answer(
            turn, index, rec.body if isinstance(rec.body, dict) else {}, CacheUsage(0)
        )
        answer.message["id"] = f"msg_fake_{rid[9:]}"
        frames = stream_frames(answer)
        first_delta = next((i for i, f in enumerate(frames) if f[0] == "content_block_delta"), 1)
        frames = frames[: first_delta + 1]
        if fault.fault == "midstream_overloaded":
            err = _error_body(fault.type or "overloaded_error", fault.message or "Overloaded", rid)
            frames.append(("error", err))
        await self._stream(
            writer, frames, rid, self.chunk_delay_s, finish=fault.fault != "midstream_drop"
        )

    async def _stream(
        self,
        writer: asyncio.StreamWriter,
        frames: list[Frame],
        rid: str,
        delay_s: float,
        *,
        finish: bool = True,
    ) -> None:
        headers = {
            "content-type": "text/event-stream; charset=utf-8",
            "cache-control": "no-cache",
            "transfer-encoding": "chunked",
            "request-id": rid,
        }
        writer.write(_head(200, headers))
        delay = delay_s or self.chunk_delay_s
        if delay:
            for frame in frames:
                await asyncio.sleep(delay)
                writer.write(_chunk(_sse(frame)))
                await writer.drain()
        else:
            writer.write(_chunk(b"".join(_sse(f) for f in frames)))
        if finish:
            writer.write(b"0\r\n\r\n")
        await writer.drain()


def _fmt_seconds(s: float) -> str:
    return str(int(s)) if float(s).is_integer() else repr(float(s))


def _as_fault(fault: dict[str, Any] | str | int, options: dict[str, Any]) -> Fault:
    if isinstance(fault, dict):
        return Fault.model_validate({**fault, **options})
    return Fault.model_validate({"fault": str(fault), **options})


# -- CLI -----------------------------------------------------------------------------------


def serve_forever(
    port: int,
    script_path: str | Path,
    *,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    chunk_delay_s: float = 0.0,
    min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
) -> None:
    """Blocking: serve a script file until SIGINT/SIGTERM, on a loop of its own
    (`asyncio.run`; from inside a running loop use `serve_script`). Raises
    ScriptError for a bad script and OSError when the port cannot be bound."""
    asyncio.run(
        serve_script(
            port,
            script_path,
            host=host,
            api_key=api_key,
            chunk_delay_s=chunk_delay_s,
            min_cacheable_tokens=min_cacheable_tokens,
        )
    )


async def serve_script(
    port: int,
    script_path: str | Path,
    *,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    chunk_delay_s: float = 0.0,
    min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
) -> None:
    """Serve a script file on the running loop until SIGINT/SIGTERM (or cancellation).

    Prints one line, ``fake-anthropic: listening on http://HOST:PORT ...``, once
    it accepts connections. Raises ScriptError for a bad script and OSError when
    the port cannot be bound."""
    turns = load_fake_script(script_path)
    fake = FakeAnthropic(
        turns,
        api_key=api_key,
        host=host,
        port=port,
        chunk_delay_s=chunk_delay_s,
        min_cacheable_tokens=min_cacheable_tokens,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    try:
        async with fake:
            print(
                f"fake-anthropic: listening on {fake.base_url} (script {script_path}, "
                f"{len(fake.turns)} turns; set ANTHROPIC_BASE_URL={fake.base_url})",
                flush=True,
            )
            await stop.wait()
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hango-worker fake-anthropic",
        description="A local fake of the Anthropic Messages API that plays a script (offline).",
    )
    parser.add_argument("--port", type=int, default=8765, help="port (0: any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--script", required=True, help="JSON list of turns (scripted-model format)"
    )
    parser.add_argument("--api-key", default=None, help="accept only this key (default: any)")
    parser.add_argument(
        "--chunk-delay", type=float, default=0.0, help="seconds before each SSE frame"
    )
    parser.add_argument(
        "--min-cacheable-tokens",
        type=int,
        default=DEFAULT_MIN_CACHEABLE_TOKENS,
        help="shortest prefix the prompt cache keeps (tokens ≈ characters / 4)",
    )
    args = parser.parse_args(argv)
    try:
        serve_forever(
            args.port,
            args.script,
            host=args.host,
            api_key=args.api_key,
            chunk_delay_s=args.chunk_delay,
            min_cacheable_tokens=args.min_cacheable_tokens,
        )
    except ScriptError as e:
        print(f"fake-anthropic: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"fake-anthropic: cannot listen on {args.host}:{args.port}: {e.strerror}",
            file=sys.stderr,
        )
        return 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
