"""Subagent: `task(description, subagent_type)` delegates to a durable child run.

A `task` call enqueues a child run in Postgres (same tenant; the parent run and the
call recorded on it; one child per call, whatever crashes happen) and the parent
waits for it the one way a run waits (docs/design.md §12): the batch goes on, so
several `task` calls of one turn start several children at once, then the parent
ends its attempt `waiting` (no lease, no slot). Any worker runs the children; the
last one to finish re-queues the parent (the sweep does it too, should that miss),
and the resumed parent gets each child's final answer — or its failure, as an
error result — as the call's result, in call order.

`subagent_type` names an agent of the tenant that the parent's config lists in
`subagents`, or `general`: the parent's own agent. `max_depth` bounds recursion.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from hango_worker.agent.middleware import AwaitChild, StackContext, ToolCallRequest, ToolHandler
from hango_worker.agent.ports import ChildRun, ChildRuns
from hango_worker.agent.state import State
from hango_worker.telemetry.tracing import current_traceparent, middleware_event
from hango_worker.tool.types import Tool, ToolContext, ToolResult

TOOL_NAME = "task"
GENERAL = "general"
DEFAULT_MAX_DEPTH = 2
DESCRIPTION = (
    "Delegate a self-contained task to a subagent, which works on it on its own and "
    "returns its final answer. Several task calls in one turn run at the same time. "
    "Give the subagent everything it needs in the description: it sees nothing else."
)
FINAL = ("succeeded", "failed", "cancelled")


def schema(types: Iterable[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "description": {"type": "string", "minLength": 1, "maxLength": 100_000},
            "subagent_type": {"type": "string", "enum": sorted(types)},
        },
        "required": ["description"],
        "additionalProperties": False,
    }


class SubagentConfig(BaseModel):
    """The agent's settings (`agents.config`, a section of AgentConfig): the agents it may
    delegate to with `task` (besides "general": itself), and how deep subagents nest."""

    subagents: list[str] = Field(default_factory=list)
    max_depth: int | None = Field(default=None, ge=1, le=10)  # None: DEFAULT_MAX_DEPTH


class Subagent:
    name = "subagent"

    def __init__(
        self,
        children: ChildRuns | None,
        allowed: Iterable[str] = (),
        depth: int = 0,
        max_depth: int = DEFAULT_MAX_DEPTH,
    ) -> None:
        self.children = children
        self.types = {GENERAL, *allowed}
        self.depth = depth
        self.max_depth = max_depth
        self._tool: Tool | None = None

    def provide_tools(self, state: State) -> list[Tool]:
        if self._tool is None:

            async def never(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
                return ToolResult.error("task runs only through the subagent middleware")

            # idempotent: after a crash the call is made again and finds its child
            # sequential: each call creates its child run in order (it only starts the
            # child, which runs elsewhere, so the children still run at the same time)
            self._tool = Tool(
                TOOL_NAME, DESCRIPTION, schema(self.types), never, idempotent=True, sequential=True
            )
        return [self._tool]

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        if req.call.name != TOOL_NAME or req.tool is None or self.children is None:
            return await next(req)
        kind = str(req.call.input.get("subagent_type") or GENERAL)
        if kind not in self.types:
            known = ", ".join(sorted(self.types))
            return ToolResult.error(f"unknown subagent_type {kind!r} (this agent may use: {known})")
        child = await self.children.child(req.call.id)
        if child is None:
            if self.depth + 1 > self.max_depth:
                return ToolResult.error(
                    f"not executed: subagents may nest {self.max_depth} deep (max_depth) and "
                    "this run is already at that depth; do the task yourself"
                )
            agent = None if kind == GENERAL else kind
            text = str(req.call.input.get("description", ""))
            child = await self.children.spawn(req.call.id, agent, text, current_traceparent())
            middleware_event(
                "subagent.started", self.name, kind, **{"hango.child.run_id": child.id}
            )
        if child.status not in FINAL:
            raise AwaitChild(child.id)
        return _result(child)


def _result(child: ChildRun) -> ToolResult:
    if child.status == "succeeded":
        return ToolResult(child.answer or "(the subagent finished without a text answer)")
    why = (child.error or {}).get("message") or child.status
    return ToolResult.error(f"the subagent run {child.id} {child.status}: {why}")


def build(ctx: StackContext) -> Subagent | None:
    """Only for agents that list its `task` tool."""
    if TOOL_NAME not in ctx.allowlist:
        return None
    c = ctx.settings(SubagentConfig)
    return Subagent(ctx.children, c.subagents, ctx.depth, c.max_depth or DEFAULT_MAX_DEPTH)
