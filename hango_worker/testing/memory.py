"""In-memory durability port and a one-call harness, to test agents without Postgres.

outcome, state, io = await run_agent(agent, ScriptedProvider(turns), tools=[my_tool])
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hango_worker.agent.chain import Chain
from hango_worker.agent.limits import RunOverrides, deadline_of, merge
from hango_worker.agent.loop import AgentLoop, LoopSettings, RunInfo
from hango_worker.agent.middleware import Middleware
from hango_worker.agent.mw_hitl import DecisionRecord
from hango_worker.agent.ports import Event, FileInfo, Outcome
from hango_worker.agent.spec import AgentSpec
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.agent.state import FileWrite, State, dump_state
from hango_worker.provider.types import (
    Message,
    Provider,
    TextBlock,
    TextSink,
    ToolUseBlock,
    Usage,
)
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
    usage: Usage | None = None  # as of the last checkpoint
    started: list[str] = field(default_factory=list)  # calls resumed after a wait
    # the run's files (run_files), written with the tool result or checkpoint that
    # carried them out of the State.file_writes outbox, as in PgRunIO
    files: dict[str, FileWrite] = field(default_factory=dict)

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
        usage: Usage | None = None,
    ) -> None:
        self.usage = usage
        self._flush(state)
        self.messages.extend(new_messages)
        self.events.extend(events)
        self.checkpoints.append(
            {"messages": len(new_messages), "state": dump_state(state), "outcome": outcome}
        )
        if outcome is not None:
            self.outcome = outcome

    async def mark_started(self, tool_use_id: str) -> None:
        self.started.append(tool_use_id)

    async def record_tool_result(
        self, state: State, call: ToolUseBlock, result: ToolResult, event: Event
    ) -> None:
        self.tool_results[call.id] = result
        self.events.append(event)
        self._flush(state)

    def _flush(self, state: State) -> None:
        for w in state.file_writes:
            self.files[w.path] = w
        state.file_writes.clear()

    async def get_file(self, path: str) -> str | None:
        w = self.files.get(path)
        return None if w is None else w.content

    async def list_files(self) -> list[FileInfo]:
        return [FileInfo(w.path, w.size, w.tool_use_id) for _, w in sorted(self.files.items())]


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
    limits: RunOverrides | None = None,
    decisions: Mapping[str, DecisionRecord] | None = None,
) -> tuple[Outcome, State, MemoryRunIO]:
    """Drive one run attempt in memory. `stack=None` → the default stack for the agent;
    `limits`: a producer's per-run limits (as `runs.input.limits`); `decisions`: a
    person's decisions for a run resumed after waiting (with `info.not_started`)."""
    budget = merge(agent.config, limits)
    if limits is not None and limits.max_turns is not None:
        max_turns = limits.max_turns
    registry = Registry(
        [*Registry.default(load_entry_points=False).view(["current_time", "calculator"]), *tools]
    )
    state = state or make_state(agent)
    io = io or MemoryRunIO()
    if stack is None:
        stack = default_stack(StackConfig.for_agent(agent, io, 3, decisions))
    settings = LoopSettings(
        max_turns=max_turns,
        retry_base_s=0.01,
        provider_name=provider.name,
        capture_content=capture_content,
        on_limit=agent.config.on_limit,
        budget=budget,
        deadline=deadline_of(budget, limits, time.time()),
    )
    loop = AgentLoop(
        agent, Chain(stack), registry.view(agent.tools), provider, io, settings, on_text
    )
    info = info or RunInfo(persisted=0)
    outcome = await loop.run(state, info)
    return outcome, state, io
