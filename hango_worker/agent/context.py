"""How big the next request is: context windows per model, and a cheap estimate of
the next request's input tokens (docs/system-architecture.md, "Compaction").

The estimate is the last response's reported input tokens (input + cache read +
cache creation: everything the request held) for the prefix that request covered,
plus the characters added since divided by a chars-per-token ratio learned from the
last request (`DEFAULT_CHARS_PER_TOKEN` until a request has been measured). It costs
O(new content) per call, never O(history).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hango_worker.provider import media_tokens
from hango_worker.provider.types import (
    Block,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    Usage,
    compact_json,
)

# Every current Claude model has a 200k-token window. Sonnet 4 / 4.5 offer 1M tokens
# behind a beta header: configure `context_window: 1000000` on the agent to use it.
DEFAULT_CONTEXT_WINDOW = 200_000
CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    ("claude-opus-4", 200_000),
    ("claude-sonnet-4", 200_000),
    ("claude-haiku-4", 200_000),
    ("claude-3-7-sonnet", 200_000),
    ("claude-3-5-sonnet", 200_000),
    ("claude-3-5-haiku", 200_000),
    ("claude-3-opus", 200_000),
    ("claude-3-haiku", 200_000),
)

# English prose and code run at roughly 3.5 characters per Claude token; the ratio is
# re-learned from each measured request, within these bounds.
DEFAULT_CHARS_PER_TOKEN = 3.5
MIN_CHARS_PER_TOKEN = 1.0
MAX_CHARS_PER_TOKEN = 8.0
# Below this many new characters a request's token delta is too noisy to learn from.
MIN_CALIBRATION_CHARS = 2000
MESSAGE_OVERHEAD_CHARS = 16  # role and framing of one message


def context_window(model: str, override: int | None = None) -> int:
    """The window (tokens) of `model`: the agent's `context_window` when set, else
    the table (prefix match), else `DEFAULT_CONTEXT_WINDOW`."""
    if override is not None:
        return override
    for prefix, window in CONTEXT_WINDOWS:
        if model.startswith(prefix):
            return window
    return DEFAULT_CONTEXT_WINDOW


# An image or a PDF counts as the characters of the tokens the API documents for it
# (provider/media_tokens.py: by an image's dimensions, a PDF's pages), never as the
# characters of its base64.


def _media_chars(block: dict[str, Any], sent: dict[str, Any] | None = None) -> int | None:
    n = media_tokens.block_tokens(block, sent)
    return None if n is None else int(n * DEFAULT_CHARS_PER_TOKEN)


def media_chars(blocks: list[dict[str, Any]], sent: list[dict[str, Any]] | None = None) -> int:
    """The characters the image and document blocks of `blocks` count as (`sent`: the
    same blocks with the bytes of those stored by reference)."""
    total = 0
    for i, b in enumerate(blocks):
        if isinstance(b, dict) and b.get("type") in ("image", "document"):
            wire = sent[i] if sent is not None and i < len(sent) else None
            total += _media_chars(b, wire if isinstance(wire, dict) else None) or 0
    return total


# `json.dumps(x, separators=(",", ":"))` (ASCII escapes kept: the estimate counts them),
# from one encoder made once: json.dumps with options builds a new one per call.
_input_json: Callable[[Any], str] = json.JSONEncoder(separators=(",", ":")).encode


def block_chars(b: Block) -> int:
    if isinstance(b, TextBlock):
        return len(b.text)
    if isinstance(b, ToolResultBlock):
        return len(b.content) + (media_chars(b.blocks, b.wire) if b.blocks else 0)
    if isinstance(b, ToolUseBlock):
        return len(b.name) + len(_input_json(b.input))
    if isinstance(b, ThinkingBlock):
        return len(b.thinking) + len(b.signature)
    if b.data.get("type") in ("image", "document"):  # run input: not its base64
        n = _media_chars(b.data, b.wire)
        if n is not None:
            return n
    return len(compact_json(b.data))  # a RawBlock: its JSON (a stored block: its reference)


def message_chars(m: Message) -> int:
    return MESSAGE_OVERHEAD_CHARS + sum(block_chars(b) for b in m.content)


def messages_chars(msgs: Sequence[Message]) -> int:
    return sum(message_chars(m) for m in msgs)


# A tool's definition is fixed for the life of the process (the registry's tools and
# the ones middlewares provide are built once), so its size is measured once, not on
# every run's first call: keyed by name and the identity of its description and schema.
_TOOL_CHARS: dict[tuple[str, int, int], int] = {}


def tools_chars(tools: Sequence[ToolSpec]) -> int:
    total = 0
    for t in tools:
        key = (t.name, id(t.description), id(t.input_schema))
        n = _TOOL_CHARS.get(key)
        if n is None:
            if len(_TOOL_CHARS) > 4096:  # tools made per run (a plugin's): stay bounded
                _TOOL_CHARS.clear()
            n = _TOOL_CHARS[key] = len(json.dumps(t.to_dict(), separators=(",", ":")))
        total += n
    return total


def system_chars(blocks: Sequence[TextBlock]) -> int:
    return sum(len(b.text) for b in blocks)


def request_tokens(usage: Usage) -> int:
    """Everything a request held, as its response reports it."""
    return usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens


class ContextEstimate(BaseModel):
    """The last measured request (persisted with the run, so a resume keeps it)."""

    model_config = ConfigDict(extra="forbid")
    sent_len: int | None = Field(default=None, ge=0)  # history messages it covered
    sent_tokens: int = Field(default=0, ge=0)  # its reported input tokens
    chars_per_token: float = Field(
        default=DEFAULT_CHARS_PER_TOKEN, ge=MIN_CHARS_PER_TOKEN, le=MAX_CHARS_PER_TOKEN
    )

    def tokens(self, chars: int) -> int:
        return math.ceil(chars / self.chars_per_token)

    def next_tokens(
        self, msgs: Sequence[Message], whole_chars: Callable[[], int]
    ) -> tuple[int, int | None]:
        """(estimated tokens of the next request, characters added since the last
        measured one — None when there is no measured request to build on: then
        `whole_chars()`, the whole request in characters, is the estimate's base)."""
        if self.sent_len is None or self.sent_len > len(msgs):
            return self.tokens(whole_chars()), None
        added = messages_chars(msgs[self.sent_len :])
        return self.sent_tokens + self.tokens(added), added

    def observe(self, sent_len: int, reported: int, added_chars: int | None) -> None:
        """A response came back: its request becomes the new baseline, and when only
        known content was added since the last one (`added_chars`), the ratio is
        re-learned from that content's token delta. A response reporting no input
        tokens (a provider without usage) leaves no baseline."""
        if reported <= 0:
            self.forget()
            return
        if added_chars is not None and added_chars >= MIN_CALIBRATION_CHARS:
            delta = reported - self.sent_tokens
            if delta > 0:
                ratio = added_chars / delta
                self.chars_per_token = min(MAX_CHARS_PER_TOKEN, max(MIN_CHARS_PER_TOKEN, ratio))
        self.sent_len = sent_len
        self.sent_tokens = reported

    def forget(self) -> None:
        """The view changed (a compaction): the next request has no baseline."""
        self.sent_len = None
        self.sent_tokens = 0
