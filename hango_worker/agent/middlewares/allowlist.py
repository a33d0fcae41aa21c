"""ToolAllowlist: the innermost middleware; deny by default."""

from __future__ import annotations

from collections.abc import Iterable

from hango_worker.agent.middleware import (
    ModelHandler,
    ModelRequest,
    ModelResponse,
    StackContext,
    ToolCallRequest,
    ToolHandler,
)
from hango_worker.agent.middlewares.filesystem import FILE_TOOLS
from hango_worker.agent.middlewares.hitl import ASK_USER
from hango_worker.agent.middlewares.memory import TOOL_NAME as MEMORY_TOOL
from hango_worker.agent.middlewares.skills import TOOL_NAME as SKILL_TOOL
from hango_worker.agent.middlewares.subagent import TOOL_NAME as TASK_TOOL
from hango_worker.agent.middlewares.todo import TOOL_NAME as TODO_TOOL
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import deny_tool_call, middleware_event
from hango_worker.tool.types import ToolResult

# tools the stack's middlewares offer (each only to agents that list it); a middleware
# that offers a new tool adds it here (tests/test_stack.py checks the list is complete)
PROVIDED_TOOLS = (TODO_TOOL, *FILE_TOOLS, MEMORY_TOOL, ASK_USER, TASK_TOOL, SKILL_TOOL)


class ToolAllowlist:
    """Only tools named in the agent's `tools` reach the model or run.

    Last in the stack, so whatever an outer middleware adds to the request's
    tool list is filtered here, right before the provider sees it.

    When filtering is a *rewrite* (`middleware.request_rewritten`): the agent's
    own configuration offers the model exactly its listed tools. The allowlist
    never removes one of those, so the only question is where an unlisted tool
    in the request came from:

    - `provided`: tools the stack's ToolProviders offer to every agent (e.g.
      `write_todos`). An agent that does not list one has opted out of it;
      dropping it gives the model exactly what the agent's configuration says,
      so nothing is recorded (otherwise every turn of every such agent would
      carry the event and drown the signal).
    - anything else: an outer middleware put it into this request. Dropping it
      changes what that middleware sent, so it is recorded, naming the tools.

    A listed tool missing from the request was removed by an outer middleware,
    which records its own rewrite; the allowlist has nothing to add.

    A call to an unlisted tool is denied without running it: an expected,
    recorded outcome (`middleware.short_circuited` on the turn, `tool.denied`
    on the `execute_tool` span, which is not marked as an error)."""

    name = "tool_allowlist"

    def __init__(self, allowed: Iterable[str], provided: Iterable[str] = ()) -> None:
        self.allowed = frozenset(allowed)
        self.provided = frozenset(provided)
        self._listing = ", ".join(sorted(self.allowed)) or "none"

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        tools = req.request.tools
        kept = [t for t in tools if t.name in self.allowed]
        if len(kept) == len(tools):
            return await next(req)
        injected = sorted({t.name for t in tools} - self.allowed - self.provided)
        if injected:
            middleware_event(
                "middleware.request_rewritten",
                self.name,
                "tools not in allowlist removed",
                **{"hango.tools.removed": injected},
            )
        return await next(req.with_request(tools=kept))

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        if req.call.name in self.allowed:
            return await next(req)
        middleware_event(
            "middleware.short_circuited",
            self.name,
            "tool not in allowlist",
            **{"gen_ai.tool.name": req.call.name},
        )
        deny_tool_call(self.name, "tool not in allowlist")
        metrics.MW_SHORT_CIRCUITS.labels(self.name).inc()
        return ToolResult.error(
            f"tool '{req.call.name}' is not allowed for this agent "
            f"(allowed: {self._listing}); it was not run"
        )


def build(ctx: StackContext) -> ToolAllowlist:
    """`provided`: tools this stack offers every agent; unlisted ones are dropped quietly."""
    return ToolAllowlist(ctx.allowlist, provided=PROVIDED_TOOLS)
