"""Layers import downward only: provider ← tool ← agent ← run; store beside; telemetry a leaf."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "hango_worker"

# layer → hango_worker subpackages it must never import
FORBIDDEN = {
    "provider": {"tool", "agent", "run", "store", "cli", "service", "testing"},
    "tool": {"agent", "run", "store", "cli", "service", "testing"},
    "agent": {"run", "store", "cli", "service", "testing"},
    "store": {"agent", "tool", "run", "cli", "service", "testing"},
    "run": {"cli", "service", "testing"},
    "telemetry": {
        "provider",
        "tool",
        "agent",
        "run",
        "store",
        "cli",
        "service",
        "testing",
        "config",
        "client",
    },
}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("hango_worker")
        ):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("hango_worker")}
    return {m.split(".")[1] for m in found if m.count(".") >= 1}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_only_downward(layer: str) -> None:
    files = sorted((PKG / layer).rglob("*.py"))
    assert files, f"no modules in {layer}"
    bad = {str(f.relative_to(PKG)): sorted(imports_of(f) & FORBIDDEN[layer]) for f in files}
    assert {k: v for k, v in bad.items() if v} == {}


def test_no_module_over_500_lines() -> None:
    long = {
        str(p.relative_to(PKG)): n
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}


def test_no_function_over_60_lines() -> None:
    long = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > 60:
                    long.append(f"{p.relative_to(PKG)}:{node.name} ({n} lines)")
    assert long == []
