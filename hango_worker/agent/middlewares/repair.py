"""RepairToolCalls: make a history with dangling tool_use blocks valid again."""

from __future__ import annotations

from hango_worker.agent.middleware import StackContext
from hango_worker.agent.state import State
from hango_worker.provider.types import Message, ToolResultBlock, ToolUseBlock
from hango_worker.telemetry.tracing import middleware_event

INTERRUPTED = (
    "This tool call was interrupted before it completed (crash, cancel or restart); "
    "its outcome is unknown. Check the current state before retrying it."
)


def dangling_tool_uses(messages: list[Message]) -> list[tuple[int, list[ToolUseBlock]]]:
    """(index of assistant message, its unanswered tool_use blocks) for every gap."""
    out: list[tuple[int, list[ToolUseBlock]]] = []
    for i, m in enumerate(messages):
        if m.role != "assistant":
            continue
        uses = m.tool_uses()
        if not uses:
            continue
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        answered: set[str] = set()
        if nxt is not None and nxt.role == "user":
            answered = {b.tool_use_id for b in nxt.content if isinstance(b, ToolResultBlock)}
        missing = [u for u in uses if u.id not in answered]
        if missing:
            out.append((i, missing))
    return out


def repair(messages: list[Message]) -> int:
    """Insert synthetic error results in place; returns how many were added.

    A gap at the end of history gets a new user message; a gap in the middle
    gets its results put first in the following user message, as the API requires.
    """
    added = 0
    for i, missing in reversed(dangling_tool_uses(messages)):
        blocks = [ToolResultBlock(u.id, INTERRUPTED, is_error=True) for u in missing]
        added += len(blocks)
        nxt = messages[i + 1] if i + 1 < len(messages) else None
        if nxt is not None and nxt.role == "user":
            results = [b for b in nxt.content if isinstance(b, ToolResultBlock)]
            others = [b for b in nxt.content if not isinstance(b, ToolResultBlock)]
            messages[i + 1] = Message("user", [*results, *blocks, *others])
        else:
            messages.insert(i + 1, Message("user", list(blocks)))
    return added


class RepairToolCalls:
    name = "repair_tool_calls"

    async def before_run(self, state: State) -> None:
        added = repair(state.messages)
        if added:
            middleware_event(
                "middleware.request_rewritten",
                self.name,
                "dangling tool_use repaired",
                **{"hango.repair.count": added},
            )


def build(ctx: StackContext) -> RepairToolCalls:
    return RepairToolCalls()
