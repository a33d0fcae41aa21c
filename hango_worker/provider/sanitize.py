"""One rule for text that is stored or shown: what Postgres and UTF-8 refuse is replaced.

Postgres `jsonb` and `text` refuse the NUL character (U+0000), and a lone UTF-16
surrogate (U+D800 to U+DFFF, not part of a pair) cannot be encoded as UTF-8 at
all; either, in model output or a tool result, would fail the run when it is
stored. The rule, applied before anything is stored: each NUL and each lone
surrogate becomes U+FFFD (the replacement character); a surrogate pair that a
stream delivered as two halves becomes the character it encodes. Nothing else
is changed, and the length in characters stays the same unless a pair is
joined. Where it happens: the providers' response assembly (`clean_message`),
`ToolResult` creation and `ModelError` (`clean_text`); the first two record a
`hango.text.sanitized` span event with the number of characters replaced.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace

from hango_worker.provider.types import (
    REPLACEMENT,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    clean_text,
)

__all__ = ["REPLACEMENT", "clean_json", "clean_message", "clean_text", "record_sanitized"]

SANITIZED_EVENT = "hango.text.sanitized"


def clean_json(value: Any) -> tuple[Any, int]:
    """`value` (decoded JSON) with every string, keys included, cleaned; and the count."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        out, total = [], 0
        for v in value:
            c, n = clean_json(v)
            out.append(c)
            total += n
        return (out, total) if total else (value, 0)
    if isinstance(value, dict):
        d, total = {}, 0
        for k, v in value.items():
            ck, nk = clean_text(k) if isinstance(k, str) else (k, 0)
            cv, nv = clean_json(v)
            d[ck] = cv
            total += nk + nv
        return (d, total) if total else (value, 0)
    return value, 0


def clean_message(message: Message) -> int:
    """Clean every string of a message in place; returns how many characters were replaced."""
    total = 0
    for b in message.content:
        if isinstance(b, TextBlock):
            b.text, n = clean_text(b.text)
        elif isinstance(b, ThinkingBlock):
            b.thinking, n = clean_text(b.thinking)
        elif isinstance(b, ToolUseBlock):
            b.id, n1 = clean_text(b.id)
            b.name, n2 = clean_text(b.name)
            b.input, n3 = clean_json(b.input)
            n = n1 + n2 + n3
        elif isinstance(b, ToolResultBlock):
            b.content, n = clean_text(b.content)
        else:  # a RawBlock: opaque, sent back exactly as the API returned it
            n = 0
        total += n
    return total


def record_sanitized(where: str, count: int, span: Any = None) -> None:
    """The span event saying text was sanitised (on `span`, else the current span)."""
    if count:
        (span or trace.get_current_span()).add_event(
            SANITIZED_EVENT, {"hango.sanitized.where": where, "hango.sanitized.count": count}
        )
