"""RecordingRunIO: the loop's durability port (agent/ports.py RunIO) kept in memory."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hango_worker.agent.control import RunControl
from hango_worker.agent.ports import Event, FileInfo, Outcome
from hango_worker.agent.state import FileWrite, State, dump_state
from hango_worker.provider.types import Message, ToolUseBlock
from hango_worker.tool.types import ToolResult


@dataclass
class RecordingRunIO:
    """A RunIO that records every write the loop makes, in order, instead of committing
    it: the in-memory harness's (testing/inmem.py, as MemoryRunIO) and a replay's
    (run/replay.py), which writes nothing anywhere."""

    control: RunControl = field(default_factory=RunControl)
    messages: list[Message] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    tool_results: dict[str, ToolResult] = field(default_factory=dict)
    outcome: Outcome | None = None
    usage: dict[str, Any] | None = None  # the run's `usage` record at the last checkpoint
    started: list[str] = field(default_factory=list)  # calls resumed after a wait
    # (turn, state at its end as JSON), kept when it changed: as run_states
    states: list[tuple[int, str]] = field(default_factory=list)
    # the run's files (run_files), written with the tool result or checkpoint that
    # carried them out of the State.file_writes outbox, as in PgRunIO
    files: dict[str, FileWrite] = field(default_factory=dict)

    async def checkpoint(
        self,
        state: State,
        new_messages: list[Message],
        events: list[Event],
        outcome: Outcome | None,
        usage: dict[str, Any] | None = None,
        states: list[tuple[int, str]] | None = None,
    ) -> None:
        self.usage = usage
        self.states.extend(states or [])
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
