"""default_stack: the exact order, and the exact tool order the provider receives."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import asyncpg
from pydantic import BaseModel

from hango_worker.agent import middlewares
from hango_worker.agent.chain import Chain
from hango_worker.agent.limits import Budget
from hango_worker.agent.middleware import ToolProvider
from hango_worker.agent.middlewares import allowlist, skills
from hango_worker.agent.middlewares.output import TOOL_NAME as FINAL_TOOL
from hango_worker.agent.ports import MemoryBinding, MemoryScope
from hango_worker.agent.spec import AgentConfig, LoopConfig
from hango_worker.agent.stack import ORDER, PROVIDED_TOOLS, StackConfig, default_stack
from hango_worker.agent.state import State
from hango_worker.provider.platforms import PlatformConfig
from hango_worker.testing.inmem import InMemoryMemoryStore, InMemorySkillStore, run_agent
from hango_worker.tool.mcp_config import McpConfig
from tests.helpers import agent, call, recording_tool, scripted
from tests.test_chain import CapturingProvider
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle


def test_default_stack_order_is_pinned() -> None:
    stack = default_stack(StackConfig(allowlist=("calculator",)))
    assert len(stack) == 12  # every slot of the design, unbuilt ones as None
    assert [m.name if m else None for m in stack] == [
        None,  # Skills
        "filesystem",
        None,  # Subagent
        "summarization",
        "repair_tool_calls",
        "todo",
        "repeat_call",
        "prompt_cache",
        None,  # Memory
        None,  # Output
        "human_in_the_loop",
        "tool_allowlist",
    ]
    chain = Chain(stack)
    assert chain.names[-1] == "tool_allowlist"  # innermost
    assert [m.name for m in chain.tool_wrappers] == [
        "filesystem",
        "repeat_call",
        "human_in_the_loop",
        "tool_allowlist",
    ]
    assert [m.name for m in chain.run_hooks] == ["repair_tool_calls"]


def test_the_skills_slot_is_index_0_for_agents_that_enable_skills() -> None:
    a = agent(tools=["load_skill"], skills=["pdf"])
    stack = default_stack(StackConfig.for_agent(a, None, 3, skills=InMemorySkillStore()))
    assert len(stack) == 12
    assert stack[0] is not None and stack[0].name == "skills"  # outermost
    chain = Chain(stack)
    assert [m.name for m in chain.run_hooks] == ["skills", "repair_tool_calls"]
    assert [m.name for m in chain.contributors][:2] == ["skills", "todo"]


MIDDLEWARES = "hango_worker.agent.middlewares."


def _modules() -> list[str]:
    return sorted(
        p.stem for p in Path(middlewares.__file__).parent.glob("*.py") if p.stem[0] != "_"
    )


def _sections() -> list[type[BaseModel]]:
    """AgentConfig's bases that come from a middleware module."""
    return [c for c in AgentConfig.__mro__[1:] if c.__module__.startswith(MIDDLEWARES)]


def test_every_middleware_module_has_exactly_one_slot_in_order() -> None:
    """Adding a middleware: one module (its middleware, config section and `build`) and
    one line in ORDER; skills stays outermost and the allowlist innermost."""
    slots = [build.__module__.removeprefix(MIDDLEWARES) for build in ORDER]
    assert sorted(slots) == _modules()  # every module once, nothing else
    assert len(set(slots)) == len(slots)
    assert all(build.__name__ == "build" for build in ORDER)
    assert ORDER[0] is skills.build and ORDER[-1] is allowlist.build
    assert len(default_stack(StackConfig(allowlist=()))) == len(ORDER)


def test_agent_config_is_the_sections_of_the_middlewares_plus_the_loops_own_keys() -> None:
    """Each module with settings has one config section, inherited by AgentConfig;
    its fields are exactly the sections', the loop's, the budget's, the MCP servers'
    (tool/mcp_config.py) and the platform's (provider/platforms.py), none in two."""
    sections = _sections()
    assert len({c.__module__ for c in sections}) == len(sections)  # one per module
    for name in _modules():
        module = importlib.import_module(MIDDLEWARES + name)
        own = [
            v
            for k, v in vars(module).items()
            if k.endswith("Config") and isinstance(v, type) and issubclass(v, BaseModel)
        ]
        assert [c for c in own if c.__module__ == module.__name__] == [
            c for c in sections if c.__module__ == module.__name__
        ], name
    groups = [*sections, LoopConfig, Budget, McpConfig, PlatformConfig]
    keys = [k for g in groups for k in g.model_fields]
    assert len(keys) == len(set(keys))  # no key in two sections
    assert set(keys) == set(AgentConfig.model_fields)
    assert AgentConfig.model_config.get("extra") == "allow"  # the API's parameters


