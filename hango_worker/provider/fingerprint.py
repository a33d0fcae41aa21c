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

The messages' hash is chained (each message's sha256 folded into the hash of those
before it), so a run's `Fingerprints` hashes only a turn's new messages; the other
parts are hashed again only when they change.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

from hango_worker.provider.types import Message, Request

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


class Fingerprints:
    """One run's fingerprints, each part computed only when it changed since the last
    request: the system blocks and the parameters when their values differ, the tools
    when their definitions are other objects, and the messages from the first one that
    is not the same object as in the last request (the ones before it keep their
    chained hashes). A message is never edited once sent (the history is appended to;
    compaction and the request rewrites make new messages), so the same object is the
    same message."""

    __slots__ = ("_chain", "_params", "_sent", "_system", "_tools")

    def __init__(self) -> None:
        self._system: tuple[Any, str] | None = None
        self._tools: tuple[Any, str] | None = None
        self._params: tuple[Any, str] | None = None
        self._sent: list[Message] = []  # the last request's messages
        self._chain: list[bytes] = [b""]  # [i]: the hash of its first i messages

    def of(self, request: Request) -> dict[str, Any]:
        return {
            "system": self._system_digest(request),
            "tools": self._tools_digest(request),
            "messages": self._messages_digest(request.messages),
            "n": len(request.messages),
            "params": self._params_digest(request),
        }

    def _system_digest(self, request: Request) -> str:
        key = tuple((b.text, b.cache_control, b.extra) for b in request.system)
        if self._system is None or self._system[0] != key:
            self._system = (key, digest([b.to_dict() for b in request.system]))
        return self._system[1]

    def _tools_digest(self, request: Request) -> str:
        key = (
            tuple((t.name, t.description, t.input_schema, t.cache_control) for t in request.tools),
            request.server_tools,
        )
        if self._tools is None or self._tools[0] != key:
            self._tools = (key, digest(tools_of(request)))
        return self._tools[1]

    def _params_digest(self, request: Request) -> str:
        params = params_of(request)
        if self._params is None or self._params[0] != params:
            self._params = (params, digest(params))
        return self._params[1]

    def _messages_digest(self, messages: list[Message]) -> str:
        sent, chain = self._sent, self._chain
        k = min(len(sent), len(messages))
        while k and messages[k - 1] is not sent[k - 1]:  # the copies at the end
            k -= 1
        if k and messages[:k] != sent[:k]:  # same objects (or equal) before them: a C loop
            k = 0
        del chain[k + 1 :]
        for m in messages[k:]:
            one = hashlib.sha256(canonical_json(m.to_dict()).encode()).digest()
            chain.append(hashlib.sha256(chain[-1] + one).digest())
        self._sent = list(messages)
        return chain[-1].hex()[:16] if messages else digest([])


def fingerprint(request: Request, run: Fingerprints | None = None) -> dict[str, Any]:
    """The request's fingerprint (the module docstring); `run`: the run's `Fingerprints`,
    which computes only what changed since its last request."""
    return (run or Fingerprints()).of(request)


def first_difference(recorded: dict[str, Any], new: dict[str, Any]) -> str | None:
    """The first field (FIELDS order) whose hash differs, or None."""
    for f in FIELDS:
        if f == "messages":
            if (recorded.get("messages"), recorded.get("n")) != (new["messages"], new["n"]):
                return f
        elif recorded.get(f) != new[f]:
            return f
    return None
