"""ToolAllowlist: the innermost middleware; deny by default."""

from __future__ import annotations

from collections.abc import Iterable

from hango_worker.agent.middleware import (
    ModelHandler,
    ModelRequest,
    ModelResponse,
    ToolCallRequest,
    ToolHandler,
)
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.tool.types import ToolResult


class ToolAllowlist:
    """Only tools named in the agent's `tools` reach the model or run.

    Last in the stack, so whatever an outer middleware adds to the request's
    tool list is filtered here, right before the provider sees it."""

    name = "tool_allowlist"

    def __init__(self, allowed: Iterable[str]) -> None:
        self.allowed = frozenset(allowed)
        self._listing = ", ".join(sorted(self.allowed)) or "none"

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        tools = req.request.tools
        kept = [t for t in tools if t.name in self.allowed]
        if len(kept) != len(tools):
            removed = sorted({t.name for t in tools} - self.allowed)
            middleware_event(
                "middleware.request_rewritten",
                self.name,
                "tools not in allowlist removed",
                **{"hango.tools.removed": removed},
            )
            req = req.with_request(tools=kept)
        return await next(req)

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        if req.call.name in self.allowed:
            return await next(req)
        middleware_event(
            "middleware.short_circuited",
            self.name,
            "tool not in allowlist",
            **{"gen_ai.tool.name": req.call.name},
        )
        metrics.MW_SHORT_CIRCUITS.labels(self.name).inc()
        return ToolResult.error(
            f"tool '{req.call.name}' is not allowed for this agent "
            f"(allowed: {self._listing}); it was not run"
        )
