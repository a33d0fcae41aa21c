"""Provider-neutral message types, modelled on the Anthropic Messages API.

Plain slotted dataclasses: they are built on every turn, so they stay cheap.
`to_dict()` gives the API / storage shape (what `messages.content` holds in
Postgres); `message_from_dict` rebuilds typed messages from it.

Claude's content is opaque: every block is kept as the API returned it and sent back
the same JSON value (docs/system-architecture.md, "Content blocks"). The blocks hango
reads (text, tool_use, tool_result, thinking) are typed, and each keeps the fields it
does not model in `extra` (a text block's `citations`, fields added later); every other
block type (redacted_thinking, server tools' use and results, compaction, a type added
after this code) is a `RawBlock` holding its whole JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeAlias, TypeVar

from hango_worker.provider.usage import Usage as Usage  # re-exported: the types live here

JSON: TypeAlias = Any
Role = Literal["user", "assistant"]
REPLACEMENT = "\ufffd"  # what NUL and lone surrogates become (see provider/sanitize.py)


# Compact JSON (no spaces, UTF-8 kept) as the store writes it: one encoder made once
# (json.dumps with these options builds a new JSONEncoder on every call).
compact_json: Callable[[Any], str] = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":")
).encode

D = TypeVar("D")
# per class: its init fields, and a copier made for them (see `_copier`)
_INIT_FIELDS: dict[type, tuple[frozenset[str], Callable[[Any, dict[str, Any]], Any]]] = {}


def _copier(cls: type, names: tuple[str, ...]) -> Callable[[Any, dict[str, Any]], Any]:
    """`copy(obj, changes)` for `cls`: one function with a line per field, generated once
    (as `dataclasses` generates `__init__`), so a copy costs one call, not a `getattr`
    call per field. Field names are identifiers, so the generated code is plain."""
    lines = ["def copy(obj, changes):\n    new = _new(_cls)"]
    for n in names:
        lines.append(f"    _set(new, {n!r}, changes[{n!r}] if {n!r} in changes else obj.{n})")
    lines.append("    return new")
    scope: dict[str, Any] = {"_new": object.__new__, "_set": object.__setattr__, "_cls": cls}
    exec("\n".join(lines), scope)  # source built from the class's field names
    copy: Callable[[Any, dict[str, Any]], Any] = scope["copy"]
    return copy


def evolve(obj: D, **changes: Any) -> D:
    """`dataclasses.replace` for the dataclasses built on every model call (a request,
    a block, a middleware's request): the same copy without `replace`'s per-call field
    walk and `__init__` (a third of its time). Unknown names raise TypeError, as there;
    a class with `__post_init__` goes through `replace` itself."""
    cls = type(obj)
    found = _INIT_FIELDS.get(cls)
    if found is None:
        if hasattr(cls, "__post_init__"):
            return replace(obj, **changes)  # type: ignore[type-var]
        names = tuple(f.name for f in fields(obj) if f.init)  # type: ignore[arg-type]
        found = _INIT_FIELDS[cls] = (frozenset(names), _copier(cls, names))
    if not changes.keys() <= found[0]:
        unknown = sorted(set(changes) - found[0])
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(unknown)}")
    new: D = found[1](obj, changes)
    return new


class StopReason(StrEnum):
    END_TURN = "end_turn"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    TOOL_USE = "tool_use"
    PAUSE_TURN = "pause_turn"
    REFUSAL = "refusal"
    MODEL_CONTEXT_WINDOW_EXCEEDED = "model_context_window_exceeded"


# A prompt-cache breakpoint, e.g. {"type": "ephemeral"} or {"type": "ephemeral", "ttl": "1h"}.
# Set only on copies made for one request (agent/middlewares/prompt_cache.py), never on stored
# history: `block_from_dict` drops it, so nothing read back or taken as input carries one.
CacheControl: TypeAlias = dict[str, str]


@dataclass(slots=True)
class TextBlock:
    text: str
    cache_control: CacheControl | None = None
    # the fields of the API's block beyond type and text (`citations`, …), as received
    extra: dict[str, JSON] | None = None

    def to_dict(self) -> dict[str, JSON]:
        d: dict[str, JSON] = {"type": "text", "text": self.text}
        if self.extra:
            d.update(self.extra)
        if self.cache_control is not None:
            d["cache_control"] = dict(self.cache_control)
        return d


@dataclass(slots=True)
class ToolUseBlock:
    id: str
    name: str
    input: dict[str, JSON]
    # False when the stream ended (max_tokens) before the arguments were complete:
    # such a call must never be executed.
    complete: bool = True
    # Why the streamed arguments are unusable (not JSON, or JSON but not an object);
    # such a call is not executed: the model gets this as an error result. Not stored.
    input_error: str | None = None
    cache_control: CacheControl | None = None  # request copies only
    extra: dict[str, JSON] | None = None  # the API's other fields, as received

    def to_dict(self) -> dict[str, JSON]:
        d: dict[str, JSON] = {"type": "tool_use", "id": self.id, "name": self.name}
        d["input"] = self.input
        if self.extra:
            d.update(self.extra)
        if self.cache_control is not None:
            d["cache_control"] = dict(self.cache_control)
        return d


_JSON_TYPES: dict[type, str] = {
    list: "array",
    str: "string",
    bool: "boolean",
    int: "number",
    float: "number",
    type(None): "null",
}


def tool_input(value: JSON) -> tuple[dict[str, JSON], str | None]:
    """A tool call's arguments must be a JSON object: `(value, None)`, else `({}, why)`."""
    if isinstance(value, dict):
        return value, None
    kind = _JSON_TYPES.get(type(value), type(value).__name__)
    return {}, f"arguments must be a JSON object, got {kind}"


@dataclass(slots=True)
class ToolResultBlock:
    tool_use_id: str
    content: str  # the text (of a result given as blocks: its text parts, then a line each)
    is_error: bool = False
    cache_control: CacheControl | None = None  # request copies only
    # A result given as blocks (text, image, document, search_result): as stored (a large
    # image or PDF as a reference, provider/content.py), and as sent (`wire`: with its
    # bytes; None when nothing in it is stored by reference)
    blocks: list[dict[str, JSON]] | None = None
    wire: list[dict[str, JSON]] | None = None

    def to_dict(self) -> dict[str, JSON]:
        d: dict[str, JSON] = {
            "type": "tool_result",
            "tool_use_id": self.tool_use_id,
            "content": self.content if self.blocks is None else (self.wire or self.blocks),
        }
        if self.is_error:
            d["is_error"] = True
        if self.cache_control is not None:
            d["cache_control"] = dict(self.cache_control)
        return d

    def stored(self) -> dict[str, JSON]:
        """As stored: blocks kept by reference stay references."""
        d = self.to_dict()
        if self.wire is not None:
            d["content"] = self.blocks
        return d


@dataclass(slots=True)
class ThinkingBlock:
    thinking: str
    signature: str = ""
    extra: dict[str, JSON] | None = None  # the API's other fields, as received

    def to_dict(self) -> dict[str, JSON]:
        d: dict[str, JSON] = {
            "type": "thinking",
            "thinking": self.thinking,
            "signature": self.signature,
        }
        if self.extra:
            d.update(self.extra)
        return d


@dataclass(slots=True)
class RawBlock:
    """A block of a type hango does not read (redacted_thinking, server_tool_use and the
    server tools' results, compaction, container_upload, a type added after this code):
    its whole JSON object as the API returned it, sent back as it is. Never edited."""

    data: dict[str, JSON]
    # A block stored once (provider/content.py): `data` holds the reference as stored,
    # `wire` the block with its bytes, as sent (set when a run is loaded; never stored).
    wire: dict[str, JSON] | None = None

    @property
    def type(self) -> str:
        return str(self.data.get("type"))

    def to_dict(self) -> dict[str, JSON]:
        return self.data if self.wire is None else self.wire


Block: TypeAlias = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RawBlock


@dataclass(slots=True)
class Message:
    role: Role
    content: list[Block]

    def to_dict(self) -> dict[str, JSON]:
        return {"role": self.role, "content": [b.to_dict() for b in self.content]}

    def stored_content(self) -> list[dict[str, JSON]]:
        """The content as stored: a block stored once keeps its reference, not its bytes."""
        return [
            b.data
            if type(b) is RawBlock
            else b.stored()
            if type(b) is ToolResultBlock
            else b.to_dict()
            for b in self.content
        ]

    def tool_uses(self) -> list[ToolUseBlock]:
        return [b for b in self.content if isinstance(b, ToolUseBlock)]

    def text(self) -> str:
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))