def test_provided_tools_are_every_tool_the_stack_offers() -> None:
    """PROVIDED_TOOLS (dropped quietly for an agent that does not list one) names every
    tool a middleware offers, but the final answer tool, which the allowlist always has."""
    every = (*PROVIDED_TOOLS, FINAL_TOOL)
    a = agent(
        tools=list(every), skills=["pdf"], output_schema={"type": "object"}, output_mode="tool"
    )
    memory = MemoryBinding(InMemoryMemoryStore(), MemoryScope("t", "a", "agent"))
    cfg = StackConfig.for_agent(a, None, 3, memory=memory, skills=InMemorySkillStore())
    state = State("r", "s", "a", "t")
    offered = [
        t.name
        for m in default_stack(cfg)
        if isinstance(m, ToolProvider)
        for t in m.provide_tools(state)
    ]
    assert sorted(offered) == sorted(every)


async def test_tool_order_view_then_provided_then_allowlist_filter() -> None:
    echo, _ = recording_tool()
    provider = CapturingProvider(scripted({"text": "ok"}))
    # agent order: echo before calculator; write_todos allowed; current_time exists but not listed
    a = agent(tools=["echo", "write_todos", "calculator"])
    await run_agent(a, provider, tools=[echo])
    assert [t.name for t in provider.requests[0].tools] == ["echo", "calculator", "write_todos"]


async def test_provided_tools_need_listing_too() -> None:
    provider = CapturingProvider(scripted({"text": "ok"}))
    await run_agent(agent(tools=["calculator"]), provider)
    assert [t.name for t in provider.requests[0].tools] == ["calculator"]


async def test_empty_allowlist_offers_no_tool() -> None:
    provider = CapturingProvider(scripted({"text": "ok"}))
    await run_agent(agent(tools=[]), provider)
    assert provider.requests[0].tools == []


def _repeats(n: int) -> list[dict[str, Any]]:
    return [{"tool_calls": [call("echo", text="same")]}] * n + [{"text": "ok"}]


async def test_the_stack_config_threshold_reaches_the_repeat_middleware() -> None:
    echo, calls = recording_tool()
    stack = default_stack(StackConfig(allowlist=("echo",), repeat_call_threshold=5))
    await run_agent(agent(tools=["echo"]), scripted(*_repeats(5)), tools=[echo], stack=stack)
    assert len(calls) == 4  # the fifth identical call is the first one blocked


async def test_the_worker_reads_the_repeat_threshold_from_the_environment(
    pool: asyncpg.Pool, dsn: str, monkeypatch: Any
) -> None:
    """HANGO_REPEAT_CALL_THRESHOLD → Settings → the stack each run is built with; an
    agent's own repeat_call_threshold still wins."""
    monkeypatch.setenv("HANGO_REPEAT_CALL_THRESHOLD", "4")
    echo, calls = recording_tool()
    await make_agent(pool, name="from_env", tools=["echo"])
    await make_agent(pool, name="own", tools=["echo"], config={"repeat_call_threshold": 2})
    first = await enqueue(pool, agent="from_env")
    await run_until_idle(dsn, scripted(*_repeats(4)), tools=[echo])
    assert (await details(pool, first))["status"] == "succeeded"
    assert len(calls) == 3  # the default (3) would have let only two through
    calls.clear()
    second = await enqueue(pool, agent="own")
    await run_until_idle(dsn, scripted(*_repeats(4)), tools=[echo])
    assert (await details(pool, second))["status"] == "succeeded"
    assert len(calls) == 1


async def test_the_worker_builds_each_runs_loop_from_its_settings(
    pool: asyncpg.Pool, dsn: str, spans: Any
) -> None:
    """max_turns, model retries and content capture come from the worker's settings
    (HANGO_MAX_TURNS, HANGO_MODEL_RETRIES, HANGO_CAPTURE_CONTENT) when the agent sets none."""
    await make_agent(pool, name="plain", tools=["calculator"], config={"on_limit": "fail"})
    looping = [{"tool_calls": [call("calculator", expression="1+1")]}] * 3 + [{"text": "ok"}]
    first = await enqueue(pool, agent="plain")
    await run_until_idle(dsn, scripted(*looping), max_turns=2)
    run = await details(pool, first)
    assert run["status"] == "failed"
    assert run["error"] == {
        "type": "max_turns",
        "message": "the run reached max_turns (2) without a final answer",
    }
    busy = {"type": "overloaded_error", "message": "busy", "retryable": True, "times": 2}
    flaky = scripted({"text": "ok", "error": busy})
    second = await enqueue(pool, agent="plain")
    await run_until_idle(dsn, flaky, model_retries=1)
    run = await details(pool, second)
    assert run["status"] == "failed" and run["error"]["type"] == "overloaded_error"
    assert flaky.calls == 2  # the first call and one retry
    third = await enqueue(pool, agent="plain")
    await run_until_idle(dsn, scripted({"text": "CAPTURED-7e1"}), capture_content=True)
    assert (await details(pool, third))["status"] == "succeeded"
    chat = spans.named("chat ")[-1]
    assert "CAPTURED-7e1" in chat.attributes["gen_ai.output.messages"]
    assert chat.attributes["gen_ai.provider.name"] == "scripted"
