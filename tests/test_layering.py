"""Layers import downward only: provider ← tool ← agent ← run; store beside; telemetry a leaf.

Every module of the package belongs to a component (its subpackage, or itself for a
top-level module) and each component has an allow-list of the components it may
import, lazy imports inside functions included. Modules import each other without
cycles, and production code never imports the test fakes in `hango_worker.testing`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "hango_worker"

PRODUCTION = {
    "__init__",
    "agent",
    "cli",
    "client",
    "config",
    "console",
    "demo",
    "provider",
    "render",
    "run",
    "service",
    "store",
    "telemetry",
    "tool",
    "vocab",
    "watch",
}

# component → the other components it may import (the package root is "__init__")
# `vocab` (run statuses, error types, tool outcomes) is a leaf every component may use.
ALLOWED: dict[str, set[str]] = {
    "__init__": set(),
    "vocab": set(),
    "telemetry": {"vocab"},
    "config": set(),
    "render": {"provider", "vocab"},  # provider.sanitize: the one text-cleaning rule
    "provider": {"telemetry", "vocab"},
    "tool": {"provider", "telemetry", "vocab"},
    "agent": {"provider", "tool", "telemetry", "vocab"},
    "store": {"provider", "telemetry", "config", "vocab"},
    "run": {"provider", "tool", "agent", "store", "telemetry", "config", "vocab"},
    "watch": {"render", "store", "telemetry", "vocab"},
    "client": {"provider", "agent", "store", "telemetry", "config", "vocab"},
    "service": {"config", "provider", "tool", "agent", "run", "store", "telemetry", "vocab"},
    # the run console: a top-level consumer like cli (its own process)
    "console": {"config", "render", "store", "telemetry", "vocab"},
    "demo": {"config", "provider", "render", "run", "service", "store", "telemetry", "vocab"},
    "cli": PRODUCTION - {"cli", "client"},
    "testing": PRODUCTION - {"cli", "demo", "service"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(module: str) -> set[str]:
    """The package's modules `module` imports (at top level or inside functions)."""
    path = modules()[module]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rsplit(".", 1)[0]
                base = f"{pkg}.{base}" if base else pkg
            if base.split(".")[0] == "hango_worker":
                subs = {f"{base}.{a.name}" for a in node.names}
                found |= {s for s in subs if s in modules()} or {base}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "hango_worker"}
    return {m for m in found if m != module}


def test_every_module_belongs_to_a_known_component() -> None:
    comps = {component(m) for m in modules()}
    assert comps - set(ALLOWED) == set(), "new component: give it an allow-list in ALLOWED"
    assert set(ALLOWED) - comps == set(), "ALLOWED names a component that does not exist"
    assert set(ALLOWED) - {"testing"} == PRODUCTION


@pytest.mark.parametrize("comp", sorted(ALLOWED))
def test_components_import_only_what_they_are_allowed(comp: str) -> None:
    bad = {
        m: sorted({component(t) for t in imports_of(m)} - ALLOWED[comp] - {comp})
        for m in modules()
        if component(m) == comp
    }
    assert {m: v for m, v in bad.items() if v} == {}


def test_production_code_never_imports_the_test_fakes() -> None:
    bad = sorted(
        f"{m} → {t}"
        for m in modules()
        if component(m) != "testing"
        for t in imports_of(m)
        if component(t) == "testing"
    )
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(v: str) -> Iterator[list[str]]:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                yield from visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                yield sorted(scc)

    for v in sorted(graph):
        if v not in index:
            yield from visit(v)


def test_modules_import_each_other_without_cycles() -> None:
    graph = {m: {t for t in imports_of(m) if t in modules()} for m in modules()}
    assert list(_cycles(graph)) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert list(_cycles(graph)) == [["a", "b", "c"]]


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
