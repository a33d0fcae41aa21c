"""A memory path is a file or a directory, never both: a file below a file, or a file
where a directory is, is refused in one line naming the file in the way; a path that is
both already (made before the check, or by two runs at once) is shown whole, so nothing
is lost (agent/middlewares/memory.py, agent/memory_files.py)."""

from __future__ import annotations

from typing import Any

import asyncpg

from hango_worker.agent.middlewares.memory import Memory, MemoryBinding
from hango_worker.agent.ports import MemoryScope, MemoryStore
from hango_worker.run.memory import PgMemoryStore
from hango_worker.store import repo
from hango_worker.testing.inmem import InMemoryMemoryStore, make_state
from hango_worker.tool.types import ToolContext, ToolResult
from tests.helpers import agent
from tests.test_memory import _claimed

CTX = ToolContext(run_id="run-1", tenant_id="t", tool_use_id="toolu_1")


async def run(memory: Memory, ctx: ToolContext = CTX, **args: Any) -> ToolResult:
    return await memory.run_command(make_state(agent(tools=["memory"])), args, ctx)


async def refuses_both(store: MemoryStore, scope: MemoryScope, ctx: ToolContext = CTX) -> None:
    memory = Memory(MemoryBinding(store, scope))

    async def run(memory: Memory, **args: Any) -> ToolResult:
        return await memory.run_command(make_state(agent(tools=["memory"])), args, ctx)

    assert not (await run(memory, command="create", path="/memories/a", file_text="x")).is_error
    deep = await run(memory, command="create", path="/memories/a/b/c.md", file_text="y")
    assert deep.is_error and "/memories/a is a file, so /memories/a/b/c.md cannot" in deep.content
    assert "\n" not in deep.content
    assert not (await run(memory, command="create", path="/memories/d/e", file_text="z")).is_error
    on_dir = await run(memory, command="create", path="/memories/d", file_text="w")
    assert on_dir.is_error and "/memories/d is a directory" in on_dir.content
    moved = await run(memory, command="rename", old_path="/memories/d/e", new_path="/memories/a/e")
    assert moved.is_error and "/memories/a is a file" in moved.content
    onto_dir = await run(memory, command="rename", old_path="/memories/a", new_path="/memories/d")
    assert onto_dir.is_error and "/memories/d is a directory" in onto_dir.content
    listing = await run(memory, command="view", path="/memories")
    assert "/memories/a\n" in listing.content + "\n" and "/memories/d/e" in listing.content


async def test_a_file_below_a_file_is_refused_in_memory() -> None:
    """Proves: before, /memories/a/b/c.md was created below the file /memories/a, and
    /memories/a then viewed as the file alone: c.md could not be found by viewing."""
    await refuses_both(InMemoryMemoryStore(), MemoryScope("t", "a", "agent"))


async def test_a_file_below_a_file_is_refused_on_postgres(pool: asyncpg.Pool) -> None:
    """Proves: the same through PgMemoryStore (the ancestors read in one statement)."""
    io, agent_id = await _claimed(pool)
    scope = MemoryScope(repo.DEFAULT_TENANT_ID, agent_id, "agent")
    ctx = ToolContext(run_id=io.claim.run_id, tenant_id=scope.tenant_id, tool_use_id="toolu_1")
    await refuses_both(PgMemoryStore(pool, io), scope, ctx)
    paths = [r["path"] for r in await pool.fetch("SELECT path FROM memories ORDER BY path")]
    assert paths == ["/memories/a", "/memories/d/e"]


async def test_a_path_that_is_both_already_is_shown_whole() -> None:
    """Proves: a file that is also a directory (stored before the check) is viewed with
    the files below it listed, and deleting the file keeps them: nothing is lost."""
    store = InMemoryMemoryStore()
    scope = MemoryScope("t", "a", "agent")
    by = type("By", (), {"run_id": "run-1", "tool_use_id": "toolu_0"})()
    await store.create(scope, "/memories/a", "the file", by)
    await store.create(scope, "/memories/a/b.md", "below it", by)
    memory = Memory(MemoryBinding(store, scope))
    view = await run(memory, command="view", path="/memories/a")
    assert "the file" in view.content and "/memories/a is also a directory" in view.content
    assert "/memories/a/b.md" in view.content
    assert not (await run(memory, command="delete", path="/memories/a")).is_error
    below = await run(memory, command="view", path="/memories/a/b.md")
    assert "below it" in below.content
