"""Todo: the write_todos planning tool and the plan as one system block."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pydantic import TypeAdapter, ValidationError

from hango_worker.agent.middleware import StackContext
from hango_worker.agent.state import State
from hango_worker.agent.state import Todo as TodoItem
from hango_worker.provider.types import TextBlock
from hango_worker.telemetry.tracing import current_turn_span
from hango_worker.tool.types import Tool, ToolContext, ToolResult

TOOL_NAME = "write_todos"

DESCRIPTION = """\
Write your plan as a todo list. Each call REPLACES the whole list: always send every item.

When to use it: multi-step work of about three steps or more, or when the user asks for a plan \
or a todo list. When not to: a trivial task (one or two obvious steps) or a conversational \
request — just answer.

How: items are {"content": "...", "status": "pending" | "in_progress" | "completed"}. Mark an \
item in_progress before you start it and keep one item in progress at a time; mark it \
completed right after finishing it, not in batches later. Call this tool at most once per \
response.

Marking items completed is not an answer: when the work is done, give the user the answer in \
a message after your last update."""

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "todos": {
            "type": "array",
            "description": "The complete, updated list.",
            "items": {
                "type": "object",
                "properties": {
                    "content": {"type": "string", "minLength": 1},
                    "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
                },
                "required": ["content", "status"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["todos"],
    "additionalProperties": False,
}

_TODOS = TypeAdapter(list[TodoItem])


def counts(todos: list[TodoItem]) -> dict[str, int]:
    c = Counter(t.status for t in todos)
    return {s: c.get(s, 0) for s in ("pending", "in_progress", "completed")}


def render(todos: list[TodoItem]) -> str:
    lines = ["Current todo list (maintained with write_todos; update it as you work):"]
    marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
    lines += [f"{i}. {marks[t.status]} {t.content}" for i, t in enumerate(todos, 1)]
    return "\n".join(lines)


def _calls_in_last_response(state: State) -> int:
    for m in reversed(state.messages):
        if m.role == "assistant":
            return sum(1 for u in m.tool_uses() if u.name == TOOL_NAME)
    return 0


def apply(state: State, args: dict[str, Any]) -> ToolResult:
    n = _calls_in_last_response(state)
    if n > 1:
        return ToolResult.error(
            f"write_todos was called {n} times in one response; nothing was changed. "
            "Call it once, with the whole list."
        )
    try:
        todos = _TODOS.validate_python(args.get("todos"))
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return ToolResult.error(
            f"invalid todo list at todos.{where}: {err['msg']}. Each item needs a non-empty "
            "'content' and a 'status' of pending, in_progress or completed; nothing was changed."
        )
    state.todos = todos
    c = counts(todos)
    span = current_turn_span()
    span.add_event(
        "agent.todos_updated",
        {
            "hango.todos.total": len(todos),
            "hango.todos.pending": c["pending"],
            "hango.todos.in_progress": c["in_progress"],
            "hango.todos.completed": c["completed"],
        },
    )
    span.set_attribute("langfuse.observation.metadata.todos_total", len(todos))
    span.set_attribute("langfuse.observation.metadata.todos_completed", c["completed"])
    return ToolResult(
        f"Todo list updated: {len(todos)} items ({c['in_progress']} in progress, "
        f"{c['completed']} completed, {c['pending']} pending)."
    )


class Todo:
    """ToolProvider + PromptContributor. The list lives in `State.todos`
    (persisted in state_json), never in the messages."""

    name = "todo"

    def __init__(self) -> None:
        self._bound: tuple[State, Tool] | None = None

    def provide_tools(self, state: State) -> list[Tool]:
        if self._bound is None or self._bound[0] is not state:

            async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
                return apply(state, args)

            # sequential: it changes the run's plan (State.todos)
            tool = Tool(TOOL_NAME, DESCRIPTION, SCHEMA, call, idempotent=True, sequential=True)
            self._bound = (state, tool)
        return [self._bound[1]]

    def system_blocks(self, state: State) -> list[TextBlock]:
        if not state.todos:
            return []
        return [TextBlock(text=render(state.todos))]


def build(ctx: StackContext) -> Todo:
    return Todo()
