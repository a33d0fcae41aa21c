"""default_stack: the exact order, and the exact tool order the provider receives."""

from __future__ import annotations

from hango_worker.agent.chain import Chain
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.testing.memory import run_agent
from tests.helpers import agent, recording_tool, scripted
from tests.test_chain import CapturingProvider


def test_default_stack_order_is_pinned() -> None:
    stack = default_stack(StackConfig(allowlist=("calculator",)))
    assert len(stack) == 11  # every slot of the design, unbuilt ones as None
    assert [m.name if m else None for m in stack] == [
        None,  # Skills
        None,  # Filesystem
        None,  # Subagent
        None,  # Summarization
        "repair_tool_calls",
        "todo",
        "repeat_call",
        None,  # PromptCache
        None,  # Memory
        None,  # HumanInTheLoop
        "tool_allowlist",
    ]
    chain = Chain(stack)
    assert chain.names[-1] == "tool_allowlist"  # innermost
    assert [m.name for m in chain.tool_wrappers] == ["repeat_call", "tool_allowlist"]
    assert [m.name for m in chain.run_hooks] == ["repair_tool_calls"]


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