def _result_content(raw: JSON) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        return "".join(str(p.get("text", "")) for p in raw if isinstance(p, dict))
    return str(raw)


def _has_media(raw: JSON) -> bool:
    """A tool result's content holds blocks other than text (kept as they are)."""
    return isinstance(raw, list) and any(
        isinstance(p, dict) and p.get("type") != "text" for p in raw
    )


# The keys each typed block models; the others go to its `extra`. `cache_control` is
# never kept: breakpoints are set on request copies only (agent/middlewares/prompt_cache.py).
_MODELLED = {
    "text": frozenset(("type", "text", "cache_control")),
    "tool_use": frozenset(("type", "id", "name", "input", "cache_control")),
    "thinking": frozenset(("type", "thinking", "signature", "cache_control")),
}


def extra_fields(d: dict[str, JSON], kind: str) -> dict[str, JSON] | None:
    """The fields of block `d` that its typed block (`kind`) does not model, or None."""
    modelled = _MODELLED[kind]
    if len(d) <= len(modelled) and d.keys() <= modelled:
        return None
    return {k: v for k, v in d.items() if k not in modelled} or None


def block_from_dict(d: dict[str, JSON]) -> Block:
    """Rebuild a block from its API/storage shape. A type hango does not read becomes a
    RawBlock (kept whole); ValueError only for what is not a block (no string `type`)."""
    if not isinstance(d, dict):
        raise ValueError(f"a content block must be a JSON object, got {type(d).__name__}")
    kind = d.get("type")
    if kind == "text":
        return TextBlock(text=str(d["text"]), extra=extra_fields(d, "text"))
    if kind == "tool_use":
        return ToolUseBlock(
            id=str(d["id"]),
            name=str(d["name"]),
            input=dict(d.get("input") or {}),
            extra=extra_fields(d, "tool_use"),
        )
    if kind == "tool_result":
        raw = d.get("content", "")
        return ToolResultBlock(
            tool_use_id=str(d["tool_use_id"]),
            content=_result_content(raw),
            is_error=bool(d.get("is_error", False)),
            blocks=raw if _has_media(raw) else None,
        )
    if kind == "thinking":
        return ThinkingBlock(
            thinking=str(d["thinking"]),
            signature=str(d.get("signature", "")),
            extra=extra_fields(d, "thinking"),
        )
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"a content block needs a string 'type', got {kind!r}")
    if "cache_control" in d:
        d = {k: v for k, v in d.items() if k != "cache_control"}
    return RawBlock(d)


