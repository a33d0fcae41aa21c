"""Memory and the prompt cache, on the wire (docs/learning/09-caching-and-memory.md): the memory
index is a system block placed AFTER PromptCache's system breakpoint, so a memory edit
never invalidates the cached prefix of tools and agent blocks.

The real `anthropic` SDK against FakeAnthropic, whose cache reads and writes follow the
breakpoints it receives. Within a run the index is the attempt's snapshot, so a write
changes tool results, not the prompt; across runs of one scope the index block changes,
and only the chain order keeps that change out of the cached prefix: with Memory placed
before PromptCache, the next run's first call reads the tools only.
"""

from __future__ import annotations

from typing import Any

import pytest

from hango_worker.agent.middleware import Middleware
from hango_worker.agent.middlewares.memory import MemoryBinding
from hango_worker.agent.ports import MemoryScope
from hango_worker.agent.spec import AgentSpec
from hango_worker.testing import FakeAnthropic
from hango_worker.testing.cache_run import (
    SYSTEM,
    cache_agent,
    cache_script,
    cache_stack,
    run_on_wire,
    shares,
    turn_usages,
)
from hango_worker.testing.fake_anthropic.cache import PromptCache as FakeCache
from hango_worker.testing.fake_anthropic.tokens import segments
from hango_worker.testing.inmem import InMemoryMemoryStore, MemoryRunIO
from tests.helpers import call

SCOPE = MemoryScope("tenant-1", "agent-cache", "agent")
INDEX_HEAD = "You have long-term memory"  # how the memory index block starts
NOTES = "/memories/notes.md"
AGENT_BLOCKS = (SYSTEM, "Second agent block: answer in English.")


def memory_agent() -> AgentSpec:
    a = cache_agent(system=AGENT_BLOCKS)
    return a.model_copy(update={"tools": [*a.tools, "memory"]})


def write_notes(text: str) -> dict[str, Any]:
    return {"tool_calls": [call("memory", command="create", path=NOTES, file_text=text)]}


def stack(
    a: AgentSpec, store: InMemoryMemoryStore, *, memory_first: bool = False
) -> list[Middleware | None]:
    """default_stack with the scope's memory, as it is; `memory_first`: the same pieces,
    with Memory moved to just before PromptCache (the wrong order)."""
    s = cache_stack(a, memory=MemoryBinding(store, SCOPE))
    if memory_first:
        memory = s.pop(names(s).index("memory"))
        s.insert(names(s).index("prompt_cache"), memory)
    return s


def names(s: list[Middleware | None]) -> list[str | None]:
    return [m.name if m else None for m in s]


async def run_ok(fake: FakeAnthropic, a: AgentSpec, s: list[Middleware | None]) -> MemoryRunIO:
    outcome, io = await run_on_wire(fake, a, s)
    assert outcome.status == "succeeded", outcome.error
    return io


def index_block(body: dict[str, Any]) -> str:
    """The memory index: the last system block (no plan is written in these runs)."""
    text = body["system"][-1]["text"]
    assert isinstance(text, str) and text.startswith(INDEX_HEAD)
    return text


def prefix_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(tools, tools + the system blocks before the memory index) in the fake's tokens."""
    counts = [n for _, n, _ in segments(body)]
    n_tools, n_system = len(body["tools"]), len(body["system"])
    return sum(counts[:n_tools]), sum(counts[: n_tools + n_system - 1])


# -- within a run: a write in turn 10 leaves turn 11 reading the prefix -----------------------


@pytest.mark.parametrize("memory_first", [False, True], ids=["memory-after", "memory-before"])
async def test_memory_written_in_turn_ten_keeps_turn_eleven_cache_reads_above_95_percent(
    memory_first: bool,
) -> None:
    """Memory after PromptCache: a changed index could not touch the cached prefix anyway.
    Memory before it (the wrong order): the share holds only because the index is the
    attempt's snapshot (a write changes tool results, not the prompt)."""
    a = memory_agent()
    script = cache_script(14)
    script[9] = write_notes("The user prefers metric units.")  # turn 10
    store = InMemoryMemoryStore()
    async with FakeAnthropic(script) as fake:
        io = await run_ok(fake, a, stack(a, store, memory_first=memory_first))
        bodies = [r.body for r in fake.requests]
    assert len(bodies) == 14
    written = await store.read(SCOPE, NOTES)
    assert written is not None and written.content == "The user prefers metric units."
    s = shares(io)
    order = "Memory before PromptCache" if memory_first else "Memory after PromptCache"
    print(
        f"\n{order}: cache-read share of input tokens: turn 10 {s[9]:.4f}, turn 11 {s[10]:.4f} "
        f"(after the memory write), turns 2-14 min {min(s[1:]):.4f}"
    )
    assert s[10] >= 0.95
    assert min(s[1:]) >= 0.95
    # turn 11 carries the write's result; the index block is the run's snapshot
    result = bodies[10]["messages"][-1]["content"][0]
    assert result["content"] == f"File created successfully at: {NOTES}"
    assert {index_block(b) for b in bodies} == {index_block(bodies[0])}
    assert "(no memory files yet)" in index_block(bodies[0])


