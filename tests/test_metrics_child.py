"""`metrics.child`: a labelled series looked up once, counting in the registry's series."""

from __future__ import annotations

from prometheus_client import REGISTRY

from hango_worker.telemetry import metrics


def _tokens(kind: str) -> float:
    return REGISTRY.get_sample_value("hango_model_tokens_total", {"type": kind}) or 0.0


def test_a_cached_series_is_the_registry_series() -> None:
    first = metrics.child(metrics.MODEL_TOKENS, "output")
    assert first is metrics.child(metrics.MODEL_TOKENS, "output")
    assert first is not metrics.child(metrics.MODEL_TOKENS, "input")  # one per label set
    before_out, before_in = _tokens("output"), _tokens("input")
    first.inc(7)
    assert _tokens("output") == before_out + 7
    assert _tokens("input") == before_in
