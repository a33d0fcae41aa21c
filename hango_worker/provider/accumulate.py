"""Folding the Messages API's stream events into a Response, losing nothing.

Every content block is assembled into the complete JSON object the API would have
returned unstreamed, and kept so (docs/system-architecture.md, "Content blocks"):

- `text`, `thinking`, `tool_use` become the typed blocks hango reads, each keeping the
  fields it does not model in `extra`, exactly as received (a text block's
  `citations`, to which every `citations_delta` appends its citation);
- a `compaction_delta` sets the fields it carries (`content`, `encrypted_content`) on
  its compaction block, as the SDK's own accumulator does (the API sends one, whole);
- any other type (redacted_thinking, server_tool_use, web_search_tool_result,
  web_fetch_tool_result, code execution results, container_upload, compaction, a type
  added after this code) is a `RawBlock` of its whole object; an `input_json_delta` to
  one (server_tool_use) sets its `input`, as for tool_use;
- a delta of a type this code does not know is merged by the one rule every known
  delta follows: each of its fields (but `type`) is appended to the block's string or
  list of that name, or set when the block has none (hango_stream_unknown_deltas_total).

The dispatch is on the `type` strings the API sends, never on the SDK's classes: the
SDK builds an unknown block as its first union member (a TextBlock whose type is
"future_block"), and an unknown delta as a TextDelta with no text.

`feed` is the per-event hot path: a text delta costs a dict lookup, a string compare
and a list append (plus the caller's `on_text`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from anthropic.types import (
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    RawMessageDeltaEvent,
    RawMessageStartEvent,
    RawMessageStreamEvent,
)

from hango_worker.provider.sanitize import clean_message, record_sanitized
from hango_worker.provider.types import (
    JSON,
    Block,
    Message,
    ModelError,
    RawBlock,
    Response,
    StopReason,
    TextBlock,
    TextSink,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
    extra_fields,
    tool_input,
)
from hango_worker.telemetry import metrics
from hango_worker.vocab import ErrorType

log = logging.getLogger(__name__)

STOP_REASONS = {s.value: s for s in StopReason}
_unknown_seen: set[str] = set()  # delta types logged once per process


def as_json(model: Any) -> dict[str, JSON]:
    """An SDK object as the JSON the API sent: the fields it carried, unknown ones too."""
    out: dict[str, JSON] = model.to_dict(mode="json", warnings=False)
    return out


def _typed(data: dict[str, JSON]) -> Block:
    kind = data.get("type")
    """A block-start's object as a block (types.py `extra_fields`: which keys each typed
    block models, in one place); tolerant of what a start may leave out."""
    kind = data.get("type")
    if kind == "text":
        return TextBlock(text=str(data.get("text") or ""), extra=extra_fields(data, "text"))
    if kind == "thinking":
        return ThinkingBlock(
            thinking=str(data.get("thinking") or ""),
            signature=str(data.get("signature") or ""),
            extra=extra_fields(data, "thinking"),
        )
    if kind == "tool_use":
        args, problem = tool_input({} if data.get("input") is None else data["input"])
        return ToolUseBlock(
            id=str(data.get("id")),
            name=str(data.get("name")),
            input=args,
            input_error=problem,
            extra=extra_fields(data, "tool_use"),
        )
    return RawBlock(data)


def _fields(block: Block) -> dict[str, JSON]:
    """Where an unknown delta's fields go: a RawBlock's object, else a typed block's
    `extra` (made on first use)."""
    if isinstance(block, RawBlock):
        return block.data
    if isinstance(block, TextBlock | ThinkingBlock | ToolUseBlock):
        if block.extra is None:
            block.extra = {}
        return block.extra
    raise TypeError(f"no fields to merge into a {type(block).__name__}")


def merge_delta(target: dict[str, JSON], delta: dict[str, JSON]) -> None:
    """The rule of every delta the API has (text, thinking, signature, partial JSON,
    citations): a string field is appended to, a list field gets the value (or the
    values) appended, a missing field is set."""
    for key, value in delta.items():
        if key == "type":
            continue
        have = target.get(key)
        if isinstance(have, str) and isinstance(value, str):
            target[key] = have + value
        elif isinstance(have, list):
            have.extend(value if isinstance(value, list) else [value])
        else:
            target[key] = value


class Accumulator:
    """Folds raw stream events into a Response. `feed` is the per-event hot path."""

    __slots__ = (
        "_blocks",
        "_parts",
        "_text",
        "_usage",
        "first_chunk_s",
        "id",
        "model",
        "on_text",
        "stop",
        "stop_details",
    )

    def __init__(self, on_text: TextSink | None) -> None:
        self.on_text = on_text
        self._blocks: dict[int, Block] = {}
        self._parts: dict[int, list[str]] = {}  # streamed text / thinking / partial JSON
        self._text: dict[int, list[str]] = {}  # the open text blocks' parts (the same lists)
        self._usage = Usage()
        self.stop: str | None = None
        self.stop_details: dict[str, JSON] | None = None  # e.g. a refusal's category
        self.id = ""
        self.model = ""
        self.first_chunk_s: float | None = None

    def feed(self, event: RawMessageStreamEvent) -> None:
        # by the event's `type`, not its class: the beta endpoint's events are classes
        # of their own (BetaRawContentBlockDeltaEvent, …) of the same shape
        if event.type == "content_block_delta":
            delta = event.delta
            if delta.type == "text_delta":  # the hot path, inline: one lookup, one append
                text_parts = self._text.get(event.index)
                if text_parts is not None:
                    text = delta.text
                    text_parts.append(text)
                    if self.on_text is not None:
                        self.on_text(text)
                    return
            self._delta(event)
        elif event.type == "content_block_start":
            self._start(event)
        elif event.type == "content_block_stop":
            self._finish(event.index)
        elif event.type == "message_start":
            self._message_start(event)
        elif event.type == "message_delta":
            self._message_delta(event)

    def _delta(self, event: RawContentBlockDeltaEvent) -> None:
        delta = event.delta
        kind: str = delta.type  # beta types too (compaction_delta)
        parts = self._parts.get(event.index)
        if parts is None:
            raise ValueError(f"a {kind} for block {event.index}, which is not open")
        block = self._blocks[event.index]
        cls = block.__class__
        if kind == "input_json_delta" and (cls is ToolUseBlock or cls is RawBlock):
            parts.append(delta.partial_json)  # type: ignore[union-attr]
        elif kind == "thinking_delta" and cls is ThinkingBlock:
            parts.append(delta.thinking)  # type: ignore[union-attr]
        elif kind == "signature_delta" and isinstance(block, ThinkingBlock):
            block.signature += delta.signature  # type: ignore[union-attr]
        elif kind == "citations_delta":
            merge_delta(_fields(block), {"citations": [as_json(delta.citation)]})  # type: ignore[union-attr]
        elif kind == "compaction_delta":  # the SDK's rule: its fields replace the block's
            _fields(block).update({k: v for k, v in as_json(delta).items() if k != "type"})
        else:
            self._unknown_delta(block, as_json(delta))

    @staticmethod
    def _unknown_delta(block: Block, delta: dict[str, JSON]) -> None:
        kind = str(delta.get("type"))
        metrics.STREAM_UNKNOWN_DELTAS.inc()
        if kind not in _unknown_seen:
            _unknown_seen.add(kind)
            log.warning("the API streamed a %r delta this worker does not know; merged", kind)
        merge_delta(_fields(block), delta)

    def _start(self, event: RawContentBlockStartEvent) -> None:
        cb = event.content_block
        if cb.type == "text" and cb.model_fields_set <= {"type", "text"}:
            block: Block = TextBlock(text=cb.text or "")  # the common case: nothing else
        else:
            block = _typed(as_json(cb))
        self._blocks[event.index] = block
        parts = self._parts[event.index] = []
        if isinstance(block, TextBlock):
            self._text[event.index] = parts

    def _finish(self, index: int) -> None:
        block = self._blocks.get(index)
        parts = self._parts.pop(index, None)
        self._text.pop(index, None)
        if block is None or parts is None:
            return
        if isinstance(block, TextBlock):
            block.text += "".join(parts)
        elif isinstance(block, ThinkingBlock):
            block.thinking += "".join(parts)
        elif isinstance(block, ToolUseBlock):
            set_tool_input(block, "".join(parts))
        elif isinstance(block, RawBlock) and parts:
            _set_raw_input(block, "".join(parts))

    def _message_start(self, event: RawMessageStartEvent) -> None:
        msg = event.message
        self.id = msg.id
        self.model = msg.model
        u = msg.usage
        self._usage = usage = Usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            cache_read_input_tokens=u.cache_read_input_tokens or 0,
            cache_creation_input_tokens=u.cache_creation_input_tokens or 0,
            # the 1 h part of the writes (only message_start carries the split)
            cache_creation_1h_input_tokens=(
                u.cache_creation.ephemeral_1h_input_tokens if u.cache_creation else 0
            ),
            service_tier=u.service_tier,
        )
        if not u.model_fields_set <= _START_USAGE:  # anything else the API reported
            _usage_rest(usage, as_json(u))

    def _message_delta(self, event: RawMessageDeltaEvent) -> None:
        if event.delta.stop_reason is not None:
            self.stop = event.delta.stop_reason
        u = event.usage
        usage = self._usage
        usage.output_tokens = u.output_tokens
        if u.input_tokens is not None:
            usage.input_tokens = u.input_tokens
        if u.cache_read_input_tokens is not None:
            usage.cache_read_input_tokens = u.cache_read_input_tokens
        if u.cache_creation_input_tokens is not None:
            usage.cache_creation_input_tokens = u.cache_creation_input_tokens
        if not u.model_fields_set <= _DELTA_USAGE:  # the final counts of the rest
            _usage_rest(usage, as_json(u))
        details = getattr(event.delta, "stop_details", None)
        if details is not None:
            self.stop_details = as_json(details)

    def response(self, requested_model: str) -> Response:
        if self.stop is None:
            raise ModelError(
                ErrorType.API_CONNECTION_ERROR,
                "the response stream ended before the message was complete",
                retryable=True,
            )
        stop = STOP_REASONS.get(self.stop)
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
            stop_details=self.stop_details,
        )


# The usage fields message_start / message_delta carry that are read above without a copy.
_START_USAGE = frozenset(
    (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "cache_creation",
        "service_tier",
    )
)
_DELTA_USAGE = frozenset(
    ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
)


def _usage_rest(usage: Usage, d: dict[str, JSON]) -> None:
    """The usage fields beyond the plain counts (thinking tokens, server-tool units, the
    speed and geography, fields this code does not know), the latest value of each."""
    rest = Usage.from_api(d)
    if "output_tokens_details" in d or "thinking_tokens" in d:
        usage.thinking_tokens = rest.thinking_tokens
    if rest.server_tool_use is not None:
        usage.server_tool_use = rest.server_tool_use
    for key in ("service_tier", "speed", "inference_geo"):
        value = getattr(rest, key)
        if value is not None:
            setattr(usage, key, value)
    if rest.extra:
        usage.extra = {**(usage.extra or {}), **rest.extra}


def set_tool_input(block: ToolUseBlock, raw: str) -> None:
    """Parse the streamed arguments. Unparseable JSON (a cut-off, or garbage) marks the
    call incomplete; JSON that is not an object is answered to the model as an error."""
    if not raw:
        return  # no argument deltas: the input sent with content_block_start stands
    try:
        value = json.loads(raw)
    except RecursionError:  # nested deeper than Python decodes: answered, never executed
        block.input, block.input_error = {}, "its arguments are nested too deeply to read"
        return
    except ValueError:
        block.complete, block.input = False, {}
        block.input_error = "its arguments are not valid JSON"
        return
    block.input, block.input_error = tool_input(value)


def _set_raw_input(block: RawBlock, raw: str) -> None:
    """A server tool's streamed input (server_tool_use): the JSON it makes, else the
    text as streamed under `input` (kept, never dropped; the API will say what it
    thinks of it)."""
    try:
        block.data["input"] = json.loads(raw)
    except (ValueError, RecursionError):
        log.warning("a %r block's streamed input is not JSON; kept as text", block.type)
        block.data["input"] = raw
