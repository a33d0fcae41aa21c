"""The one assembly of an agent run: the chain and the loop from the agent's config.

The worker (run/execute.py) and the in-memory harness (testing/inmem.py `run_agent`)
both call `assemble`; what differs between them (the durability port, the stores, the
run's depth and decisions, the worker's settings) is passed in, so every option the
agent or the run sets (max_turns, on_limit, limits, params, prices, …) means the same
in a test as in production.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hango_worker.agent.chain import Chain
from hango_worker.agent.control import DEFAULT_MAX_PARALLEL_TOOLS
from hango_worker.agent.limits import RunOverrides, deadline_of, merge
from hango_worker.agent.loop import AgentLoop, LoopSettings
from hango_worker.agent.middleware import DEFAULT_REPEAT_CALL_THRESHOLD, Middleware
from hango_worker.agent.middlewares.hitl import DecisionRecord
from hango_worker.agent.middlewares.memory import TOOL_NAME as MEMORY_TOOL
from hango_worker.agent.middlewares.memory import MemoryBinding, scope_for
from hango_worker.agent.ports import ChildRuns, FileStore, MemoryStore, RunIO, SkillStore
from hango_worker.agent.spec import AgentSpec, with_params, with_user_id
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.provider.prices import PriceTable
from hango_worker.provider.types import FileIds, Provider, TextSink
from hango_worker.tool.mcp_client import McpTools, open_mcp
from hango_worker.tool.registry import Registry, View

DEFAULT_MAX_TURNS = 50  # the worker's default (HANGO_MAX_TURNS, config.py)


@dataclass(frozen=True, slots=True)
class AssemblySettings:
    """The worker's defaults an agent's config falls back on, and how runs are observed.
    The defaults are the worker's (config.py `Settings`); the worker passes its own."""

    max_turns: int = DEFAULT_MAX_TURNS
    repeat_call_threshold: int = DEFAULT_REPEAT_CALL_THRESHOLD
    capture_content: bool = False
    prices: PriceTable = field(default_factory=PriceTable)


@dataclass(frozen=True, slots=True)
class RunParts:
    """What one run brings besides its agent: its stores (ports), where it sits in a
    tree of runs, a person's decisions after a wait, the producer's limits, its start."""

    started_s: float  # epoch seconds the run started (its max_duration_s counts from it)
    overrides: RunOverrides | None = None  # runs.input.limits
    files: FileStore | None = None  # the run's files (run_files)
    memory: MemoryBinding | None = None  # required when the agent lists the memory tool
    skills: SkillStore | None = None  # required when the agent enables skills
    children: ChildRuns | None = None  # subagent runs
    decisions: Mapping[str, DecisionRecord] | None = None
    depth: int = 0
    blob_files: FileIds | None = None  # Files API ids of stored blocks (files_api: true)


def for_run(agent: AgentSpec, tenant_id: str, params: Mapping[str, Any] | None = None) -> AgentSpec:
    """The agent as a run of `tenant_id` sends it: the run's Messages API parameters
    (`runs.input.params`) laid over its config, and the tenant's id as
    `metadata.user_id` unless either sets one. ValueError: the params are refused."""
    config = agent.config if params is None else with_params(agent.config, params)
    config = with_user_id(config, tenant_id)
    return agent if config is agent.config else agent.model_copy(update={"config": config})


def memory_binding(
    agent: AgentSpec,
    store: Callable[[], MemoryStore],
    *,
    tenant_id: str,
    session_id: str,
    memory_key: object,
) -> MemoryBinding | None:
    """The run's memory store (made by `store`) and scope, when its agent lists the
    memory tool. MemoryScopeError: the agent keeps memory per key and the run has none."""
    if MEMORY_TOOL not in agent.tools:
        return None
    scope = scope_for(
        agent.config.memory_scope or "agent",
        tenant_id=tenant_id,
        agent_id=agent.id,
        session_id=session_id,
        memory_key=memory_key,
    )
    return MemoryBinding(store(), scope)


def loop_settings(
    agent: AgentSpec, provider: Provider, run: RunParts, settings: AssemblySettings
) -> LoopSettings:
    """The run's limits: the producer's over the agent's over the worker's defaults."""
    over = run.overrides
    budget = merge(agent.config, over)
    return LoopSettings(
        max_turns=(over and over.max_turns) or agent.config.max_turns or settings.max_turns,
        provider_name=provider.name,
        capture_content=settings.capture_content,
        on_limit=agent.config.on_limit,
        budget=budget,
        deadline=deadline_of(budget, over, run.started_s),
        prices=settings.prices,
        files=run.blob_files if agent.config.files_api else None,
    )


def middlewares(
    agent: AgentSpec, run: RunParts, settings: AssemblySettings
) -> list[Middleware | None]:
    """The agent's default stack (agent/stack.py), over the run's ports."""
    cfg = StackConfig.for_agent(
        agent,
        run.files,
        settings.repeat_call_threshold,
        memory=run.memory,
        decisions=run.decisions,
        children=run.children,
        depth=run.depth,
        skills=run.skills,
    )
    return default_stack(cfg)


@contextlib.asynccontextmanager
async def attempt_mcp(
    agent: AgentSpec, environ: Mapping[str, str] | None = None
) -> AsyncIterator[McpTools | None]:
    """The agent's MCP servers opened for one attempt (tool/mcp_client.py), closed when
    it ends; None: the agent has none. Secret references are read from `environ` (the
    worker's environment)."""
    servers = agent.config.mcp_servers
    if not servers:
        yield None
        return
    async with open_mcp(servers, agent.tools, os.environ if environ is None else environ) as m:
        yield m


def with_mcp(agent: AgentSpec, mcp: McpTools | None) -> AgentSpec:
    """The agent as this attempt sees it: its tools, then the MCP tools its servers'
    `tools` offer that it does not list itself (sorted), so the allowlist and the
    approval rules treat them as any listed tool."""
    extra = [n for n in (mcp.names() if mcp else []) if n not in agent.tools]
    return agent.model_copy(update={"tools": [*agent.tools, *extra]}) if extra else agent


def tool_view(registry: Registry, agent: AgentSpec, mcp: McpTools | None) -> View:
    """The attempt's tools in the agent's order: the registry's and the MCP servers'."""
    if mcp is None:
        return registry.view(agent.tools)
    listed = {t.name: t for t in mcp.tools}
    found = (registry.get(n) or listed.get(n) for n in agent.tools)
    return View([t for t in found if t is not None])


def assemble(
    agent: AgentSpec,
    provider: Provider,
    registry: Registry,
    io: RunIO,
    run: RunParts,
    settings: AssemblySettings,
    on_text: TextSink | None = None,
    stack: Sequence[Middleware | None] | None = None,
    mcp: McpTools | None = None,
) -> AgentLoop:
    """The loop for one run of `agent`. `stack`: a middleware list to use instead of
    the agent's default one (tests of a middleware alone); everything else is the same.
    `mcp`: the attempt's MCP tools (`attempt_mcp`)."""
    agent = with_mcp(agent, mcp)
    if stack is None:
        stack = middlewares(agent, run, settings)
    io.control.max_parallel_tools = agent.config.max_parallel_tools or DEFAULT_MAX_PARALLEL_TOOLS
    loop = AgentLoop(
        agent,
        Chain(stack),
        tool_view(registry, agent, mcp),
        provider,
        io,
        loop_settings(agent, provider, run, settings),
        on_text,
    )
    loop.mcp = mcp
    return loop
