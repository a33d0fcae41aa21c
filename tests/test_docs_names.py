"""Every metric and span-event name the docs tell operators to look for exists in the code.

An operator who greps traces for a name from `docs/` and finds nothing has been
misled (the docs once said `middleware.retried` where the code emits
`model.retried`). Names are taken from inline code and code blocks:

- metric names (`hango_*`, `gen_ai_*`) must be registered in the Prometheus
  registry once `hango_worker.telemetry.metrics` is imported (a label name of a
  registered metric counts too: the metric tables list labels beside names);
- event names (`middleware.*`, `model.*`, `tool.*`, `agent.*`) must occur as a
  string literal somewhere in `hango_worker/`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY

import hango_worker.telemetry.metrics  # registers every metric
import hango_worker.telemetry.metrics_server  # noqa: F401  (and the endpoint's own)
from hango_worker.store import producer_api, sql

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("**/*.md"))

# A name is a token of its own: not part of a dotted attribute (`hango.tool.name`), a
# path, a quoted SQL string (`pg_notify('hango_runs')`) or a Python expression
# (`view(agent.tools)`), and not a file name (`middleware.py`).
METRIC = re.compile(r"(?<![\w./'\"])((?:hango|gen_ai)_[a-z0-9_]*[a-z0-9])")
EVENT = re.compile(
    r"(?<![\w./(-])((?:middleware|model|tool|agent)\.(?!(?:py|md|png|json|yaml)\b)[a-z_]+)(?![\w.()/-])"
)
# the package itself, the LISTEN/NOTIFY channels (store/sql.py), the SQL API's names, the
# External metrics prometheus-adapter serves from the registered ones (hango_fleet_load)
ADAPTER = ROOT / "deploy" / "k8s" / "prometheus-adapter-values.yaml"
NOT_NAMES = (
    {"hango_worker"}
    | {v for k, v in vars(sql).items() if k.endswith("_CHANNEL")}
    | producer_api.SQL_NAMES  # the producer SQL API's schema, role and functions
    | {
        r["name"]["as"]
        for r in yaml.safe_load(ADAPTER.read_text(encoding="utf-8"))["rules"]["external"]
    }
)
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")


def _code_spans(text: str) -> list[str]:
    """Inline code and fenced code blocks: where the docs spell out names."""
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    return blocks + re.findall(r"`([^`\n]+)`", prose)


def _mentioned(pattern: re.Pattern[str]) -> dict[str, set[str]]:
    """name → the doc files that mention it."""
    found: dict[str, set[str]] = {}
    for path in DOCS:
        for span in _code_spans(path.read_text(encoding="utf-8")):
            for name in pattern.findall(span):
                if name not in NOT_NAMES:
                    found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def _registered() -> set[str]:
    names: set[str] = set()
    for collector, samples in list(REGISTRY._collector_to_names.items()):
        names.update(samples)
        names.update(getattr(collector, "_labelnames", ()))
    return names


def _string_literals() -> set[str]:
    out: set[str] = set()
    for path in (ROOT / "hango_worker").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                out.add(node.value)
    return out


def test_the_docs_are_scanned_and_name_both_kinds() -> None:
    assert len(DOCS) >= 4
    metrics, events = _mentioned(METRIC), _mentioned(EVENT)
    assert "hango_model_retries_total" in metrics and "model.retried" in events


def test_every_metric_name_in_the_docs_is_registered() -> None:
    registered = _registered()
    missing = {
        name: sorted(where)
        for name, where in _mentioned(METRIC).items()
        if not any(name + s in registered for s in SUFFIXES)
    }
    assert missing == {}, f"metric names in docs/ that the code does not register: {missing}"


def test_every_event_name_in_the_docs_is_emitted_by_the_code() -> None:
    literals = _string_literals()
    missing = {name: sorted(where) for name, where in _mentioned(EVENT).items()}
    missing = {name: where for name, where in missing.items() if name not in literals}
    assert missing == {}, f"event names in docs/ that no code emits: {missing}"


@pytest.mark.parametrize(
    ("text", "metrics", "events"),
    [
        ("see `model.retried` events", set(), {"model.retried"}),
        ("`hango_x_total{middleware=…}`", {"hango_x_total"}, set()),
        ("attribute `hango.tool.name` and `gen_ai.tool.name`", set(), set()),
        ("`agent/middleware.py` and `hango_worker/run`", set(), set()),
        ("`pg_notify('hango_runs')`, `Registry.view(agent.tools)`", set(), set()),
        ("```\n│  events: middleware.short_circuited (gen_ai.tool.name)\n```", set(), set()),
    ],
)
def test_the_name_patterns(text: str, metrics: set[str], events: set[str]) -> None:
    spans = _code_spans(text)
    found_metrics = {n for s in spans for n in METRIC.findall(s)} - NOT_NAMES
    found_events = {n for s in spans for n in EVENT.findall(s)}
    assert found_metrics == metrics
    if "```" in text:  # a code block: names in it count as well
        assert found_events == {"middleware.short_circuited"}
    else:
        assert found_events == events
