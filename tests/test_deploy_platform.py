"""deploy/k8s as a platform team wants it: a PodDisruptionBudget, a NetworkPolicy that lets
out only DNS, Postgres, HTTPS (Anthropic) and OTLP, no ServiceAccount token, secrets
mounted as files (`*_FILE`), a PrometheusRule that is the alerts file, and a migrate Job
that works under an overlay with a registry port and an image digest. `make test-deploy`
runs this file."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from hango_worker.config import SECRET_VARIABLES
from tests import kustomize_lite, prometheus_rule
from tests.test_deploy import K8S, ROOT, configmap_data, k8s, load_yaml, rendered, rendered_one

SECRET = "hango-worker-secrets"
DIGEST = "sha256:" + "0123456789abcdef" * 4
IMAGE = "registry.example.com:5000/team/hango-worker"
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for o in objs:
        path = kustomize_lite.POD_SPEC_PATHS.get(o["kind"])
        if path is None:
            continue
        spec: Any = o
        for key in path:
            spec = spec[key]
        out[o["kind"]] = spec
    return out


def pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    template = obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]
    labels = template["template"]["metadata"]["labels"]
    assert isinstance(labels, dict)
    return labels


def test_the_base_has_the_platform_objects() -> None:
    resources = load_yaml(K8S / "kustomization.yaml")["resources"]
    for name in ("pdb.yaml", "networkpolicy.yaml", "serviceaccount.yaml"):
        assert name in resources, name
    kinds = {o["kind"] for o in rendered()}
    assert {"PodDisruptionBudget", "NetworkPolicy", "ServiceAccount"} <= kinds


def test_the_disruption_budget_covers_the_workers_one_at_a_time() -> None:
    objs = rendered()
    pdb = rendered_one(objs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    deployment = rendered_one(objs, "Deployment")
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    # with at least two replicas a node drain can always evict one
    assert rendered_one(objs, "HorizontalPodAutoscaler")["spec"]["minReplicas"] >= 2


def _ports(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(p["protocol"], int(p["port"])) for p in rule.get("ports", [])}


def test_the_network_policy_lets_out_only_dns_postgres_https_and_otlp() -> None:
    objs = rendered()
    policy = rendered_one(objs, "NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for o in objs:  # every hango-worker pod is under it
        if o["kind"] in kustomize_lite.POD_SPEC_PATHS:
            assert selector.items() <= pod_labels(o).items(), o["kind"]
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]
    egress = policy["spec"]["egress"]
    assert all(rule.get("ports") for rule in egress), "no rule may allow every port"
    allowed = set().union(*(_ports(rule) for rule in egress))
    assert allowed == {
        ("UDP", 53),
        ("TCP", 53),
        ("TCP", 5432),
        ("TCP", 443),
        ("TCP", 4317),
        ("TCP", 4318),
    }
    (dns,) = [r for r in egress if ("UDP", 53) in _ports(r)]
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
    # the configured OTLP endpoint's port is one of them
    otlp = urlsplit(configmap_data()["OTEL_EXPORTER_OTLP_ENDPOINT"])
    assert ("TCP", otlp.port) in allowed
    # in: the metrics port only (scrapes, probes)
    (ingress,) = policy["spec"]["ingress"]
    (container,) = pod_specs(objs)["Deployment"]["containers"]
    (metrics_port,) = container["ports"]
    assert _ports(ingress) == {("TCP", metrics_port["containerPort"])}


def test_no_pod_mounts_a_service_account_token() -> None:
    objs = rendered()
    account = rendered_one(objs, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    specs = pod_specs(objs)
    assert set(specs) == {"Deployment", "Job", "CronJob"}
    for kind, spec in specs.items():
        assert spec["automountServiceAccountToken"] is False, kind
        assert spec["serviceAccountName"] == account["metadata"]["name"], kind
    assert not [o for o in objs if o["kind"] in ("Role", "RoleBinding", "ClusterRoleBinding")]


def _file_env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if e["name"].endswith("_FILE")}


def test_secrets_are_mounted_files_named_by_file_variables() -> None:
    keys = set(k8s("Secret")["stringData"])
    needs = {
        "Deployment": {"HANGO_DATABASE_URL", "ANTHROPIC_API_KEY"},
        "Job": {"HANGO_DATABASE_URL"},
        "CronJob": {"HANGO_DATABASE_URL"},
    }
    for kind, spec in pod_specs(rendered()).items():
        (c,) = spec["containers"]
        assert not [e for e in c.get("envFrom", []) if "secretRef" in e], kind
        assert not [e for e in c.get("env", []) if "valueFrom" in e and "secretKeyRef" in str(e)]
        (volume,) = [v for v in spec["volumes"] if "secret" in v]
        assert volume["secret"]["secretName"] == SECRET
        assert volume["secret"]["defaultMode"] == 0o440
        (mount,) = [m for m in c["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True
        files = _file_env(c)
        assert {name.removesuffix("_FILE") for name in files} == needs[kind], kind
        for name, path in files.items():
            variable = name.removesuffix("_FILE")
            assert variable in SECRET_VARIABLES
            assert Path(path).parent == Path(mount["mountPath"]) and Path(path).name in keys
        # the group the files are readable by is the one the process runs as
        assert spec["securityContext"]["fsGroup"] == spec["securityContext"]["runAsGroup"]


def test_the_prometheus_rule_is_the_alerts_file() -> None:
    text = (K8S / "prometheusrule.yaml").read_text(encoding="utf-8")
    assert text == prometheus_rule.render(), "run `make prometheusrule`"
    rule = yaml.safe_load(text)
    alerts = load_yaml(ROOT / "deploy" / "prometheus" / "alerts.yaml")
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == alerts["groups"]


def _overlay_images(tag: str | None, digest: str | None) -> list[dict[str, str]]:
    image = {"name": "hango-worker", "newName": IMAGE}
    if tag:
        image["newTag"] = tag
    if digest:
        image["digest"] = digest
    return [image]


def _check_job(objs: list[dict[str, Any]], expected_image: str) -> str:
    job = rendered_one(objs, "Job")
    name = job["metadata"]["name"]
    assert len(name) <= 63 and DNS_LABEL.fullmatch(name), name
    for labels in (job["metadata"]["labels"], pod_labels(job)):
        for value in labels.values():
            assert len(value) <= 63 and re.fullmatch(
                r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value
            )
    for kind, spec in pod_specs(objs).items():
        (c,) = spec["containers"]
        assert c["image"] == expected_image, kind
    return str(name)


def test_the_migrate_job_renders_with_a_registry_port_and_a_digest() -> None:
    """The Job's name never comes from the image (a port or a digest does not fit in a
    name), and every workload runs the image the overlay sets."""
    names = {
        _check_job(rendered({"images": _overlay_images("0.2.0", None)}), f"{IMAGE}:0.2.0"),
        _check_job(rendered({"images": _overlay_images(None, DIGEST)}), f"{IMAGE}@{DIGEST}"),
        _check_job(rendered(), "hango-worker:0.1.0"),
    }
    assert names == {"hango-worker-migrate"}


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_migrate_job_under_a_real_kustomize_overlay(tmp_path: Path) -> None:
    """An overlay of its own (namespace, images by digest from a registry with a port),
    rendered by `kubectl kustomize`: the overlay's image reaches the Job."""
    overlay = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": "hango",
        "resources": [os.path.relpath(K8S, tmp_path)],  # kustomize wants it relative
        "images": _overlay_images("0.2.0", DIGEST),
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(overlay), encoding="utf-8")
    out = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    objs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert _check_job(objs, f"{IMAGE}:0.2.0@{DIGEST}") == "hango-worker-migrate"
    assert {o["metadata"].get("namespace") for o in objs} == {"hango"}


def test_version_is_the_package_metadata() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", "--version"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.stdout == f"hango-worker {importlib.metadata.version('hango-worker')}\n"
    source = (ROOT / "hango_worker" / "__init__.py").read_text(encoding="utf-8")
    assert not re.search(r"__version__\s*=\s*[\"']\d", source), "no hard-coded version"


def test_make_test_deploy_runs_these_checks() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = makefile.split("\ntest-deploy:", 1)[1].split("\n\n", 1)[0]
    assert "tests/test_deploy_platform.py" in target and "tests/test_secret_files.py" in target
