"""Tools: what an agent can call (the types, the registry, the threads sync tools
run in).

May import: `provider`, `telemetry`, `vocab`. Never imports `agent`, `store`, `run`
or anything above them (import-linter contracts in `.importlinter`, `make lint`).
"""

from hango_worker.tool.registry import Registry, View
from hango_worker.tool.types import Tool, ToolContext, ToolFn, ToolResult

__all__ = ["Registry", "Tool", "ToolContext", "ToolFn", "ToolResult", "View"]
