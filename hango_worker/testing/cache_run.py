"""A long tool-calling run for measuring the prompt cache (tests and `bench/`).

An agent with a ~3k-token system prompt and 10 tools, a script of N turns (N - 1
tool calls, then an answer), run in memory through the default stack (or that stack
without PromptCache) with the real `anthropic` SDK against FakeAnthropic, whose cache
reads and writes follow the breakpoints it receives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hango_worker.agent.middleware import Middleware
from hango_worker.agent.middlewares.memory import MemoryBinding
from hango_worker.agent.ports import Outcome
from hango_worker.agent.spec import AgentConfig, AgentSpec
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.testing.inmem import MemoryRunIO, run_agent
from hango_worker.tool.types import Tool, ToolContext, ToolResult

PROMPT_CACHE_SLOT = 7  # PromptCache's index in default_stack
MODEL = "claude-sonnet-4-6"
SYSTEM = "You are a meticulous operations agent. Follow the runbook exactly. " * 180  # ~3k tok


def cache_tools(n: int = 10) -> list[Tool]:
    async def fn(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(f"ok: {args.get('text', '')}")

    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    return [
        Tool(f"tool_{i}", f"Tool number {i}: looks things up in system {i}. " * 4, schema, fn)
        for i in range(n)
    ]


def cache_agent(
    *, system: Sequence[str] = (SYSTEM,), n_tools: int = 10, **config: Any
) -> AgentSpec:
    return AgentSpec(
        id="agent-cache",
        name="cacher",
        model=MODEL,
        system=list(system),
        tools=[f"tool_{i}" for i in range(n_tools)] + ["write_todos"],
        config=AgentConfig(**config),
    )


def cache_script(turns: int) -> list[dict[str, Any]]:
    """`turns - 1` tool calls with distinct arguments (RepeatCall never blocks), an answer."""
    calls = [
        {"tool_calls": [{"name": f"tool_{i % 10}", "input": {"text": f"step {i}"}}]}
        for i in range(turns - 1)
    ]
    return [*calls, {"text": "done"}]


def cache_stack(
    agent: AgentSpec, *, cache: bool = True, memory: MemoryBinding | None = None
) -> list[Middleware | None]:
    """default_stack for `agent`; with `cache=False`, its PromptCache slot left out;
    `memory`: the store and scope for an agent that lists the memory tool."""
    cfg = StackConfig(tuple(agent.tools), 3, memory=memory, agent=agent)
    stack = default_stack(cfg)
    if not cache:
        stack[PROMPT_CACHE_SLOT] = None
    return stack


async def run_on_wire(
    fake: FakeAnthropic, agent: AgentSpec, stack: Sequence[Middleware | None]
) -> tuple[Outcome, MemoryRunIO]:
    provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
    try:
        outcome, _, io = await run_agent(
            agent, provider, tools=cache_tools(), stack=stack, max_turns=10_000
        )
    finally:
        await provider.aclose()
    return outcome, io


def turn_usages(io: MemoryRunIO) -> list[dict[str, int]]:
    return [e.payload["usage"] for e in io.events if e.type == "model_message"]


def read_share(u: dict[str, int]) -> float:
    """Cache reads / (input + cache reads + cache writes)."""
    total = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    return u["cache_read_input_tokens"] / total if total else 0.0


def shares(io: MemoryRunIO) -> list[float]:
    return [read_share(u) for u in turn_usages(io)]


@dataclass(slots=True)
class Measured:
    outcome: Outcome
    io: MemoryRunIO


async def measure(turns: int, *, cache: bool) -> Measured:
    """One run of `turns` turns, with or without PromptCache, on a fresh fake server."""
    agent = cache_agent()
    async with FakeAnthropic(cache_script(turns)) as fake:
        outcome, io = await run_on_wire(fake, agent, cache_stack(agent, cache=cache))
    if outcome.status != "succeeded":
        raise RuntimeError(f"the cache run failed: {outcome.error}")
    return Measured(outcome, io)
