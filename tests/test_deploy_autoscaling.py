"""Autoscaling on work (docs/operations.md "Autoscaling on work"): hpa.yaml scales on
`hango_fleet_load`, which prometheus-adapter serves from the documented formula, with a
target that never scales down a fleet busy with long runs and a slow scale-down. The
formula is evaluated here by hand and by Prometheus (deploy/prometheus/tests/autoscaling.yaml,
`promtool test rules`, make test-deploy)."""

from __future__ import annotations

import ast
import math
import re
from typing import Any

from tests.test_deploy import DEPLOY, K8S, OPERATIONS, k8s, load_yaml, metric_names

METRIC = "hango_fleet_load"
FORMULA = (
    '(sum(hango_worker_slots{job="hango-worker",state="used"}) '
    '+ max(hango_queue_claimable{job="hango-worker"})) '
    '/ avg(hango_worker_slots{job="hango-worker",state="total"} > 0)'
)
AGGREGATION = re.compile(r"(sum|max|avg)\((\w+)\{([^}]*)\}( > 0)?\)")


def hpa() -> dict[str, Any]:
    return k8s("HorizontalPodAutoscaler")


def adapter_rule(name: str) -> dict[str, Any]:
    rules = load_yaml(K8S / "prometheus-adapter-values.yaml")["rules"]["external"]
    (rule,) = [r for r in rules if r["name"]["as"] == name]
    assert isinstance(rule, dict)
    return rule


def quantity(q: str) -> float:
    """A Kubernetes quantity as the HPA reads it ("800m", "0.8", "2")."""
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def target() -> float:
    (metric,) = hpa()["spec"]["metrics"]
    assert metric["external"]["target"]["type"] == "AverageValue"
    return quantity(str(metric["external"]["target"]["averageValue"]))


def evaluate(query: str, series: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    """The query over `series` (metric -> [(labels, value)]): each `agg(metric{matchers})`
    (`> 0`: of the positive values) is computed, then the arithmetic left (numbers, + - * / and parentheses)."""

    def aggregate(m: re.Match[str]) -> str:
        agg, name, matchers, positive = m.groups()
        want = dict(re.findall(r'(\w+)="([^"]*)"', matchers))
        values = [v for labels, v in series[name] if want.items() <= labels.items()]
        values = [v for v in values if v > 0] if positive else values
        assert values, f"no series for {m.group(0)}"
        fn = {"sum": sum, "max": max, "avg": lambda vs: sum(vs) / len(vs)}[agg]
        return repr(float(fn(values)))

    return _arithmetic(ast.parse(AGGREGATION.sub(aggregate, query), mode="eval").body)


def _arithmetic(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, float):
        return node.value
    assert isinstance(node, ast.BinOp), ast.dump(node)
    a, b = _arithmetic(node.left), _arithmetic(node.right)
    ops = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}
    return a / b if isinstance(node.op, ast.Div) else ops[type(node.op)]


def desired_replicas(load: float, current: int) -> int:
    """What the HPA asks for (autoscaling/v2, an External AverageValue target): ceil of
    the metric over the target, unless within its 10% tolerance; within min/max."""
    spec = hpa()["spec"]
    ratio = load / (target() * current)
    want = current if abs(ratio - 1) <= 0.1 else math.ceil(load / target())
    return int(min(max(want, spec["minReplicas"]), spec["maxReplicas"]))


def fleet(workers: list[tuple[int, int]], claimable: int) -> dict[str, Any]:
    """The series Prometheus holds: each worker's slots (used, total), and the global
    claimable backlog that every worker reports."""
    job = {"job": "hango-worker"}
    slots = []
    for used, total in workers:
        slots += [({**job, "state": "used"}, float(used)), ({**job, "state": "total"}, total)]
    return {
        "hango_worker_slots": slots,
        "hango_queue_claimable": [(job, float(claimable)) for _ in workers],
    }


def test_k8s_hpa_scales_on_work_through_the_adapter() -> None:
    spec = hpa()["spec"]
    assert hpa()["apiVersion"] == "autoscaling/v2"
    assert spec["scaleTargetRef"]["name"] == k8s("Deployment")["metadata"]["name"]
    (metric,) = spec["metrics"]
    assert metric["type"] == "External"
    assert metric["external"]["metric"]["name"] == METRIC
    assert adapter_rule(METRIC)["resources"] == {"namespaced": False}
    assert 2 <= spec["minReplicas"] <= spec["maxReplicas"]
    # a target below 1: a fleet whose slots are all busy asks for at least as many replicas
    assert 0 < target() < 1
    down = spec["behavior"]["scaleDown"]
    assert down["stabilizationWindowSeconds"] >= 600
    assert down["policies"] == [{"type": "Pods", "value": 1, "periodSeconds": 120}]
    assert spec["behavior"]["scaleUp"]["stabilizationWindowSeconds"] <= 60


def test_the_adapter_serves_the_documented_formula() -> None:
    rule = adapter_rule(METRIC)
    assert rule["metricsQuery"] == FORMULA
    assert metric_names(rule["seriesQuery"]) == {"hango_worker_slots"}
    assert rule["name"]["matches"] == "^hango_worker_slots$"
    # the load counts slots and the claimable backlog, never the raw queue depth
    assert metric_names(FORMULA) == {"hango_worker_slots", "hango_queue_claimable"}
    assert FORMULA in OPERATIONS.read_text(encoding="utf-8")
    # and Prometheus evaluates that very query in `promtool test rules` (make test-deploy)
    cases = load_yaml(DEPLOY / "prometheus" / "tests" / "autoscaling.yaml")["tests"]
    exprs = [t["expr"] for case in cases for t in case["promql_expr_test"]]
    assert exprs and set(exprs) == {FORMULA}


def test_a_fleet_busy_with_long_runs_is_never_scaled_down() -> None:
    for n in range(2, 11):
        busy = fleet([(8, 8)] * n, claimable=0)
        assert evaluate(FORMULA, busy) == n
        assert desired_replicas(evaluate(FORMULA, busy), n) >= n


def test_replicas_follow_running_and_claimable_runs() -> None:
    # 4 workers of 8 slots, 4 slots used and nothing claimable (hundreds of runs
    # queued, all waiting or over their tenant's limit): down to the minimum, slowly
    idle = fleet([(1, 8)] * 4, claimable=0)
    assert evaluate(FORMULA, idle) == 0.5
    assert desired_replicas(0.5, 4) == hpa()["spec"]["minReplicas"]
    # 2 busy workers and 40 claimable runs: 56 runs' worth of slots, 7 replicas of 8,
    # over the 0.8 target: 9
    burst = fleet([(8, 8), (8, 8)], claimable=40)
    assert evaluate(FORMULA, burst) == 7
    assert desired_replicas(7, 2) == math.ceil(7 / target())
    # the workers' concurrency is what a replica is worth (avg over the workers); a
    # worker still starting (its slots not set yet: total 0) does not lower it
    assert evaluate(FORMULA, fleet([(10, 16), (6, 16)], claimable=16)) == 2
    assert evaluate(FORMULA, fleet([(10, 16), (6, 16), (0, 0)], claimable=16)) == 2
