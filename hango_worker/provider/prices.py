"""Model prices and the cost of a model call: every priced unit the API reports.

A call's cost (`ModelPrice.cost`, `PriceTable.cost`) is, in USD:

- its tokens at the model's prices (USD per million): input, output (thinking tokens
  are a part of `output_tokens`, billed as output), cache writes at 5 m and at 1 h
  (`cache_creation.ephemeral_1h_input_tokens` is the 1 h part), cache reads;
- times the multipliers of the tier, speed and geography the API says it ran at
  (`usage.service_tier`: standard 1, batch 0.5; `usage.speed`: standard 1;
  `usage.inference_geo`: global 1, us 1.1);
- plus each server-tool unit (`usage.server_tool_use`) at its price per unit (web
  search $10 per 1,000 requests; web fetch is free beyond its tokens).

A unit with no price makes the cost unknown (`None`), never 0: a model without a price,
a tier (`priority`: contract prices), a speed (`fast`: a per-model premium), a
geography or a server-tool counter the table does not price. `ModelPrice.unpriced`
names it. Code execution time is not in the API's usage, so it is not priced here.

The defaults are Anthropic's list prices for the Claude models at the time of
writing (platform.claude.com pricing page: base input, 5 m cache writes = 1.25 x
input, 1 h cache writes = 2 x input, cache hits = 0.1 x input, output). Long-context
surcharges are not modelled. Operators override or add models, and each model's unit
prices and multipliers, with `HANGO_MODEL_PRICES` (docs/operations.md).

A model is looked up by its exact name, then without a dated snapshot suffix
(`claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`). On Bedrock and Vertex AI the same
list prices apply unless HANGO_MODEL_PRICES prices the model for the platform, keyed
`"bedrock/<model>"` or `"vertex/<model>"` (`PriceTable.on_platform`; e.g. the 10%
premium of a regional endpoint). An unknown model has no
price: its cost is unknown (`None`), never 0.

For spend accounting outside a run: `PriceTable.lookup(model)` gives a model's
`ModelPrice` (or None); `PriceTable.cost(model, usage)` and `ModelPrice.cost(usage)`
give one call's exact cost (None: unknown).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from hango_worker.provider.types import Usage

PER = 1_000_000.0
_SNAPSHOT = re.compile(r"-(\d{8}|latest)$")


# USD per unit of each counter in usage.server_tool_use
SERVER_TOOL_PRICES: Mapping[str, float] = MappingProxyType(
    {"web_search_requests": 10.0 / 1000, "web_fetch_requests": 0.0}
)
# Multipliers on the token prices, by the value the API reports in usage. Priority Tier
# is billed at each organisation's contract prices and fast mode at a per-model premium:
# neither has a default (set them per model in HANGO_MODEL_PRICES).
SERVICE_TIERS: Mapping[str, float] = MappingProxyType({"standard": 1.0, "batch": 0.5})
SPEEDS: Mapping[str, float] = MappingProxyType({"standard": 1.0})
INFERENCE_GEOS: Mapping[str, float] = MappingProxyType({"global": 1.0, "us": 1.1})
# The keys of HANGO_MODEL_PRICES beyond the five token prices: each a JSON object laid
# over the default of the same name (the field of ModelPrice).
UNIT_FIELDS = ("server_tool_use", "service_tier", "speed", "inference_geo")


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens of each kind; USD per server-tool unit; the multipliers."""

    input: float
    output: float
    cache_write_5m: float
    cache_write_1h: float
    cache_read: float
    server_tool_use: Mapping[str, float] = field(default_factory=lambda: SERVER_TOOL_PRICES)
    service_tier: Mapping[str, float] = field(default_factory=lambda: SERVICE_TIERS)
    speed: Mapping[str, float] = field(default_factory=lambda: SPEEDS)
    inference_geo: Mapping[str, float] = field(default_factory=lambda: INFERENCE_GEOS)

    @classmethod
    def standard(cls, input: float, output: float) -> ModelPrice:
        """The API's cache multipliers applied to an input price."""
        return cls(input, output, input * 1.25, input * 2.0, input * 0.1)

    def token_cost(self, u: Usage) -> float:
        """USD for `u`'s tokens at the standard tier: cache writes at 1 h are the 1 h
        part, the rest is 5 m; thinking tokens are in output_tokens."""
        write_1h = u.cache_creation_1h_input_tokens
        write_5m = u.cache_creation_input_tokens - write_1h
        return (
            u.input_tokens * self.input
            + u.output_tokens * self.output
            + write_5m * self.cache_write_5m
            + write_1h * self.cache_write_1h
            + u.cache_read_input_tokens * self.cache_read
        ) / PER

    def cost(self, u: Usage) -> float | None:
        """USD for one call's usage `u`, every unit priced; None when a unit has no
        price (`unpriced` names it)."""
        m = 1.0
        for rates, value in (
            (self.service_tier, u.service_tier),
            (self.speed, u.speed),
            (self.inference_geo, u.inference_geo),
        ):
            if value is not None:
                rate = rates.get(value)
                if rate is None:
                    return None
                m *= rate
        usd = self.token_cost(u) * m
        for unit, n in (u.server_tool_use or {}).items():
            if n:
                each = self.server_tool_use.get(unit)
                if each is None:
                    return None
                usd += n * each
        return usd

    def unpriced(self, u: Usage) -> str | None:
        """The first unit of `u` this price does not cover, as `field=value` or
        `server_tool_use.<counter>`; None when every unit has a price."""
        for name in ("service_tier", "speed", "inference_geo"):
            value = getattr(u, name)
            if value is not None and value not in getattr(self, name):
                return f"{name}={value}"
        for unit, n in (u.server_tool_use or {}).items():
            if n and unit not in self.server_tool_use:
                return f"server_tool_use.{unit}"
        return None


