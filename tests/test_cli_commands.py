"""The CLI's one way to add commands: every cli module with commands exposes
`register(sub)` and its handlers, and parser.py calls each one's `register` from its
one list, COMMANDS. The command tree `hango-worker --help` shows is pinned here."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

from hango_worker.cli import build_parser
from hango_worker.cli.parser import COMMANDS

CLI = Path(__file__).resolve().parent.parent / "hango_worker" / "cli"

# command → its subcommands, in the order `--help` lists them
TREE: dict[str, list[str]] = {
    "run": [],
    "migrate": [],
    "demo": [],
    "enqueue": [],
    "agents": ["create", "list", "limit"],
    "runs": [
        "list",
        "show",
        "watch",
        "cancel",
        "resume",
        "approve",
        "reject",
        "answer",
        "fork",
        "tree",
        "history",
        "files",
        "file",
        "export",
        "import",
        "purge",
    ],
    "replay": [],
    "memory": ["ls", "show", "rm"],
    "skills": ["add", "list", "show"],
    "ratelimits": ["set", "list", "rm"],
    "budgets": ["set", "show", "rm"],
    "tenants": ["create", "list", "set", "purge"],
    "console": [],
    "gc": [],
    "retention": ["set", "show", "rm"],
}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found[0].choices) if found else {}


def _handlers() -> dict[str, Any]:
    """Every command's handler, by its command line (`runs approve`)."""
    out: dict[str, Any] = {}
    for name, parser in _subcommands(build_parser()).items():
        subs = _subcommands(parser)
        for sub, sp in subs.items():
            out[f"{name} {sub}"] = sp.get_default("fn")
        if not subs:
            out[name] = parser.get_default("fn")
    return out


def _defined(module: str) -> list[str]:
    tree = ast.parse((CLI / f"{module}.py").read_text())
    return [
        n.name
        for n in tree.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("cmd_")
    ]


def _calls(module: str, attr: str) -> bool:
    tree = ast.parse((CLI / f"{module}.py").read_text())
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == attr
        for n in ast.walk(tree)
    )


def test_help_lists_the_same_commands_in_the_same_order() -> None:
    parser = build_parser()
    commands = _subcommands(parser)
    assert list(commands) == list(TREE)
    assert {c: list(_subcommands(p)) for c, p in commands.items()} == TREE
    help_text = parser.format_help()
    positions = [help_text.index(f"\n    {c}") for c in TREE]
    assert positions == sorted(positions)


def test_every_module_with_commands_registers_them_from_the_one_list() -> None:
    with_handlers = sorted(p.stem for p in CLI.glob("*.py") if _defined(p.stem))
    listed = sorted(m.__name__.rsplit(".", 1)[1] for m in COMMANDS)
    assert with_handlers == listed
    assert len(set(COMMANDS)) == len(COMMANDS)
    for module in COMMANDS:
        assert callable(getattr(module, "register", None)), module.__name__


def test_each_handler_is_its_own_modules_and_every_one_is_reachable() -> None:
    handlers = _handlers()
    assert all(fn is not None for fn in handlers.values()), handlers
    by_module: dict[str, set[str]] = {}
    for fn in handlers.values():
        by_module.setdefault(fn.__module__.rsplit(".", 1)[1], set()).add(fn.__name__)
    assert by_module == {m: set(_defined(m)) for m in by_module}
    defined = {f"{m}.{f}" for p in CLI.glob("*.py") for m in [p.stem] for f in _defined(m)}
    reached = {f"{fn.__module__.rsplit('.', 1)[1]}.{fn.__name__}" for fn in handlers.values()}
    assert defined == reached


def test_only_subcommands_py_adds_parsers() -> None:
    """No module adds a command its own way (argparse directly): one pattern."""
    direct = sorted(
        p.stem
        for p in CLI.glob("*.py")
        if p.stem not in ("subcommands", "parser")
        and (_calls(p.stem, "add_parser") or _calls(p.stem, "add_subparsers"))
    )
    assert direct == []
