"""default_stack: the one place middleware order is decided (docs/design.md §5.3).

Index 0 is outermost. Each middleware module (agent/middlewares/) holds its
middleware, its config section (inherited by `AgentConfig`) and its
`build(ctx) -> Middleware | None`; `ORDER` lists the builds, one line per slot.
A slot whose middleware is idle for the agent is an explicit `None`, skipped by
the chain, so every slot keeps its index. A new middleware: one new module and
one line in `ORDER` (and, if it offers a tool, its name in PROVIDED_TOOLS).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hango_worker.agent.middleware import Build, Middleware, StackContext
from hango_worker.agent.middlewares import (
    allowlist,
    filesystem,
    hitl,
    memory,
    output,
    prompt_cache,
    repair,
    repeat,
    skills,
    subagent,
    summarize,
    todo,
)
from hango_worker.agent.middlewares.allowlist import PROVIDED_TOOLS as PROVIDED_TOOLS
from hango_worker.agent.ports import ChildRuns, DecisionRecord, FileStore, MemoryBinding, SkillStore
from hango_worker.agent.spec import AgentSpec

ORDER: tuple[Build, ...] = (
    # Skills: outermost, so skill instructions frame every later block and tool.
    # (Run hooks in slots before RepairToolCalls see history before it is repaired.)
    skills.build,
    # Filesystem: before summarization, which must see results already offloaded to files.
    filesystem.build,
    # Subagent: delegation sees the filesystem tools but not the parent's summaries.
    subagent.build,
    # Summarization: after filesystem, so it compacts what is left in the context.
    summarize.build,
    # RepairToolCalls: before anything reads history, so all later hooks see a valid one.
    repair.build,
    # Todo: early among contributors, so the plan sits before the cache breakpoint.
    todo.build,
    # RepeatCall: outside the allowlist, so a banned call is counted but still rejected.
    repeat.build,
    # PromptCache: before Memory, so memory edits land after the cached prefix.
    prompt_cache.build,
    # Memory: after the cache breakpoint; its blocks change often.
    memory.build,
    # Output: checks the final answer; its final tool (tool mode) is in the allowlist.
    output.build,
    # HumanInTheLoop: just outside the allowlist, so approvals see calls after every
    # rewrite; it sees a call before the allowlist does, so it must skip banned tools.
    hitl.build,
    # ToolAllowlist: last = innermost, so no middleware can re-add a banned tool.
    # (`provided`: tools this stack offers every agent; unlisted ones are dropped quietly.)
    allowlist.build,
)


@dataclass(frozen=True, slots=True)
class StackConfig(StackContext):
    """What `default_stack` builds from: the agent and the run's ports
    (agent/middleware.py:StackContext); `for_agent` makes one for a run."""

    @classmethod
    def for_agent(
        cls,
        agent: AgentSpec,
        files: FileStore | None,
        repeat_call_threshold: int,
        memory: MemoryBinding | None = None,
        decisions: Mapping[str, DecisionRecord] | None = None,
        children: ChildRuns | None = None,
        depth: int = 0,
        skills: SkillStore | None = None,
    ) -> StackConfig:
        """The agent's stack over the worker's defaults (`repeat_call_threshold`);
        `decisions`: a person's, for a run resumed after waiting."""
        spec = output.OutputSpec.of(agent.config, agent.model)
        final = (output.TOOL_NAME,) if spec is not None and spec.mode == "tool" else ()
        return cls(
            (*agent.tools, *final),
            repeat_call_threshold,
            files=files,
            memory=memory,
            decisions=decisions or {},
            children=children,
            depth=depth,
            skills=skills,
            agent=agent,
        )


def default_stack(ctx: StackContext) -> list[Middleware | None]:
    """One slot per entry of `ORDER`, in its order (None: idle for this agent)."""
    return [build(ctx) for build in ORDER]
