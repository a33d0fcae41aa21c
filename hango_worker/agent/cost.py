"""A run attempt's cost in USD, priced response by response (provider/prices.py).

Each response's usage is priced with the agent's model (`gen_ai.request.model`): its
tokens (thinking in output), cache writes at 5 m and 1 h, cache reads, server-tool units
and the tier, speed and geography it ran at. Priced responses are counted in
`hango_model_cost_usd_total`. A model without a price, or a unit of a response without
one (a `priority` tier, a server-tool counter the table does not know, …), makes the
run's cost unknown (`None`, never 0): counted in `hango_model_price_unknown_total` (once
per attempt) or `hango_model_unpriced_units_total{unit}` (per response), and recorded as
the `model.price_unknown` span event (naming the unit); logged as a warning once per
model and unit and process.
"""

from __future__ import annotations

import logging

from hango_worker.provider.prices import PriceTable
from hango_worker.provider.types import Usage
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import current_turn_span

log = logging.getLogger(__name__)
PRICE_UNKNOWN = "model.price_unknown"
_warned: set[tuple[str, str]] = set()


class RunCost:
    def __init__(self, prices: PriceTable, model: str) -> None:
        self.model = model
        self.prices = prices
        self.price = prices.lookup(model)
        self._usd = 0.0
        self._before: float | None = 0.0  # earlier attempts of the run
        self._unknown: set[str] = set()  # what made this attempt's cost unknown

    @property
    def usd(self) -> float | None:
        """USD so far (earlier attempts included); None when some of it has no price."""
        if self.price is None or self._before is None or self._unknown:
            return None
        return self._before + self._usd

    @property
    def unpriced(self) -> str | None:
        """The units of this attempt that had no price (None: none, or the model)."""
        units = sorted(self._unknown - {"model"})
        return ", ".join(units) if units and self.price is not None else None

    def carry(self, before: float | None, unpriced: str | None = None) -> None:
        """Start from what earlier attempts cost (None: unknown, and so is the total;
        `unpriced`: the units that made it so, kept in the record)."""
        self._before = None if before is None or self._before is None else self._before + before
        if before is None and unpriced:
            self._unknown.update(unpriced.split(", "))

    def add(self, usage: Usage, model: str | None = None) -> float:
        """Price one response of the agent's model (or of `model`: a summary call's);
        returns its cost (0.0 when it has no price)."""
        model = model or self.model
        price = self.price if model == self.model else self.prices.lookup(model)
        if price is not None:
            cost = price.cost(usage)
            if cost is not None:
                self._usd += cost
                metrics.child(metrics.MODEL_COST, model).inc(cost)
                return cost
            unit = price.unpriced(usage) or "unknown"
            metrics.child(metrics.MODEL_UNPRICED_UNITS, model, unit).inc()
            self._unknown_once(model, unit, "add its price to HANGO_MODEL_PRICES")
            return 0.0
        unit = "model" if model == self.model else f"model={model}"  # a summary model's
        if unit not in self._unknown:  # once per attempt
            metrics.MODEL_PRICE_UNKNOWN.labels(model).inc()
        self._unknown_once(model, unit, "add it to HANGO_MODEL_PRICES")
        return 0.0

    def _unknown_once(self, model: str, unit: str, fix: str) -> None:
        if unit in self._unknown:
            return
        self._unknown.add(unit)
        attrs = {"gen_ai.request.model": model, "hango.price.unit": unit}
        current_turn_span().add_event(PRICE_UNKNOWN, attrs)
        if (model, unit) not in _warned:  # the log line: once per model, unit, process
            _warned.add((model, unit))
            what = "has no price" if unit == "model" else f"has no price for {unit}"
            log.warning("model %r %s: the cost of its runs is unknown (%s)", model, what, fix)
