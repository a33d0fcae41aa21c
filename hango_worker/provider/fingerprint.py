"""A request's fingerprint: what the model was sent, in a few short hashes.

Every model call of the loop records one in its `model_message` event (`request`), so
`hango-worker replay` can tell, field by field, whether the current code would send the
same request (docs/operations.md, "Change agents safely"). A field's hash is the first
16 hex digits of the sha256 of its canonical JSON (keys sorted: jsonb keeps no key
order, and a replayed history comes back from Postgres):

- `system`: the system blocks as sent (cache breakpoints included);
- `tools`: the tool definitions as sent, then the Anthropic-defined (server) tools;
- `messages`: the messages as sent, and `n`, how many;
- `params`: model, max_tokens, tool_choice, temperature, thinking and the API parameters.

A message's hash is computed once: `MessageHashes` keeps it with the message and its
blocks (the objects, not their ids) and reuses it while the message holds the same
blocks, so a turn hashes its new messages only (plus a 32-byte digest per message).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from hango_worker.provider.types import Block, Message, Request

FIELDS = ("system", "tools", "messages", "params")  # compared in this order

canonical_json: Callable[[Any], str] = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), sort_keys=True
).encode


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()[:16]


def params_of(request: Request) -> dict[str, Any]:
    """The request's parameters besides system, tools and messages."""
    return {
        "model": request.model,
        "max_tokens": request.max_tokens,
        "tool_choice": request.tool_choice,
        "temperature": request.temperature,
        "thinking": request.thinking,
        "params": request.params,
    }


def tools_of(request: Request) -> list[Any]:
    return [t.to_dict() for t in request.tools] + list(request.server_tools or [])


class MessageHashes:
    """Each message's sha256, kept while the message holds the same block objects."""

    __slots__ = ("_known",)

    def __init__(self) -> None:
        self._known: dict[int, tuple[Message, tuple[Block, ...], bytes]] = {}

    def of(self, messages: Sequence[Message]) -> str:
        known, now = self._known, {}
        h = hashlib.sha256()
        for m in messages:
            found = known.get(id(m))
            if (
                found is not None
                and found[0] is m
                and len(found[1]) == len(m.content)
                and all(a is b for a, b in zip(found[1], m.content, strict=True))
            ):
                d = found[2]
            else:
                d = hashlib.sha256(canonical_json(m.to_dict()).encode()).digest()
                found = (m, tuple(m.content), d)
            now[id(m)] = found
            h.update(d)
        self._known = now  # only this request's messages: copies made for one call go
        return h.hexdigest()[:16]


def fingerprint(request: Request, hashes: MessageHashes | None = None) -> dict[str, Any]:
    """The request's fingerprint (the module docstring)."""
    return {
        "system": digest([b.to_dict() for b in request.system]),
        "tools": digest(tools_of(request)),
        "messages": (hashes or MessageHashes()).of(request.messages),
        "n": len(request.messages),
        "params": digest(params_of(request)),
    }


def first_difference(recorded: dict[str, Any], new: dict[str, Any]) -> str | None:
    """The first field (FIELDS order) whose hash differs, or None."""
    for f in FIELDS:
        if f == "messages":
            if (recorded.get("messages"), recorded.get("n")) != (new["messages"], new["n"]):
                return f
        elif recorded.get(f) != new[f]:
            return f
    return None
