"""Model prices (USD per million tokens) and the cost of a model call.

The defaults are Anthropic's list prices for the Claude models at the time of
writing (platform.claude.com pricing page: base input, 5 m cache writes = 1.25 x
input, 1 h cache writes = 2 x input, cache hits = 0.1 x input, output). Long-context
surcharges, batch discounts and regional multipliers are not modelled. Operators
override or add models with `HANGO_MODEL_PRICES` (docs/operations.md).

A model is looked up by its exact name, then without a dated snapshot suffix
(`claude-sonnet-4-5-20250929` → `claude-sonnet-4-5`). An unknown model has no
price: its cost is unknown (`None`), never 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from hango_worker.provider.types import Usage

PER = 1_000_000.0
_SNAPSHOT = re.compile(r"-(\d{8}|latest)$")


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """USD per million tokens of each kind."""

    input: float
    output: float
    cache_write_5m: float
    cache_write_1h: float
    cache_read: float

    @classmethod
    def standard(cls, input: float, output: float) -> ModelPrice:
        """The API's cache multipliers applied to an input price."""
        return cls(input, output, input * 1.25, input * 2.0, input * 0.1)

    def cost(self, u: Usage) -> float:
        """USD for `u`: cache writes at 1 h are the 1 h part, the rest is 5 m."""
        write_1h = u.cache_creation_1h_input_tokens
        write_5m = u.cache_creation_input_tokens - write_1h
        return (
            u.input_tokens * self.input
            + u.output_tokens * self.output
            + write_5m * self.cache_write_5m
            + write_1h * self.cache_write_1h
            + u.cache_read_input_tokens * self.cache_read
        ) / PER


PRICE_FIELDS = tuple(f.name for f in fields(ModelPrice))

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
    """The defaults with `overrides` (model → the five prices) laid over them."""

    def __init__(self, overrides: Mapping[str, Mapping[str, float]] | None = None) -> None:
        self.prices = dict(DEFAULT_PRICES)
        for model, p in (overrides or {}).items():
            self.prices[model] = ModelPrice(**{k: float(p[k]) for k in PRICE_FIELDS})

    def lookup(self, model: str) -> ModelPrice | None:
        price = self.prices.get(model)
        if price is None:
            price = self.prices.get(_SNAPSHOT.sub("", model))
        return price

    def cost(self, model: str, usage: Usage) -> float | None:
        """USD for `usage` of `model`, or None when the model has no price."""
        price = self.lookup(model)
        return None if price is None else price.cost(usage)