# -- across runs: the index block changes; only the order keeps it out of the prefix ----------


async def two_runs(*, memory_first: bool) -> tuple[dict[str, Any], dict[str, Any], dict[str, int]]:
    """Run 1 of the scope writes a memory file; run 2 (same scope, agent and server,
    well within the 5 m TTL) answers at once. Returns run 1's first request body, run
    2's first request body and run 2's first usage."""
    a, store = memory_agent(), InMemoryMemoryStore()
    async with FakeAnthropic(
        [write_notes("Deploys need a change ticket."), {"text": "ok"}]
    ) as fake:
        await run_ok(fake, a, stack(a, store, memory_first=memory_first))
        first = fake.requests[0].body
        fake.clear()
        fake.load([{"text": "done"}])
        io = await run_ok(fake, a, stack(a, store, memory_first=memory_first))
        second = fake.requests[0].body
    return first, second, turn_usages(io)[0]


async def test_run_two_reads_tools_and_agent_blocks_despite_the_changed_index() -> None:
    first, second, usage = await two_runs(memory_first=False)
    # the index block changed between the runs; everything before it did not
    assert NOTES not in index_block(first) and NOTES in index_block(second)
    assert first["tools"] == second["tools"]
    assert first["system"][:-1] == second["system"][:-1]
    assert [b["text"] for b in second["system"][:-1]] == list(AGENT_BLOCKS)
    tools, prefix = prefix_tokens(second)
    read = usage["cache_read_input_tokens"]
    print(
        f"\nrun 2, first call (Memory after PromptCache): cache read {read} tokens; "
        f"tools {tools}, tools + agent blocks {prefix}"
    )
    assert read >= prefix > tools
    # the system breakpoint is on the last agent block, before the index
    assert [i for i, b in enumerate(second["system"]) if "cache_control" in b] == [1]


async def test_with_memory_before_prompt_cache_run_two_reads_only_the_tools() -> None:
    """The wrong order: the index is inside the cached system prefix, so its change
    invalidates everything after the tools (this is what proves the order matters)."""
    first, second, usage = await two_runs(memory_first=True)
    assert NOTES not in index_block(first) and NOTES in index_block(second)
    # the system breakpoint now sits on the index block itself
    last = len(second["system"]) - 1
    assert [i for i, b in enumerate(second["system"]) if "cache_control" in b] == [last]
    tools, prefix = prefix_tokens(second)
    read = usage["cache_read_input_tokens"]
    print(
        f"\nrun 2, first call (Memory before PromptCache): cache read {read} tokens; "
        f"tools {tools}, tools + agent blocks {prefix}"
    )
    assert read < prefix
    assert read == tools


# -- the fake: a breakpoint on the last tool caches the tools ----------------------------------


def test_the_fake_reads_the_tools_at_a_tool_breakpoint_when_the_system_changed() -> None:
    cc = {"type": "ephemeral"}
    tools = [{"name": f"t{i}", "description": "d" * 80, "input_schema": {}} for i in range(3)]
    tools[-1]["cache_control"] = cc

    def body(system: str) -> dict[str, Any]:
        return {
            "model": "m",
            "tools": tools,
            "system": [{"type": "text", "text": system, "cache_control": cc}],
            "messages": [{"role": "user", "content": "hi"}],
        }

    cache = FakeCache(min_cacheable_tokens=10)
    first = cache.account(body("a" * 400))
    tools_tokens = sum(n for _, n, _ in segments(body(""))[:3])
    assert first.cache_creation_input_tokens == tools_tokens + 100
    changed = cache.account(body("b" * 400))
    assert changed.cache_read_input_tokens == tools_tokens
    assert changed.cache_creation_input_tokens == 100
