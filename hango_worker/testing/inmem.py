"""In-memory durability port and a one-call harness, to test agents without Postgres.

outcome, state, io = await run_agent(agent, ScriptedProvider(turns), tools=[my_tool])
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hango_worker.agent.assemble import (
    AssemblySettings,
    RunParts,
    assemble,
    attempt_mcp,
    for_run,
    memory_binding,
)
from hango_worker.agent.limits import RunOverrides
from hango_worker.agent.loop import RunInfo
from hango_worker.agent.middleware import Middleware
from hango_worker.agent.middlewares.hitl import DecisionRecord
from hango_worker.agent.ports import (
    MemoryEntry,
    MemoryFile,
    MemoryScope,
    MemoryStore,
    MemoryWrite,
    Outcome,
    Skill,
    SkillStore,
    WriteContext,
)
from hango_worker.agent.recording_io import RecordingRunIO
from hango_worker.agent.spec import AgentSpec
from hango_worker.agent.state import State
from hango_worker.provider.types import (
    Message,
    Provider,
    TextBlock,
    TextSink,
)
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool

# the harness's name for it (tests written against it keep working)
MemoryRunIO = RecordingRunIO


@dataclass
class StoredMemory:
    content: str
    version: int
    run_id: str
    tool_use_id: str


@dataclass
class InMemoryMemoryStore:
    """The memory port in memory, with the same conditions and answers as the Postgres
    one (tests/contracts/test_store_ports.py): a write by a run in `fenced_runs` (a
    worker that lost the lease) writes nothing, and a write names the version it was
    made on. As on Postgres, a fenced write and a rename onto a path that exists answer
    with no `current` version."""

    files: dict[tuple[str, str, str, str, str], StoredMemory] = field(default_factory=dict)
    fenced_runs: set[str] = field(default_factory=set)

    @staticmethod
    def _k(scope: MemoryScope, path: str) -> tuple[str, str, str, str, str]:
        return (scope.tenant_id, scope.agent_id, scope.kind, scope.key, path)

    async def index(self, scope: MemoryScope, prefix: str, limit: int) -> list[MemoryEntry]:
        here = self._k(scope, "")[:4]
        found = sorted(
            (k[4], f) for k, f in self.files.items() if k[:4] == here and k[4].startswith(prefix)
        )
        return [MemoryEntry(p, len(f.content.encode()), f.version) for p, f in found[:limit]]

    async def read(self, scope: MemoryScope, path: str) -> MemoryFile | None:
        f = self.files.get(self._k(scope, path))
        return None if f is None else MemoryFile(f.content, f.version)

    async def files_among(self, scope: MemoryScope, paths: list[str]) -> list[str]:
        return sorted(p for p in set(paths) if self._k(scope, p) in self.files)

    def _current(self, scope: MemoryScope, path: str) -> int | None:
        f = self.files.get(self._k(scope, path))
        return None if f is None else f.version

    async def create(
        self, scope: MemoryScope, path: str, content: str, by: WriteContext
    ) -> MemoryWrite:
        current = self._current(scope, path)
        if by.run_id in self.fenced_runs:
            return MemoryWrite(None, None, fenced=True)
        if current is not None:
            return MemoryWrite(None, current)
        self.files[self._k(scope, path)] = StoredMemory(content, 1, by.run_id, by.tool_use_id)
        return MemoryWrite(1, None)

    async def update(
        self,
        scope: MemoryScope,
        path: str,
        content: str,
        expected: int,
        by: WriteContext,
        new_path: str | None = None,
    ) -> MemoryWrite:
        current = self._current(scope, path)
        if by.run_id in self.fenced_runs:
            return MemoryWrite(None, None, fenced=True)
        if current != expected:
            return MemoryWrite(None, current)
        target = new_path or path
        if target != path and self._current(scope, target) is not None:
            return MemoryWrite(None, None, exists=True)
        del self.files[self._k(scope, path)]
        stored = StoredMemory(content, expected + 1, by.run_id, by.tool_use_id)
        self.files[self._k(scope, target)] = stored
        return MemoryWrite(expected + 1, current)

    async def delete(
        self, scope: MemoryScope, path: str, expected: int, by: WriteContext
    ) -> MemoryWrite:
        current = self._current(scope, path)
        if by.run_id in self.fenced_runs:
            return MemoryWrite(None, None, fenced=True)
        if current != expected:
            return MemoryWrite(None, current)
        del self.files[self._k(scope, path)]
        return MemoryWrite(0, current)


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


@dataclass(slots=True)
class InMemorySkillStore:
    """The skills port in memory: (tenant, name) → versions, oldest first."""

    skills: dict[tuple[str, str], list[Skill]] = field(default_factory=dict)

    def add(
        self,
        tenant_id: str,
        name: str,
        description: str,
        body: str,
        files: dict[str, str] | None = None,
    ) -> int:
        versions = self.skills.setdefault((tenant_id, name), [])
        versions.append(Skill(name, len(versions) + 1, description, body, dict(files or {})))
        return len(versions)

    async def latest(self, tenant_id: str, names: list[str]) -> list[Skill]:
        """Each named skill once, in name order, as on Postgres (sql.SKILLS_LATEST)."""
        found = sorted(set(names))
        return [self.skills[(tenant_id, n)][-1] for n in found if (tenant_id, n) in self.skills]


def _run_parts(
    agent: AgentSpec,
    state: State,
    io: MemoryRunIO,
    limits: RunOverrides | None,
    memory: MemoryStore | None,
    memory_key: str | None,
    decisions: Mapping[str, DecisionRecord] | None,
    skills: SkillStore | None,
) -> RunParts:
    """The run's ports in memory: `io` holds its files; an agent listing the memory tool
    gets `memory`, or a fresh in-memory store; one enabling skills gets `skills`, or an
    empty store."""
    binding = memory_binding(
        agent,
        lambda: memory or InMemoryMemoryStore(),
        tenant_id=state.tenant_id,
        session_id=state.session_id,
        memory_key=memory_key,
    )
    return RunParts(
        started_s=time.time(),
        overrides=limits,
        files=io,
        memory=binding,
        skills=skills or InMemorySkillStore(),
        decisions=decisions,
    )


def _settings(
    settings: AssemblySettings | None, max_turns: int | None, capture_content: bool | None
) -> AssemblySettings:
    s = settings or AssemblySettings()
    if max_turns is not None:
        s = replace(s, max_turns=max_turns)
    if capture_content is not None:
        s = replace(s, capture_content=capture_content)
    return s


async def run_agent(
    agent: AgentSpec,
    provider: Provider,
    *,
    tools: Sequence[Tool] = (),
    stack: Sequence[Middleware | None] | None = None,
    state: State | None = None,
    io: MemoryRunIO | None = None,
    max_turns: int | None = None,
    on_text: TextSink | None = None,
    info: RunInfo | None = None,
    capture_content: bool | None = None,
    limits: RunOverrides | None = None,
    memory: MemoryStore | None = None,
    memory_key: str | None = None,
    decisions: Mapping[str, DecisionRecord] | None = None,
    skills: SkillStore | None = None,
    params: Mapping[str, Any] | None = None,
    settings: AssemblySettings | None = None,
) -> tuple[Outcome, State, MemoryRunIO]:
    """Drive one run attempt in memory, assembled as the worker assembles it
    (agent/assemble.py). `settings`: the worker's defaults (None: the worker's own
    defaults); `max_turns`, `capture_content`: those settings' HANGO_MAX_TURNS and
    HANGO_CAPTURE_CONTENT (the agent's config and `limits` still win, as in production);
    `limits`: a producer's per-run limits (`runs.input.limits`); `params`: the run's
    Messages API parameters (`runs.input.params`); `decisions`: a person's decisions for
    a run resumed after waiting (with `info.not_started`). `tools`: besides the built-ins
    current_time and calculator; one of the same name replaces it. `stack=None` → the agent's
    default stack (an agent listing the memory tool gets `memory`, or a fresh in-memory
    store); a list replaces only the middlewares. The agent's `mcp_servers` are opened for
    the attempt and closed after it, as the worker does (agent/assemble.py attempt_mcp)."""
    state = state or make_state(agent)
    agent = for_run(agent, state.tenant_id, params)
    given = {t.name for t in tools}  # a tool given replaces the built-in of its name
    builtins = [n for n in ("current_time", "calculator") if n not in given]
    registry = Registry([*Registry.default(load_entry_points=False).view(builtins), *tools])
    io = io or MemoryRunIO()
    io.control.retry_base_s = 0.01
    run = _run_parts(agent, state, io, limits, memory, memory_key, decisions, skills)
    chosen = _settings(settings, max_turns, capture_content)
    info = info or RunInfo(persisted=0)
    async with attempt_mcp(agent) as mcp:
        loop = assemble(agent, provider, registry, io, run, chosen, on_text, stack, mcp)
        outcome = await loop.run(state, info)
    return outcome, state, io
