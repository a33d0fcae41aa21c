"""What the loop needs from the outside world (implemented by run/, or in memory by testing/)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hango_worker.agent.state import State
from hango_worker.provider.types import Message, ToolUseBlock, Usage
from hango_worker.tool.types import ToolResult

Status = Literal["succeeded", "failed", "cancelled", "released"]


@dataclass(slots=True)
class Event:
    """A coarse run event (a `run_events` row): never one per stream delta."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Outcome:
    status: Status
    error: dict[str, Any] | None = None
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = None  # None: the model has no price (agent/cost.py)

    def usage_dict(self) -> dict[str, Any]:
        """The run's `usage` record: the four token counts (and the 1 h writes), cost_usd."""
        return {**self.usage.to_dict(), "cost_usd": self.cost_usd}


class Fenced(Exception):
    """A write found that this worker no longer holds the run's lease."""


class RunIO(Protocol):
    """Durability port. Every method is fenced: it raises Fenced when the
    lease was taken over, and the loop then stops writing anything."""

    cancel_event: asyncio.Event

    async def checkpoint(
        self,
        state: State,
        new_messages: list[Message],
        events: list[Event],
        outcome: Outcome | None,
    ) -> None: ...

    async def record_tool_result(
        self, state: State, call: ToolUseBlock, result: ToolResult, event: Event
    ) -> None: ...

    def stop_requested(self) -> Literal["cancel", "shutdown"] | None: ...