PRICE_FIELDS = ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read")

_OPUS_4 = ModelPrice.standard(15.0, 75.0)
_OPUS_45 = ModelPrice.standard(5.0, 25.0)
_SONNET = ModelPrice.standard(3.0, 15.0)
DEFAULT_PRICES: dict[str, ModelPrice] = {
    "claude-opus-4-6": _OPUS_45,
    "claude-opus-4-5": _OPUS_45,
    "claude-opus-4-1": _OPUS_4,
    "claude-opus-4-0": _OPUS_4,
    "claude-opus-4": _OPUS_4,
    "claude-sonnet-4-6": _SONNET,
    "claude-sonnet-4-5": _SONNET,
    "claude-sonnet-4-0": _SONNET,
    "claude-sonnet-4": _SONNET,
    "claude-3-7-sonnet": _SONNET,
    "claude-haiku-4-5": ModelPrice.standard(1.0, 5.0),
    "claude-3-5-haiku": ModelPrice(0.8, 4.0, 1.0, 1.6, 0.08),
    "claude-3-haiku": ModelPrice(0.25, 1.25, 0.30, 0.50, 0.03),
}


class PriceTable:
    """The defaults with `overrides` (model → the five prices, and optionally any of
    UNIT_FIELDS, each laid over its default) laid over them."""

    def __init__(self, overrides: Mapping[str, Mapping[str, object]] | None = None) -> None:
        self.prices = dict(DEFAULT_PRICES)
        for model, p in (overrides or {}).items():
            self.prices[model] = model_price(p)
        self._platforms: dict[str, PriceTable] = {}

    def on_platform(self, platform: str) -> PriceTable:
        """The prices of calls on `platform` (provider/platforms.py): each
        `"<platform>/<model>"` entry laid over `<model>`'s (HANGO_MODEL_PRICES
        `{"bedrock/claude-sonnet-4-5": {...}}`); the others as on the Anthropic API."""
        if platform == "anthropic":
            return self
        found = self._platforms.get(platform)
        if found is None:
            prefix = platform + "/"
            own = {k[len(prefix) :]: v for k, v in self.prices.items() if k.startswith(prefix)}
            found = PriceTable()
            found.prices = {**self.prices, **own}
            self._platforms[platform] = found
        return found

    def lookup(self, model: str) -> ModelPrice | None:
        price = self.prices.get(model)
        if price is None:
            price = self.prices.get(_SNAPSHOT.sub("", model))
        return price

    def cost(self, model: str, usage: Usage) -> float | None:
        """USD for one call's `usage` of `model`, or None when the model, or a unit of
        the call, has no price."""
        price = self.lookup(model)
        return None if price is None else price.cost(usage)


def model_price(p: Mapping[str, object]) -> ModelPrice:
    """A ModelPrice from one HANGO_MODEL_PRICES entry: the five token prices, and the
    unit prices and multipliers it gives laid over the defaults."""
    t = [_number(p[k]) for k in PRICE_FIELDS]
    base = ModelPrice(t[0], t[1], t[2], t[3], t[4])
    units: dict[str, Any] = {}
    for name in UNIT_FIELDS:
        given = p.get(name)
        if isinstance(given, Mapping) and given:
            merged = {**getattr(base, name), **{str(k): _number(v) for k, v in given.items()}}
            units[name] = MappingProxyType(merged)
    return replace(base, **units)


def _number(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"a price must be a number, got {v!r}")
    return float(v)
