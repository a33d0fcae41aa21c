"""default_stack: the one place middleware order is decided (docs/design.md §5.3).

Index 0 is outermost. Slots not built yet are explicit `None`s, skipped by
the chain, so the order of the finished product is visible today.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from hango_worker.agent.compaction import CompactionConfig
from hango_worker.agent.middleware import Middleware
from hango_worker.agent.middlewares.allowlist import ToolAllowlist
from hango_worker.agent.middlewares.filesystem import (
    DEFAULT_OFFLOAD_THRESHOLD_BYTES,
    FILE_TOOLS,
    Filesystem,
)
from hango_worker.agent.middlewares.hitl import (
    ASK_USER,
    ApprovalRule,
    DecisionRecord,
    HumanInTheLoop,
)
from hango_worker.agent.middlewares.memory import TOOL_NAME as MEMORY_TOOL
from hango_worker.agent.middlewares.memory import Memory, MemoryBinding
from hango_worker.agent.middlewares.output import TOOL_NAME as OUTPUT_TOOL
from hango_worker.agent.middlewares.output import Output, OutputSpec
from hango_worker.agent.middlewares.prompt_cache import CacheTTL, PromptCache
from hango_worker.agent.middlewares.repair import RepairToolCalls
from hango_worker.agent.middlewares.repeat import RepeatCall
from hango_worker.agent.middlewares.skills import TOOL_NAME as SKILL_TOOL
from hango_worker.agent.middlewares.skills import Skills
from hango_worker.agent.middlewares.subagent import DEFAULT_MAX_DEPTH, Subagent
from hango_worker.agent.middlewares.subagent import TOOL_NAME as TASK_TOOL
from hango_worker.agent.middlewares.summarize import Summarization
from hango_worker.agent.middlewares.todo import TOOL_NAME as TODO_TOOL
from hango_worker.agent.middlewares.todo import Todo
from hango_worker.agent.ports import ChildRuns, FileStore, SkillStore
from hango_worker.agent.spec import AgentSpec

DEFAULT_REPEAT_CALL_THRESHOLD = 3
# tools the stack's middlewares offer (each only to agents that list it)
PROVIDED_TOOLS = (TODO_TOOL, *FILE_TOOLS, MEMORY_TOOL, ASK_USER, TASK_TOOL, SKILL_TOOL)


@dataclass(frozen=True, slots=True)
class StackConfig:
    allowlist: tuple[str, ...]
    repeat_call_threshold: int = DEFAULT_REPEAT_CALL_THRESHOLD
    # the run's files (run_files); None: only writes still in the outbox can be read
    files: FileStore | None = None
    offload_threshold_bytes: int = DEFAULT_OFFLOAD_THRESHOLD_BYTES
    # the run's memory store and scope; required when the agent lists the memory tool
    memory: MemoryBinding | None = None
    compaction: CompactionConfig = field(default_factory=CompactionConfig)
    cache_ttl: CacheTTL = "5m"
    approvals: tuple[ApprovalRule, ...] = ()
    # decisions for the pending turn of a run resumed after waiting (by tool_use id)
    decisions: Mapping[str, DecisionRecord] = field(default_factory=dict)
    approval_timeout_s: float | None = None
    on_approval_timeout: Literal["reject", "fail"] = "reject"
    # the run's child runs (subagents), its depth, the agents it may delegate to
    children: ChildRuns | None = None
    depth: int = 0
    subagents: tuple[str, ...] = ()
    max_depth: int = DEFAULT_MAX_DEPTH
    # the agent's enabled skills (config.skills) and the tenant's skill store (read port)
    skill_names: tuple[str, ...] = ()
    skills: SkillStore | None = None
    # the agent's output_schema and how it is asked for (None: a free-text answer)
    output: OutputSpec | None = None

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
        """The agent's configuration over the worker's defaults; `decisions`: a person's,
        for a run resumed after waiting."""
        c = agent.config
        output = OutputSpec.for_agent(agent)
        final = (OUTPUT_TOOL,) if output is not None and output.mode == "tool" else ()
        return cls(
            (*agent.tools, *final),
            c.repeat_call_threshold or repeat_call_threshold,
            files=files,
            offload_threshold_bytes=c.offload_threshold_bytes or DEFAULT_OFFLOAD_THRESHOLD_BYTES,
            memory=memory,
            compaction=CompactionConfig.of(c),
            cache_ttl=c.cache_ttl,
            approvals=tuple(c.approvals),
            decisions=decisions or {},
            approval_timeout_s=c.approval_timeout_s,
            on_approval_timeout=c.on_approval_timeout,
            children=children,
            depth=depth,
            subagents=tuple(c.subagents),
            max_depth=c.max_depth or DEFAULT_MAX_DEPTH,
            skill_names=tuple(c.skills),
            skills=skills,
            output=output,
        )


def _memory(cfg: StackConfig) -> Memory | None:
    """Memory only for agents that list its tool (others: no load, no block)."""
    if MEMORY_TOOL not in cfg.allowlist:
        return None
    if cfg.memory is None:
        raise ValueError("the agent lists the memory tool but the stack has no memory store")
    return Memory(cfg.memory)


def _subagent(cfg: StackConfig) -> Subagent | None:
    """Subagent only for agents that list its `task` tool."""
    if TASK_TOOL not in cfg.allowlist:
        return None
    return Subagent(cfg.children, cfg.subagents, cfg.depth, cfg.max_depth)


def _skills(cfg: StackConfig) -> Skills | None:
    """Skills only for agents that enable some (others: no load, no block)."""
    if not cfg.skill_names:
        return None
    if cfg.skills is None:
        raise ValueError("the agent enables skills but the stack has no skill store")
    return Skills(cfg.skills, cfg.skill_names)


def default_stack(cfg: StackConfig) -> list[Middleware | None]:
    return [
        # Skills: outermost, so skill instructions frame every later block and tool.
        # (Run hooks in slots before RepairToolCalls see history before it is repaired.)
        _skills(cfg),
        # Filesystem: before summarization, which must see results already offloaded to files.
        Filesystem(cfg.files, cfg.offload_threshold_bytes),
        # Subagent: delegation sees the filesystem tools but not the parent's summaries.
        _subagent(cfg),
        # Summarization: after filesystem, so it compacts what is left in the context.
        Summarization(cfg.compaction),
        # RepairToolCalls: before anything reads history, so all later hooks see a valid one.
        RepairToolCalls(),
        # Todo: early among contributors, so the plan sits before the cache breakpoint.
        Todo(),
        # RepeatCall: outside the allowlist, so a banned call is counted but still rejected.
        RepeatCall(threshold=cfg.repeat_call_threshold),
        # PromptCache: before Memory, so memory edits land after the cached prefix.
        PromptCache(cfg.cache_ttl),
        # Memory: after the cache breakpoint; its blocks change often.
        _memory(cfg),
        # Output: checks the final answer; its final tool (tool mode) is in the allowlist.
        Output(cfg.output) if cfg.output is not None else None,
        # HumanInTheLoop: just outside the allowlist, so approvals see calls after every
        # rewrite; it sees a call before the allowlist does, so it must skip banned tools.
        HumanInTheLoop(
            cfg.approvals,
            cfg.allowlist,
            cfg.decisions,
            cfg.approval_timeout_s,
            cfg.on_approval_timeout,
        ),
        # ToolAllowlist: last = innermost, so no middleware can re-add a banned tool.
        # (`provided`: tools this stack offers every agent; unlisted ones are dropped quietly.)
        ToolAllowlist(cfg.allowlist, provided=PROVIDED_TOOLS),
    ]