def message_from_dict(d: dict[str, JSON]) -> Message:
    role = d.get("role")
    if role not in ("user", "assistant"):
        raise ValueError(f"unknown message role {role!r}")
    content = d.get("content")
    if isinstance(content, str):
        return Message(role=role, content=[TextBlock(text=content)])
    if not isinstance(content, list):
        raise ValueError("message content must be a string or a list of blocks")
    return Message(role=role, content=[block_from_dict(b) for b in content])


@dataclass(slots=True)
class ToolSpec:
    """What the model is told about a tool."""

    name: str
    description: str
    input_schema: dict[str, JSON]
    cache_control: CacheControl | None = None  # request copies only

    def to_dict(self) -> dict[str, JSON]:
        d: dict[str, JSON] = {
            "name": self.name,
            "description": self.description,
            "input_schema": self.input_schema,
        }
        if self.cache_control is not None:
            d["cache_control"] = dict(self.cache_control)
        return d


@dataclass(slots=True)
class Request:
    model: str
    messages: list[Message]
    system: list[TextBlock] = field(default_factory=list)
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 4096
    tool_choice: dict[str, JSON] | None = None
    temperature: float | None = None
    thinking: dict[str, JSON] | None = None
    # the agent's Messages API parameters (provider/params.py), sent as they are, and its
    # Anthropic-defined tools, sent after hango's own in `tools`
    params: dict[str, JSON] | None = None
    server_tools: list[dict[str, JSON]] | None = None
    # an agent with `files_api: true`: where the Files API ids of its stored blocks are
    # kept (provider/files.py); None: stored blocks are sent inline, as base64
    files: FileIds | None = None


