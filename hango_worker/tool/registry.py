"""Registry of every tool a worker knows, and the View one agent gets."""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib.metadata import entry_points

from hango_worker.tool.types import Tool

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hango_worker.tools"


class Registry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        """Register a tool; ToolLoadError when its definition is invalid (name, input
        schema, time limit) or its name is taken, so a bad tool stops the worker at
        start-up instead of failing every call."""
        try:
            tool.check()
        except ValueError as e:
            raise ToolLoadError(str(e)) from None
        if tool.name in self._tools:
            raise ToolLoadError(f"tool {tool.name!r} is registered twice")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def view(self, names: Sequence[str]) -> View:
        """The tools named by an agent, in the agent's order; names the registry
        does not hold (e.g. middleware-provided tools) are simply not in the view."""
        return View([self._tools[n] for n in names if n in self._tools])

    @classmethod
    def default(cls, *, load_entry_points: bool = True, modules: str = "") -> Registry:
        """Built-ins, then the `hango_worker.tools` entry points, then `modules`
        ("pkg.mod:attr,…", each a Tool, a list of Tools, or a callable returning either)."""
        from hango_worker.tool.builtins import BUILTIN_TOOLS

        reg = cls(BUILTIN_TOOLS)
        if load_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                reg._load(f"tool entry point {ep.name!r} ({ep.value})", ep.load)
        for spec in filter(None, (m.strip() for m in modules.split(","))):
            reg._load(f"tool module {spec!r}", functools.partial(_import_attr, spec))
        return reg

    def _load(self, what: str, load: Callable[[], object]) -> None:
        try:
            obj = load()
            if callable(obj) and not isinstance(obj, Tool):
                obj = obj()
            items = [obj] if isinstance(obj, Tool) else list(obj)  # type: ignore[call-overload]
            for t in items:
                if not isinstance(t, Tool):
                    raise TypeError(f"{t!r} is not a hango_worker.tool.Tool")
                self.add(t)
        except Exception as e:
            raise ToolLoadError(f"{what} failed to load: {e}") from e


class ToolLoadError(RuntimeError):
    """A tool could not be loaded or is invalid; the message names it."""


def _import_attr(spec: str) -> object:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError("expected 'package.module:attribute'")
    return getattr(importlib.import_module(module), attr)


class View:
    """The tools one agent may use, in the agent's configured order."""

    __slots__ = ("_by_name", "tools")

    def __init__(self, tools: list[Tool]) -> None:
        self.tools = tools
        self._by_name = {t.name: t for t in tools}

    def get(self, name: str) -> Tool | None:
        return self._by_name.get(name)

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)
