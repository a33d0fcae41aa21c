"""In-memory durability port and a one-call harness, to test agents without Postgres.

outcome, state, io = await run_agent(agent, ScriptedProvider(turns), tools=[my_tool])
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hango_worker.agent.chain import Chain
from hango_worker.agent.loop import AgentLoop, LoopSettings, RunInfo
from hango_worker.agent.middleware import Middleware
from hango_worker.agent.ports import Event, Outcome
from hango_worker.agent.spec import AgentSpec
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.agent.state import State, dump_state
from hango_worker.provider.types import Message, Provider, TextBlock, TextSink, ToolUseBlock
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolResult


@dataclass
class MemoryRunIO:
    """Records every write the loop makes, in order, instead of committing it."""

    cancel_event: asyncio.Event = field(default_factory=asyncio.Event)
    shutdown: bool = False
    messages: list[Message] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    tool_results: dict[str, ToolResult] = field(default_factory=dict)
    outcome: Outcome | None = None

    def stop_requested(self) -> Literal["cancel", "shutdown"] | None:
        if self.cancel_event.is_set():
            return "cancel"
        return "shutdown" if self.shutdown else None

    async def checkpoint(
        self,
        state: State,
        new_messages: list[Message],
        events: list[Event],
        outcome: Outcome | None,
    ) -> None:
        self.messages.extend(new_messages)
        self.events.extend(events)
        self.checkpoints.append(
            {"messages": len(new_messages), "state": dump_state(state), "outcome": outcome}
        )
        if outcome is not None:
            self.outcome = outcome

    async def record_tool_result(
        self, state: State, call: ToolUseBlock, result: ToolResult, event: Event
    ) -> None:
        self.tool_results[call.id] = result
        self.events.append(event)


def make_state(
    agent: AgentSpec, text: str | None = "hello", history: Sequence[Message] = ()
) -> State:
    msgs = list(history)
    if text is not None:
        msgs.append(Message("user", [TextBlock(text)]))
    return State(
        run_id="run-1",
        session_id="session-1",
        agent_id=agent.id,
        tenant_id="tenant-1",
        messages=msgs,
    )


async def run_agent(
    agent: AgentSpec,
    provider: Provider,
    *,
    tools: Sequence[Tool] = (),
    stack: Sequence[Middleware | None] | None = None,
    state: State | None = None,
    io: MemoryRunIO | None = None,
    max_turns: int = 20,
    on_text: TextSink | None = None,
    info: RunInfo | None = None,
    capture_content: bool = False,
) -> tuple[Outcome, State, MemoryRunIO]:
    """Drive one run attempt in memory. `stack=None` → the default stack for the agent."""
    registry = Registry(
        [*Registry.default(load_entry_points=False).view(["current_time", "calculator"]), *tools]
    )
    if stack is None:
        threshold = agent.config.repeat_call_threshold or 3
        stack = default_stack(
            StackConfig(tuple(agent.tools), threshold, cache_ttl=agent.config.cache_ttl)
        )
    state = state or make_state(agent)
    io = io or MemoryRunIO()
    settings = LoopSettings(
        max_turns=max_turns,
        retry_base_s=0.01,
        provider_name=provider.name,
        capture_content=capture_content,
    )
    loop = AgentLoop(
        agent, Chain(stack), registry.view(agent.tools), provider, io, settings, on_text
    )
    info = info or RunInfo(persisted=0)
    outcome = await loop.run(state, info)
    return outcome, state, io
