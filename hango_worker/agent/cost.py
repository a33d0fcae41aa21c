"""A run attempt's cost in USD, priced response by response (provider/prices.py).

Each response's usage is priced with the agent's model (`gen_ai.request.model`) and
counted in `hango_model_cost_usd_total`. A model without a price makes the run's cost
unknown (`None`, never 0): counted once per attempt in `hango_model_price_unknown_total`
and recorded as the `model.price_unknown` span event; logged as a warning once per model
and process.
"""

from __future__ import annotations

import logging

from hango_worker.provider.prices import PriceTable
from hango_worker.provider.types import Usage
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import current_turn_span

log = logging.getLogger(__name__)
PRICE_UNKNOWN = "model.price_unknown"
_warned: set[str] = set()


class RunCost:
    def __init__(self, prices: PriceTable, model: str) -> None:
        self.model = model
        self.price = prices.lookup(model)
        self._usd = 0.0
        self._before: float | None = 0.0  # earlier attempts of the run

    @property
    def usd(self) -> float | None:
        """USD so far (earlier attempts included); None when some of it has no price."""
        if self.price is None or self._before is None:
            return None
        return self._before + self._usd

    def carry(self, before: float | None) -> None:
        """Start from what earlier attempts cost (None: unknown, and so is the total)."""
        self._before = None if before is None or self._before is None else self._before + before

    def add(self, usage: Usage) -> float:
        """Price one response; returns its cost (0.0 when the model has no price)."""
        if self.price is not None:
            cost = self.price.cost(usage)
            self._usd += cost
            metrics.child(metrics.MODEL_COST, self.model).inc(cost)
            return cost
        if self._usd == 0.0:  # once per attempt
            self._usd = -1.0
            metrics.MODEL_PRICE_UNKNOWN.labels(self.model).inc()
            current_turn_span().add_event(PRICE_UNKNOWN, {"gen_ai.request.model": self.model})
            if self.model not in _warned:  # the log line: once per model and process
                _warned.add(self.model)
                log.warning(
                    "model %r has no price: the cost of its runs is unknown "
                    "(add it to HANGO_MODEL_PRICES)",
                    self.model,
                )
        return 0.0