class FileIds(Protocol):
    """The Files API ids of stored blocks, kept per tenant (run/blobs.py `PgFileIds`):
    by `account` (a digest of the endpoint and key they were uploaded with) and sha256."""

    async def load(self, account: str, sha256s: list[str]) -> dict[str, str]: ...

    async def save(self, account: str, sha256: str, file_id: str) -> None: ...


@dataclass(slots=True)
class Response:
    message: Message
    stop_reason: StopReason
    usage: Usage
    id: str = ""
    model: str = ""
    # seconds from request start to the first streamed chunk (None if not streamed)
    time_to_first_chunk_s: float | None = None
    # the provider's `anthropic-ratelimit-*` response headers, when it sent any
    # (run/ratelimit.py follows them)
    rate_limit_headers: dict[str, str] | None = None
    # the API's `stop_details`, as it came (a refusal's category and explanation)
    stop_details: dict[str, JSON] | None = None


# Called with each text delta as it streams; must be cheap and must not block.
TextSink: TypeAlias = Callable[[str], None]


def clean_text(text: str) -> tuple[str, int]:
    """(text with NUL and lone surrogates replaced by U+FFFD, how many were replaced)."""
    if text.isascii():
        n = text.count("\x00")
        return (text.replace("\x00", REPLACEMENT), n) if n else (text, 0)
    replaced = 0
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        before = text.count(REPLACEMENT)
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
        replaced = text.count(REPLACEMENT) - before
    nul = text.count("\x00")
    if nul:
        text = text.replace("\x00", REPLACEMENT)
    return text, replaced + nul


class ModelError(Exception):
    """A model call failed. `retryable` tells the loop whether backing off may help."""

    def __init__(
        self,
        type: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        request_id: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        type, message = clean_text(type)[0], clean_text(message)[0]  # both are stored
        super().__init__(f"{type}: {message}")
        self.type = type
        self.message = message
        self.retryable = retryable
        self.status = status
        self.request_id = clean_text(request_id)[0] if request_id is not None else None
        self.retry_after_s = retry_after_s

    def redacted(self, scrub: Callable[[str], str]) -> ModelError:
        """A copy with `scrub` applied to every string it carries (all of them are stored)."""
        return ModelError(
            scrub(self.type),
            scrub(self.message),
            retryable=self.retryable,
            status=self.status,
            request_id=scrub(self.request_id) if self.request_id is not None else None,
            retry_after_s=self.retry_after_s,
        )

    def to_dict(self) -> dict[str, JSON]:
        d: dict[str, JSON] = {"type": self.type, "message": self.message}
        if self.status is not None:
            d["status"] = self.status
        if self.request_id:
            d["request_id"] = self.request_id
        return d


class Provider(Protocol):
    """A model. `complete` streams one response, handing text deltas to `on_text`."""

    name: str

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response: ...
