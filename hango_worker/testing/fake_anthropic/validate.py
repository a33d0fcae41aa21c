"""Request validation with the real API's error messages (400 invalid_request_error)."""

from __future__ import annotations

from typing import Any

MAX_CACHE_BREAKPOINTS = 4


class ApiError(Exception):
    """An error response: status, error type and message as the API words them."""

    def __init__(
        self, status: int, type: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.type, self.message = status, type, message
        self.headers = dict(headers or {})  # extra response headers (e.g. a 429's)


def content_blocks(message: Any) -> list[dict[str, Any]]:
    content = message.get("content") if isinstance(message, dict) else None
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _tool_use_ids(message: Any) -> list[str]:
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return []
    return [str(b.get("id")) for b in content_blocks(message) if b.get("type") == "tool_use"]


def _leading_result_ids(message: Any) -> set[str]:
    ids: set[str] = set()
    if not isinstance(message, dict) or message.get("role") != "user":
        return ids
    for b in content_blocks(message):
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
            for k, b in enumerate(content_blocks(m)):
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
        items.extend(content_blocks(m))
    return sum(1 for b in items if isinstance(b, dict) and b.get("cache_control"))


def _marked(body: dict[str, Any]) -> list[tuple[str, Any]]:
    """(path, cache_control) of every marked block, in the API's order: tools, system, messages."""
    out: list[tuple[str, Any]] = []
    for key in ("tools", "system"):
        if isinstance(body.get(key), list):
            out += [(f"{key}.{i}", b.get("cache_control")) for i, b in enumerate(body[key])]
    for i, m in enumerate(body.get("messages") or []):
        blocks = content_blocks(m)
        out += [(f"messages.{i}.content.{j}", b.get("cache_control")) for j, b in enumerate(blocks)]
    return [(path, cc) for path, cc in out if isinstance(cc, dict)]


def check_ttl_order(body: dict[str, Any]) -> None:
    """The API refuses a 1 h breakpoint after a 5 m one (in tools, system, messages order)."""
    seen_5m = False
    for path, cc in _marked(body):
        if cc.get("ttl", "5m") == "1h" and seen_5m:
            raise ApiError(
                400,
                "invalid_request_error",
                f"{path}.cache_control.ttl: a ttl='1h' cache_control block must not come after "
                "a ttl='5m' cache_control block. Note that blocks are processed in the following "
                "order: `tools`, `system`, `messages`.",
            )
        seen_5m = seen_5m or cc.get("ttl", "5m") != "1h"


def validate_request(body: Any, headers: dict[str, str], *, counting: bool = False) -> None:
    """Raise ApiError the way the API does, for the rules this fake knows
    (`counting`: a count_tokens request, which needs no `max_tokens`)."""
    if "anthropic-version" not in headers:
        raise ApiError(400, "invalid_request_error", "anthropic-version: header is required")
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request_error", "The request body is not valid JSON.")
    for key in ("model", "messages") if counting else ("model", "max_tokens", "messages"):
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
    check_ttl_order(body)
