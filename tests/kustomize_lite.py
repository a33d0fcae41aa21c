"""A minimal `kustomize build` for deploy/k8s, for tests on machines without kubectl.

It implements exactly what deploy/k8s/kustomization.yaml uses — `resources` (files),
`labels` (metadata only), `images` and `replacements` (with `delimiter`/`index`
options and `[key=value]` list selectors) — and refuses anything else, so a new
kustomize feature in the base fails loudly here instead of being ignored.
tests/test_deploy.py checks it against `kubectl kustomize` where kubectl exists.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "resources", "labels", "images", "replacements"}
POD_SPEC_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}


def build(folder: Path, overrides: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Render the kustomization in `folder`; `overrides` replaces top-level keys."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text(encoding="utf-8"))
    k.update(overrides or {})
    unknown = set(k) - SUPPORTED
    if unknown:
        raise NotImplementedError(f"kustomize_lite does not implement {sorted(unknown)}")
    objs: list[dict[str, Any]] = []
    for res in k.get("resources", []):
        text = (folder / res).read_text(encoding="utf-8")
        objs += [copy.deepcopy(d) for d in yaml.safe_load_all(text) if d]
    for entry in k.get("labels", []):
        if entry.get("includeSelectors") or entry.get("includeTemplates"):
            raise NotImplementedError("labels into selectors/templates")
        for obj in objs:
            obj["metadata"].setdefault("labels", {}).update(entry["pairs"])
    for image in k.get("images", []):
        for obj in objs:
            for c in _containers(obj):
                _set_image(c, image)
    for rep in k.get("replacements", []):
        _replace(objs, rep)
    return objs


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    path = POD_SPEC_PATHS.get(obj["kind"])
    if path is None:
        return []
    spec: Any = obj
    for key in path:
        spec = spec[key]
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _set_image(container: dict[str, Any], image: dict[str, str]) -> None:
    name, _, _tag = container["image"].partition("@")[0].partition(":")
    if name != image["name"]:
        return
    new = image.get("newName", name)
    if "digest" in image:
        container["image"] = f"{new}@{image['digest']}"
    else:
        container["image"] = f"{new}:{image.get('newTag', _tag)}"


def _path(field_path: str) -> list[str]:
    out, buf, depth = [], "", 0
    for ch in field_path:
        if ch == "." and depth == 0:
            out.append(buf)
            buf = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        buf += ch
    return [*out, buf]


def _step(node: Any, key: str, create: bool) -> Any:
    if key.startswith("[") and "=" in key:  # a list item by field value
        field, value = key[1:-1].split("=", 1)
        return next(item for item in node if item.get(field) == value)
    key = key.strip("[]")
    if create and key not in node:
        node[key] = {}
    return node[key]


def _get(obj: dict[str, Any], field_path: str) -> Any:
    node: Any = obj
    for key in _path(field_path):
        node = _step(node, key, create=False)
    return node


def _put(obj: dict[str, Any], field_path: str, value: str, options: dict[str, Any]) -> None:
    keys = _path(field_path)
    node: Any = obj
    for key in keys[:-1]:
        node = _step(node, key, create=True)
    last = keys[-1].strip("[]")
    if "delimiter" in options:
        parts = str(node[last]).split(options["delimiter"])
        parts[options.get("index", 0)] = value
        value = options["delimiter"].join(parts)
    node[last] = value


def _selected(obj: dict[str, Any], select: dict[str, str]) -> bool:
    if select.get("kind", obj["kind"]) != obj["kind"]:
        return False
    if select.get("name", obj["metadata"]["name"]) != obj["metadata"]["name"]:
        return False
    wanted = select.get("labelSelector")
    if wanted:
        labels = obj["metadata"].get("labels", {})
        pairs = (p.split("=", 1) for p in wanted.split(","))
        return all(labels.get(key) == value for key, value in pairs)
    return True


def _replace(objs: list[dict[str, Any]], rep: dict[str, Any]) -> None:
    src = rep["source"]
    (source,) = [o for o in objs if _selected(o, {"kind": src["kind"], "name": src["name"]})]
    value = str(_get(source, src["fieldPath"]))
    opts = src.get("options", {})
    if "delimiter" in opts:
        value = value.split(opts["delimiter"])[opts.get("index", 0)]
    for target in rep["targets"]:
        for obj in [o for o in objs if _selected(o, target["select"])]:
            for field_path in target["fieldPaths"]:
                _put(obj, field_path, value, target.get("options", {}))
