"""What the fake checks that the API checks by signature: assistant content comes back
as it was returned.

The API verifies the signature of every thinking block and the opaque `data` of every
redacted_thinking block it is sent, and (with thinking on) refuses a tool loop whose
assistant message does not start with one. The fake goes further, so that a client that
rebuilds, trims or reorders what the model said is caught, whatever the block type:
every assistant message it returns is remembered (`SentLog`), and a request whose
history holds one of them (found by a tool_use id, a server tool's id, a signature or a
redacted block's data) must carry it unchanged: the same JSON value, `cache_control`
aside (a client may mark any block). A tool_use whose input the model sent as something
other than an object is compared with `{}` (a client cannot send the API anything else),
and strings with NUL or lone surrogates as hango stores them (provider/sanitize.py: the
one change hango makes to what it is given, for text Postgres cannot hold).
"""

from __future__ import annotations

import copy
from typing import Any

from hango_worker.provider.sanitize import clean_json
from hango_worker.testing.fake_anthropic.validate import ApiError, content_blocks

THINKING_FIRST = (
    "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). "
    "We recommend you include thinking blocks from previous turns. To avoid this "
    "requirement, disable `thinking`."
)


def _markers(content: list[dict[str, Any]]) -> list[str]:
    out = []
    for b in content:
        for key in ("id", "signature", "data", "tool_use_id"):
            v = b.get(key)
            if isinstance(v, str) and v:
                out.append(f"{b.get('type')}:{key}:{v}")
    return out


def _plain(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


class SentLog:
    """Every assistant message the fake returned, by the markers of its blocks."""

    def __init__(self) -> None:
        self._by_marker: dict[str, list[dict[str, Any]]] = {}

    def add(self, content: list[dict[str, Any]]) -> None:
        kept: list[dict[str, Any]] = clean_json(copy.deepcopy(content))[0]
        for b in kept:
            if b.get("type") == "tool_use" and not isinstance(b.get("input"), dict):
                b["input"] = {}
        for m in _markers(kept):
            self._by_marker[m] = kept

    def clear(self) -> None:
        self._by_marker.clear()

    def origin(self, content: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        for m in _markers(content):
            found = self._by_marker.get(m)
            if found is not None:
                return found
        return None


def _difference(got: list[dict[str, Any]], sent: list[dict[str, Any]]) -> str:
    if len(got) != len(sent):
        return f"{len(got)} blocks, the model returned {len(sent)}"
    for k, (g, s) in enumerate(zip(got, sent, strict=True)):
        if g != s:
            keys = sorted({*g, *s}, key=str)
            diff = [key for key in keys if g.get(key) != s.get(key)]
            return f"content.{k} ({s.get('type')}): {', '.join(map(str, diff))} changed"
    return "the blocks differ"


def check_round_trip(body: dict[str, Any], sent: SentLog) -> None:
    messages = body.get("messages") or []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        got = [_plain(b) for b in content_blocks(m)]
        origin = sent.origin(got)
        if origin is not None and got != origin:
            raise ApiError(
                400,
                "invalid_request_error",
                f"messages.{i}: the assistant message is not the one the model returned "
                f"({_difference(got, origin)}); send assistant content back unchanged "
                "[fake-anthropic round-trip check]",
            )
    _check_thinking_first(body, messages)


def _check_thinking_first(body: dict[str, Any], messages: list[Any]) -> None:
    """With thinking on, the assistant message of the tool loop in progress (the last
    one, answered by tool results) must start with its thinking, as the API requires."""
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
        return
    for i in range(len(messages) - 1, -1, -1):
        m = messages[i]
        if not isinstance(m, dict) or m.get("role") != "assistant":
            continue
        blocks = content_blocks(m)
        if not any(b.get("type") == "tool_use" for b in blocks):
            return
        found = blocks[0].get("type") if blocks else "nothing"
        if found not in ("thinking", "redacted_thinking"):
            raise ApiError(400, "invalid_request_error", THINKING_FIRST.format(i=i, found=found))
        return
