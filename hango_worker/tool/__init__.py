"""Tools: what an agent can call. Imports only from `provider`."""

from hango_worker.tool.registry import Registry, View
from hango_worker.tool.types import Tool, ToolContext, ToolFn, ToolResult

__all__ = ["Registry", "Tool", "ToolContext", "ToolFn", "ToolResult", "View"]
