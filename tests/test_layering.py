"""Layers import downward only: provider ← tool ← agent ← run; store beside; telemetry a leaf.

The rules live in one place, the import-linter contracts in `.importlinter` (`make lint`
runs `lint-imports`). Every module of the package belongs to a component (its
subpackage, or itself for a top-level module; `hango_worker` is the package root) and
each component has a contract naming what it may import and forbidding every other
component. These tests read the contracts and hold the rest to them: the contracts
themselves (complete, one per component), the table in docs/system-architecture.md, the
package docstrings, and the code (import-linter's own run, and an AST walk of direct
imports, lazy ones inside functions included). Modules import each other without
cycles.
"""

from __future__ import annotations

import ast
import configparser
import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "hango_worker"
CONTRACTS = ROOT / ".importlinter"
ARCHITECTURE = ROOT / "docs" / "system-architecture.md"
TOP = "hango_worker"  # the package root's component: hango_worker/__init__.py
NAME = re.compile(r"^(\w+) may import only: (.+)$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else TOP


def components() -> set[str]:
    return {component(m) for m in modules()}


@cache
def contracts() -> dict[str, dict[str, str]]:
    """contract id → its options, as lint-imports reads them."""
    parser = configparser.ConfigParser()
    assert parser.read(CONTRACTS) == [str(CONTRACTS)]
    prefix = "importlinter:contract:"
    return {s.removeprefix(prefix): dict(parser[s]) for s in parser if s.startswith(prefix)}


def listed(contract: dict[str, str], option: str) -> set[str]:
    return set(contract.get(option, "").split())


def _names(text: str) -> set[str]:
    return set() if text.startswith("nothing") else set(re.findall(r"\b\w+\b", text))


@cache
def allowed() -> dict[str, set[str]]:
    """component → the other components it may import, as its contract's name says."""
    out: dict[str, set[str]] = {}
    for cid, contract in contracts().items():
        if m := NAME.match(contract["name"]):
            assert m[1] == cid, f"contract {cid} is named for {m[1]}"
            out[cid] = _names(m[2])
    return out


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


def test_every_component_has_its_contract() -> None:
    assert components() - set(allowed()) == set(), "new component: give it a contract"
    assert set(allowed()) - components() == set(), "a contract names no component"


def test_import_linter_sees_every_module() -> None:
    """A folder without `__init__.py` is a namespace package grimp leaves out."""
    graph = grimp.build_graph("hango_worker", cache_dir=None)
    assert set(modules()) - graph.modules == set()


@pytest.mark.parametrize("comp", sorted(components() - {TOP}))
def test_each_contract_forbids_every_component_it_does_not_allow(comp: str) -> None:
    contract = contracts()[comp]
    assert contract["type"] == "forbidden"
    assert listed(contract, "source_modules") == {f"hango_worker.{comp}"}
    # direct imports, as the table says; the layers contract covers indirect ones
    assert contract["allow_indirect_imports"] == "true"
    assert allowed()[comp] <= components() - {comp}
    others = components() - {comp, TOP} - allowed()[comp]
    assert listed(contract, "forbidden_modules") == {f"hango_worker.{c}" for c in others}


def test_only_the_allowed_import_the_package_root() -> None:
    top = contracts()[TOP]
    assert (listed(top, "source_modules"), listed(top, "forbidden_modules")) == (
        {"hango_worker"},
        {"hango_worker.**"},
    )
    assert top["as_packages"] == "false" and allowed()[TOP] == set()
    guard = contracts()["root-importers"]
    assert guard["type"] == "protected" and listed(guard, "protected_modules") == {TOP}
    importers = {c for c, ok in allowed().items() if TOP in ok}
    assert listed(guard, "allowed_importers") == {
        f"hango_worker.{c}{tail}" for c in importers for tail in ("", ".**")
    }


def test_production_code_never_imports_the_test_fakes() -> None:
    contract = contracts()["no-test-fakes"]
    production = components() - {"testing", TOP}  # the root's contract forbids everything
    assert listed(contract, "source_modules") == {f"hango_worker.{c}" for c in production}
    assert listed(contract, "forbidden_modules") == {"hango_worker.testing"}
    assert "allow_indirect_imports" not in contract  # not even through a third module
    assert [c for c in production if "testing" in allowed()[c]] == []


def test_the_architecture_doc_has_the_contracts_table() -> None:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text.split("| component | may import |\n|---|---|\n", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1:3] for line in table.splitlines()]
    assert {comp.strip(" `"): _names(names.strip()) for comp, names in rows} == allowed()


def _docstring_may_import(path: Path) -> tuple[set[str], str]:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    m = re.search(r"May import: (.*?)\.(?:\s|$)", doc, flags=re.S)
    assert m, f"{path.relative_to(ROOT)}: no 'May import: …' sentence"
    names = set() if m[1].startswith("nothing") else set(re.findall(r"`(\w+)`", m[1]))
    return names, doc


@pytest.mark.parametrize(
    "package", sorted(m for m, p in modules().items() if p.name == "__init__.py")
)
def test_each_package_docstring_says_what_it_may_import(package: str) -> None:
    names, doc = _docstring_may_import(modules()[package])
    comp = component(package)
    assert names - {comp} == allowed()[comp]
    assert "never" in doc.lower(), "say what it never imports"
    assert ".importlinter" in doc


@pytest.mark.parametrize("comp", sorted(components()))
def test_components_import_only_what_they_are_allowed(comp: str) -> None:
    bad = {
        m: sorted({component(t) for t in imports_of(m)} - allowed()[comp] - {comp})
        for m in modules()
        if component(m) == comp
    }
    assert {m: v for m, v in bad.items() if v} == {}


def test_the_contracts_hold() -> None:
    """What `make lint` runs: every contract in `.importlinter` is kept. In a process of
    its own: import-linter configures logging with `dictConfig`, which disables every
    logger that exists, so the log lines later tests read would vanish."""
    lint = Path(sys.executable).parent / "lint-imports"  # installed with import-linter
    out = subprocess.run(
        [str(lint), "--no-cache", "--no-logo", "--config", str(CONTRACTS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_make_lint_runs_the_contracts() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = makefile.split("\nlint:", 1)[1].split("\n\n", 1)[0]
    assert "$(BIN)/lint-imports" in target


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
