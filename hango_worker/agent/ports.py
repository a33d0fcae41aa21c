"""What the loop needs from the outside world (implemented by run/, or in memory by testing/)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hango_worker.agent.control import RunControl
from hango_worker.agent.state import State
from hango_worker.provider.types import Message, ToolUseBlock, Usage
from hango_worker.tool.types import ToolResult
from hango_worker.vocab import Decision

Status = Literal["succeeded", "failed", "cancelled", "released", "waiting"]


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
    limit: str | None = None  # the limit that ended the run (agent/limits.py), if any
    # status "waiting": what the run waits for (stored as runs.waiting_for)
    waiting: dict[str, Any] | None = None
    cost_usd: float | None = None  # None: the model has no price (agent/cost.py)
    # seconds the run waited for the fleet-wide rate limit (None: no limit configured)
    rate_wait_s: float | None = None
    unpriced: str | None = None  # cost None: the units that had no price (agent/cost.py)
    # status "succeeded" of an agent with an output_schema: the parsed final answer
    # (stored as runs.output; agent/middlewares/output.py)
    output: Any = None
    has_output: bool = False

    def usage_dict(self) -> dict[str, Any]:
        """The run's `usage` record: the four token counts (and the 1 h writes), cost_usd
        (and waiting_for_rate_limit, seconds, with a rate limit)."""
        d: dict[str, Any] = {**self.usage.to_dict(), "cost_usd": self.cost_usd}
        if self.cost_usd is None and self.unpriced:
            d["cost_unpriced"] = self.unpriced
        if self.rate_wait_s is not None:
            d["waiting_for_rate_limit"] = round(self.rate_wait_s, 3)
        return d


class Fenced(Exception):
    """A write found that this worker no longer holds the run's lease."""


class RunIO(Protocol):
    """Durability port. Every method is fenced: it raises Fenced when the
    lease was taken over, and the loop then stops writing anything.
    `record_tool_result` and `checkpoint` also store the run files waiting in
    `state.file_writes`, in the same fenced write, and empty that outbox. `control`
    is the run's control state (agent/control.py): a write that finds the lease
    lost or a cancel requested sets it there."""

    control: RunControl

    async def checkpoint(
        self,
        state: State,
        new_messages: list[Message],
        events: list[Event],
        outcome: Outcome | None,
        usage: dict[str, Any] | None = None,
        states: list[tuple[int, str]] | None = None,
    ) -> None:
        """`usage`: the run's `usage` record so far (token counts and cost_usd, all
        attempts), stored with every checkpoint. `states`: (turn, the state at that
        turn's end as JSON) for each turn whose state changed, kept in run_states
        (forks start from them)."""
        ...

    async def record_tool_result(
        self, state: State, call: ToolUseBlock, result: ToolResult, event: Event
    ) -> None: ...

    async def mark_started(self, tool_use_id: str) -> None:
        """A call of a batch resumed after waiting is about to start: record it, so a
        later attempt treats it as interrupted, not as never started (exactly once)."""
        ...


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One run file as listed: `size` in UTF-8 bytes, the call that wrote it last."""

    path: str
    size: int
    tool_use_id: str | None = None
    updated_at: datetime.datetime | None = None


class FileStore(Protocol):
    """Reads of the run's files (`run_files`), scoped to the run. Writes never go
    through here: they ride on the tool result's fenced commit (`State.file_writes`)."""

    async def get_file(self, path: str) -> str | None: ...

    async def list_files(self) -> list[FileInfo]: ...


# -- long-term memory (agent/middlewares/memory.py) ------------------------------------------------

MemoryScopeKind = Literal["agent", "session", "key"]


@dataclass(frozen=True, slots=True)
class MemoryScope:
    """Whose memory: within a tenant and an agent, the whole agent (key ''), one
    session (key = the session id) or a caller-given key (e.g. an end user)."""

    tenant_id: str
    agent_id: str
    kind: MemoryScopeKind
    key: str = ""


@dataclass(frozen=True, slots=True)
class MemoryEntry:
    """One memory file as the index lists it (no content)."""

    path: str
    size: int
    version: int


@dataclass(frozen=True, slots=True)
class MemoryFile:
    content: str
    version: int


@dataclass(frozen=True, slots=True)
class MemoryWrite:
    """What one write did. `written`: the file's new version (0 for a delete), None when
    nothing was written; `current`: the version found (None: no such file); `fenced`:
    this worker no longer holds the run, so nothing was written; `exists`: a rename's
    destination is taken."""

    written: int | None
    current: int | None
    fenced: bool = False
    exists: bool = False


@dataclass(frozen=True, slots=True)
class WriteContext:
    """Who writes: the run and the tool call (kept on the file as its last writer)."""

    run_id: str
    tool_use_id: str


class MemoryStore(Protocol):
    """Memory port: reads, and writes that are each one statement fenced by the run's
    lease and conditioned on the file's version (run/memory.py on Postgres,
    testing/inmem.py in memory)."""

    async def index(self, scope: MemoryScope, prefix: str, limit: int) -> list[MemoryEntry]: ...

    async def read(self, scope: MemoryScope, path: str) -> MemoryFile | None: ...

    async def files_among(self, scope: MemoryScope, paths: list[str]) -> list[str]:
        """Which of `paths` are files (in path order)."""
        ...

    async def create(
        self, scope: MemoryScope, path: str, content: str, by: WriteContext
    ) -> MemoryWrite: ...

    async def update(
        self,
        scope: MemoryScope,
        path: str,
        content: str,
        expected: int,
        by: WriteContext,
        new_path: str | None = None,
    ) -> MemoryWrite: ...

    async def delete(
        self, scope: MemoryScope, path: str, expected: int, by: WriteContext
    ) -> MemoryWrite: ...


@dataclass(frozen=True, slots=True)
class MemoryBinding:
    """Where a run's memory lives: the store (port) and the run's scope."""

    store: MemoryStore
    scope: MemoryScope


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """A person's decision for one call of the pending turn (a `run_decisions` row),
    given to HumanInTheLoop by the attempt that resumes the run."""

    decision: Decision
    name: str  # the call it was made for (tool name and original arguments)
    call_input: dict[str, Any]
    input: dict[str, Any] | None = None  # approve with edited arguments
    text: str | None = None  # reject's reason, or the answer


@dataclass(frozen=True, slots=True)
class ChildRun:
    """A `task` call's child run as the parent sees it."""

    id: str
    status: str
    answer: str = ""  # the child's final text, once it succeeded
    error: dict[str, Any] | None = None


class ChildRuns(Protocol):
    """The parent's view of its child runs (subagents), keyed by the `task` call that
    made each. `spawn` is fenced by the parent's lease and idempotent per call: a
    parent that calls again after a crash gets the child it already has."""

    async def child(self, tool_use_id: str) -> ChildRun | None: ...

    async def spawn(
        self, tool_use_id: str, agent: str | None, text: str, trace_parent: str | None
    ) -> ChildRun: ...


# -- Agent Skills (agent/middlewares/skills.py) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Skill:
    """One skill at one version: SKILL.md's front matter and body, its other files
    ({relative path: text})."""

    name: str
    version: int
    description: str
    body: str
    files: dict[str, str] = field(default_factory=dict)


class SkillStore(Protocol):
    """Skills port (read only): run/skills.py on Postgres, testing/inmem.py in memory."""

    async def latest(self, tenant_id: str, names: list[str]) -> list[Skill]:
        """The latest version of each named skill of the tenant (absent names left out)."""
        ...
