"""deploy/k8s/prometheusrule.yaml, generated from deploy/prometheus/alerts.yaml: the same
groups wrapped in a Prometheus Operator PrometheusRule. tests/test_deploy_platform.py
checks the file is exactly what `render()` gives, so the two never drift; after editing
the alerts, `make prometheusrule` (python -m tests.prometheus_rule) writes it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULE = ROOT / "deploy" / "k8s" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/alerts.yaml by `make prometheusrule`: edit the alerts
# there, then run it (tests/test_deploy_platform.py fails while this file differs).
#
# OPTIONAL, needs the Prometheus Operator (monitoring.coreos.com CRDs); not in
# kustomization.yaml's resources:
#   kubectl apply -n <namespace> -f deploy/k8s/prometheusrule.yaml
# Your Prometheus's ruleSelector must match its labels (often
# `release: <your kube-prometheus-stack release>`): add that label in an overlay.
"""


def document() -> dict[str, Any]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "hango-worker",
            "labels": {
                "app.kubernetes.io/name": "hango-worker",
                "app.kubernetes.io/part-of": "hango-worker",
            },
        },
        "spec": {"groups": groups},
    }


def render() -> str:
    body = yaml.safe_dump(document(), sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


if __name__ == "__main__":
    RULE.write_text(render(), encoding="utf-8")
    print(f"wrote {RULE.relative_to(ROOT)}")
