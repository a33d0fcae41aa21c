"""The fake's token counting: deterministic, documented, and the same everywhere.

A request's input tokens are the sum over its *segments*, in prefix order (tools,
then system, then messages):

- a segment is one tool definition, one system block or one message content block;
- it costs ``ceil(chars / 4)`` tokens, where ``chars`` is the text of a ``text``
  block, the content text of a ``tool_result`` (a string, or the concatenated
  ``text`` parts of a list), the tool name plus the compact JSON of the input of a
  ``tool_use``, the text of a ``thinking`` block, and the canonical JSON
  (sorted keys, no spaces, ``cache_control`` left out) of anything else,
  including each tool definition; a base64 image counts `IMAGE_TOKENS`, a base64 PDF
  `PDF_TOKENS`, whatever their size (a Files API `file` source too: a document's
  counts `PDF_TOKENS`);
- each tool definition adds `TOOL_OVERHEAD_TOKENS`, each message
  `MESSAGE_OVERHEAD_TOKENS` (counted with its first block).

`count_tokens(body)` is what ``POST /v1/messages/count_tokens`` answers, what the
context window is checked against, and equals ``input_tokens +
cache_read_input_tokens + cache_creation_input_tokens`` of the response.
"""

from __future__ import annotations

import json
from typing import Any

from hango_worker.testing.fake_anthropic.validate import content_blocks

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4
TOOL_OVERHEAD_TOKENS = 4
# a base64 image or PDF: a flat count, as the API counts pixels and pages, not characters
IMAGE_TOKENS = 1600  # about a 1.15 megapixel image (width * height / 750)
PDF_TOKENS = 3000  # a page of text and its image


def _ceil_tokens(chars: int) -> int:
    return -(-chars // CHARS_PER_TOKEN)


def _canonical(block: dict[str, Any]) -> str:
    plain = {k: v for k, v in block.items() if k != "cache_control"}
    return json.dumps(plain, sort_keys=True, separators=(",", ":"))


def block_chars(block: dict[str, Any]) -> int:
    """The characters one content block is counted by (see the module docstring)."""
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        return len(block["text"])
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return len(content)
        if isinstance(content, list):
            return sum(len(str(p.get("text", ""))) for p in content if isinstance(p, dict))
        return len(json.dumps(content))
    if kind == "tool_use":
        raw = json.dumps(block.get("input"), separators=(",", ":"))
        return len(str(block.get("name", ""))) + len(raw)
    if kind == "thinking" and isinstance(block.get("thinking"), str):
        return len(block["thinking"])
    source = block.get("source")
    # a base64 image or PDF: the API's estimates, not the base64's length
    if kind in ("image", "document") and isinstance(source, dict):
        base64 = source.get("type") == "file" or (
            source.get("type") == "base64" and bool(source.get("data"))
        )
        tokens = IMAGE_TOKENS if kind == "image" else PDF_TOKENS
        return tokens * CHARS_PER_TOKEN if base64 else len(_canonical(block))
    return len(_canonical(block))


def segments(body: dict[str, Any]) -> list[tuple[str, int, Any]]:
    """(canonical text, tokens, cache_control) per segment, in prefix order."""
    out: list[tuple[str, int, Any]] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            raw = _canonical(tool)
            n = _ceil_tokens(len(raw)) + TOOL_OVERHEAD_TOKENS
            out.append(("tool" + raw, n, tool.get("cache_control")))
    system = body.get("system")
    blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system
    for b in blocks if isinstance(blocks, list) else []:
        if isinstance(b, dict):
            tokens = _ceil_tokens(block_chars(b))
            out.append(("system" + _canonical(b), tokens, b.get("cache_control")))
    for m in body.get("messages") or []:
        if not isinstance(m, dict):
            continue
        role = str(m.get("role"))
        content = m.get("content")
        mblocks = content_blocks(m)
        if isinstance(content, str):
            mblocks = [{"type": "text", "text": content}]
        if not mblocks:
            out.append((role, MESSAGE_OVERHEAD_TOKENS, None))
        for i, b in enumerate(mblocks):
            tokens = _ceil_tokens(block_chars(b)) + (MESSAGE_OVERHEAD_TOKENS if i == 0 else 0)
            out.append((role + _canonical(b), tokens, b.get("cache_control")))
    return out


def count_tokens(body: dict[str, Any]) -> int:
    """A request's input tokens (cache reads and writes included)."""
    return sum(n for _, n, _ in segments(body))
