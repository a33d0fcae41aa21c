"""Registry of every tool a worker knows, and the View one agent gets."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
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
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is registered twice")
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
    def default(cls, *, load_entry_points: bool = True) -> Registry:
        from hango_worker.tool.builtins import BUILTIN_TOOLS

        reg = cls(BUILTIN_TOOLS)
        if load_entry_points:
            for ep in entry_points(group=ENTRY_POINT_GROUP):
                try:
                    loaded = ep.load()
                    obj = loaded() if callable(loaded) and not isinstance(loaded, Tool) else loaded
                    items = [obj] if isinstance(obj, Tool) else list(obj)
                    for t in items:
                        reg.add(t)
                except Exception as e:
                    raise RuntimeError(
                        f"tool entry point {ep.name!r} ({ep.value}) failed to load: {e}"
                    ) from e
        return reg


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
