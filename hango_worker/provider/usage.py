"""Usage: what a model call used, as the API reported it, and a run's total of it.

What is priced is in provider/prices.py; the stored shape is `Usage.to_dict` (the
`usage` of each `model_message` event, and `runs.usage` for a run's total).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

JSON: TypeAlias = Any

# The token counters of a Usage, summed by `add` (thinking_tokens is a part of output_tokens).
USAGE_COUNTS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "cache_creation_1h_input_tokens",
    "thinking_tokens",
)
# The API's usage fields Usage reads (`from_api`); any other is kept in `extra` as it came.
_API_READ = frozenset(
    (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
        "server_tool_use",
        "service_tier",
        "speed",
        "inference_geo",
    )
)
_PART_READ = {
    "cache_creation": {"ephemeral_1h_input_tokens", "ephemeral_5m_input_tokens"},
    "output_tokens_details": {"thinking_tokens"},
}


def _count(v: JSON, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float | None):
        raise ValueError(f"{what} must be a count, got {v!r}"[:200])
    return int(v or 0)


def _counts(d: JSON, what: str) -> dict[str, int] | None:
    if d is None:
        return None
    if not isinstance(d, dict):
        raise ValueError(f"{what} must be an object of counts, got {d!r}"[:200])
    return {str(k): _count(v, f"{what}.{k}") for k, v in d.items()} or None


def _label(v: JSON, what: str) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise ValueError(f"{what} must be a string, got {v!r}"[:200])


def _merge_counts(into: dict[str, int] | None, more: dict[str, int]) -> dict[str, int]:
    out = dict(into) if into else {}
    for k, n in more.items():
        out[k] = out.get(k, 0) + n
    return out


@dataclass(slots=True)
class Usage:
    """One response's usage as the API reported it, or a run's total (`add`).

    The priced units (provider/prices.py): the token counts, `server_tool_use` (billed
    server-tool units by the API's name: web_search_requests, web_fetch_requests, any
    counter added later) and one response's `service_tier`, `speed` and
    `inference_geo` (price multipliers). A total has no single tier: `service_tiers`
    counts its responses per tier. `extra` keeps one response's other usage fields as
    they came (`iterations`, `fallback_credit`, fields added later)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    # the part of cache_creation_input_tokens written with the 1 h TTL (priced higher)
    cache_creation_1h_input_tokens: int = 0
    # the part of output_tokens the model spent thinking (billed as output)
    thinking_tokens: int = 0
    server_tool_use: dict[str, int] | None = None
    service_tier: str | None = None
    speed: str | None = None
    inference_geo: str | None = None
    extra: dict[str, JSON] | None = None
    service_tiers: dict[str, int] | None = None  # a total's responses per tier

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cache_read_input_tokens += other.cache_read_input_tokens
        self.cache_creation_input_tokens += other.cache_creation_input_tokens
        self.cache_creation_1h_input_tokens += other.cache_creation_1h_input_tokens
        self.thinking_tokens += other.thinking_tokens
        if other.server_tool_use:
            self.server_tool_use = _merge_counts(self.server_tool_use, other.server_tool_use)
        if other.service_tier is not None:
            self.service_tiers = _merge_counts(self.service_tiers, {other.service_tier: 1})
        if other.service_tiers:
            self.service_tiers = _merge_counts(self.service_tiers, other.service_tiers)

    def to_dict(self) -> dict[str, JSON]:
        """The stored shape: the five token counts always, the rest when present."""
        d: dict[str, JSON] = {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_creation_1h_input_tokens": self.cache_creation_1h_input_tokens,
        }
        if self.thinking_tokens:
            d["thinking_tokens"] = self.thinking_tokens
        if self.server_tool_use:
            d["server_tool_use"] = dict(self.server_tool_use)
        for key in ("service_tier", "speed", "inference_geo"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        if self.service_tiers:
            d["service_tiers"] = dict(self.service_tiers)
        if self.extra:
            d.update({k: v for k, v in self.extra.items() if k not in d})
        return d

    @classmethod
    def from_dict(cls, d: dict[str, JSON] | None) -> Usage:
        """From the stored shape (`to_dict`); ValueError/TypeError for a value that is
        not what it should be."""
        d = d or {}
        n = [int(d.get(k, 0) or 0) for k in USAGE_COUNTS]
        u = cls(n[0], n[1], n[2], n[3], n[4], n[5])
        u.server_tool_use = _counts(d.get("server_tool_use"), "server_tool_use")
        u.service_tiers = _counts(d.get("service_tiers"), "service_tiers")
        u.service_tier = _label(d.get("service_tier"), "service_tier")
        u.speed = _label(d.get("speed"), "speed")
        u.inference_geo = _label(d.get("inference_geo"), "inference_geo")
        return u

    @classmethod
    def from_api(cls, d: dict[str, JSON] | None) -> Usage:
        """From the API's usage object (nested `cache_creation`, `output_tokens_details`,
        `server_tool_use`); the fields it does not read go to `extra`, as they came."""
        d = d or {}
        creation = d.get("cache_creation") or {}
        details = d.get("output_tokens_details") or {}
        u = cls(
            input_tokens=_count(d.get("input_tokens"), "input_tokens"),
            output_tokens=_count(d.get("output_tokens"), "output_tokens"),
            cache_read_input_tokens=_count(d.get("cache_read_input_tokens"), "cache reads"),
            cache_creation_input_tokens=_count(d.get("cache_creation_input_tokens"), "writes"),
            cache_creation_1h_input_tokens=_count(
                creation.get("ephemeral_1h_input_tokens", d.get("cache_creation_1h_input_tokens")),
                "cache_creation.ephemeral_1h_input_tokens",
            ),
            thinking_tokens=_count(
                details.get("thinking_tokens", d.get("thinking_tokens")), "thinking_tokens"
            ),
            server_tool_use=_counts(d.get("server_tool_use"), "server_tool_use"),
            service_tier=_label(d.get("service_tier"), "service_tier"),
            speed=_label(d.get("speed"), "speed"),
            inference_geo=_label(d.get("inference_geo"), "inference_geo"),
        )
        u.extra = usage_extra(d)
        return u


def usage_extra(d: dict[str, JSON]) -> dict[str, JSON] | None:
    """The fields of an API usage object `Usage` does not read (null ones left out),
    as they came; `cache_creation` and `output_tokens_details` only when they carry
    more than what is read of them."""
    out: dict[str, JSON] = {}
    for k, v in d.items():
        if v is None or k in _API_READ or k in USAGE_COUNTS:
            continue
        part = _PART_READ.get(k)
        if part is not None and isinstance(v, dict) and v.keys() <= part:
            continue
        out[k] = v
    return out or None
