"""Contract suites of the store ports (agent/ports.py): each test runs against every
implementation (tests/contracts/backends.py) and asserts what the port promises, so the
Postgres stores of run/ and the in-memory ones of testing/inmem.py cannot drift apart.

- RunIO + FileStore: run files in the `State.file_writes` outbox are stored by the
  write that carries them (`checkpoint`, `record_tool_result`), which empties the
  outbox; `get_file` / `list_files` read them back, scoped to the run.
- MemoryStore: create / update / rename / delete conditioned on the version, their
  `MemoryWrite` answers, `index` (prefix, limit, path order), `files_among`, scopes,
  and a fenced writer (its run taken over) writing nothing.
- SkillStore: `latest` gives the newest version of each named skill of the tenant.

What only one implementation does (PgRunIO's lease fence, a cancel seen in a write's
answer, group commit) is tested beside it: tests/test_filesystem.py (run files of a
fenced-out write), tests/test_memory.py, tests/test_group_commit.py.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from hango_worker.agent.ports import (
    Event,
    FileInfo,
    MemoryEntry,
    MemoryFile,
    MemoryScope,
    MemoryWrite,
    Skill,
    WriteContext,
)
from hango_worker.agent.state import FileWrite
from hango_worker.provider.types import Message, TextBlock, ToolUseBlock
from hango_worker.tool.types import ToolResult
from tests.contracts.backends import (
    BACKENDS,
    MemoryCase,
    RunCase,
    RunCases,
    SkillCase,
    memory_case,
    skill_case,
)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> asyncpg.Pool | None:
    """The pool of a fresh database for the Postgres implementations, None in memory."""
    return request.getfixturevalue("pool") if request.param == "postgres" else None


@pytest.fixture
async def runs(backend: asyncpg.Pool | None) -> RunCases:
    return RunCases(backend)


@pytest.fixture
async def mem(backend: asyncpg.Pool | None) -> MemoryCase:
    return await memory_case(backend)


@pytest.fixture
async def skills(backend: asyncpg.Pool | None) -> SkillCase:
    return await skill_case(backend)


# -- RunIO + FileStore -----------------------------------------------------------------------


def write(path: str, content: str, tool_use_id: str | None = "toolu_1") -> FileWrite:
    return FileWrite(path, content, len(content.encode()), tool_use_id)


def listed(files: list[FileInfo]) -> list[tuple[str, int, str | None]]:
    """What both implementations list (PgRunIO adds the row's `updated_at`)."""
    return [(f.path, f.size, f.tool_use_id) for f in files]


async def turn_with_call(run: RunCase, call_id: str = "toolu_1") -> ToolUseBlock:
    """Checkpoint an assistant message that calls a tool, as the loop does before the call."""
    call = ToolUseBlock(call_id, "write_file", {"path": "/a.md", "content": "x"})
    messages = [Message("user", [TextBlock("go")]), Message("assistant", [call])]
    await run.io.checkpoint(run.state, messages, [Event("model_message")], None)
    return call


async def record(run: RunCase, call: ToolUseBlock, text: str = "ok") -> None:
    event = Event("tool_result", {"tool_use_id": call.id, "content": text})
    await run.io.record_tool_result(run.state, call, ToolResult(text), event)


async def test_a_new_run_has_no_files(runs: RunCases) -> None:
    run = await runs.new_run()
    assert await run.io.list_files() == []
    assert await run.io.get_file("/notes.md") is None


async def test_files_written_with_a_tool_result_are_read_back(runs: RunCases) -> None:
    run = await runs.new_run()
    call = await turn_with_call(run)
    run.state.file_writes.append(write("/b/notes.md", "héllo\nworld\n"))
    run.state.file_writes.append(write("/a.md", "first"))
    await record(run, call)
    assert run.state.file_writes == []  # the outbox is emptied by the write that stored it
    assert await run.io.get_file("/b/notes.md") == "héllo\nworld\n"
    assert await run.io.get_file("/a.md") == "first"
    assert await run.io.get_file("/missing.md") is None
    # in path order, sizes in UTF-8 bytes, the call that wrote each
    assert listed(await run.io.list_files()) == [
        ("/a.md", 5, "toolu_1"),
        ("/b/notes.md", 13, "toolu_1"),
    ]


async def test_a_checkpoint_stores_what_is_left_in_the_outbox(runs: RunCases) -> None:
    run = await runs.new_run()
    await turn_with_call(run)
    run.state.file_writes.append(write("/left.md", "pending", "toolu_9"))
    await run.io.checkpoint(run.state, [], [], None)
    assert run.state.file_writes == []
    assert await run.io.get_file("/left.md") == "pending"
    assert listed(await run.io.list_files()) == [("/left.md", 7, "toolu_9")]


async def test_the_newest_write_of_a_path_wins(runs: RunCases) -> None:
    run = await runs.new_run()
    first = await turn_with_call(run, "toolu_1")
    run.state.file_writes += [write("/f.md", "one", "toolu_1"), write("/f.md", "two!", "toolu_1")]
    await record(run, first)
    assert await run.io.get_file("/f.md") == "two!"  # two writes in one outbox
    second = ToolUseBlock("toolu_2", "write_file", {})
    run.state.file_writes.append(write("/f.md", "three", "toolu_2"))
    await record(run, second)
    assert await run.io.get_file("/f.md") == "three"  # a later write replaces the file
    assert listed(await run.io.list_files()) == [("/f.md", 5, "toolu_2")]


async def test_a_write_with_an_empty_outbox_changes_no_file(runs: RunCases) -> None:
    run = await runs.new_run()
    call = await turn_with_call(run)
    run.state.file_writes.append(write("/kept.md", "kept"))
    await record(run, call)
    await run.io.checkpoint(run.state, [], [Event("turn")], None)
    await record(run, ToolUseBlock("toolu_2", "echo", {}))
    assert listed(await run.io.list_files()) == [("/kept.md", 4, "toolu_1")]


async def test_files_are_scoped_to_their_run(runs: RunCases) -> None:
    one, two = await runs.new_run(), await runs.new_run()
    call = await turn_with_call(one)
    one.state.file_writes.append(write("/mine.md", "one's"))
    await record(one, call)
    assert await two.io.get_file("/mine.md") is None
    assert await two.io.list_files() == []
    assert await one.io.get_file("/mine.md") == "one's"


# -- MemoryStore -----------------------------------------------------------------------------

NOTES = "/memories/notes.md"


def by(case: MemoryCase, tool_use_id: str = "toolu_1") -> WriteContext:
    return WriteContext(case.run_id, tool_use_id)


async def test_create_then_read_and_index(mem: MemoryCase) -> None:
    s, scope = mem.store, mem.scope
    assert await s.read(scope, NOTES) is None
    assert await s.create(scope, NOTES, "tea, no sugar", by(mem)) == MemoryWrite(1, None)
    assert await s.read(scope, NOTES) == MemoryFile("tea, no sugar", 1)
    assert await s.index(scope, "", 10) == [MemoryEntry(NOTES, 13, 1)]
    # an existing path wins: nothing written, the version found
    assert await s.create(scope, NOTES, "coffee", by(mem)) == MemoryWrite(None, 1)
    assert await s.read(scope, NOTES) == MemoryFile("tea, no sugar", 1)


async def test_sizes_are_utf8_bytes(mem: MemoryCase) -> None:
    await mem.store.create(mem.scope, NOTES, "thé ☕", by(mem))
    assert await mem.store.index(mem.scope, "", 10) == [MemoryEntry(NOTES, 8, 1)]


async def test_update_is_conditioned_on_the_version(mem: MemoryCase) -> None:
    s, scope = mem.store, mem.scope
    await s.create(scope, NOTES, "one", by(mem))
    assert await s.update(scope, NOTES, "two", 1, by(mem)) == MemoryWrite(2, 1)
    assert await s.read(scope, NOTES) == MemoryFile("two", 2)
    # made on version 1, the file is at 2: another run edited it; nothing written
    assert await s.update(scope, NOTES, "stale", 1, by(mem)) == MemoryWrite(None, 2)
    assert await s.read(scope, NOTES) == MemoryFile("two", 2)
    missing = "/memories/missing.md"
    assert await s.update(scope, missing, "x", 1, by(mem)) == MemoryWrite(None, None)
    assert await s.read(scope, missing) is None


async def test_rename_moves_the_file_and_bumps_its_version(mem: MemoryCase) -> None:
    s, scope = mem.store, mem.scope
    await s.create(scope, NOTES, "one", by(mem))
    moved = "/memories/archive/notes.md"
    assert await s.update(scope, NOTES, "one", 1, by(mem), new_path=moved) == MemoryWrite(2, 1)
    assert await s.read(scope, NOTES) is None
    assert await s.read(scope, moved) == MemoryFile("one", 2)
    assert await s.index(scope, "", 10) == [MemoryEntry(moved, 3, 2)]


async def test_rename_onto_an_existing_file_writes_nothing(mem: MemoryCase) -> None:
    s, scope = mem.store, mem.scope
    other = "/memories/other.md"
    await s.create(scope, NOTES, "one", by(mem))
    await s.create(scope, other, "taken", by(mem))
    got = await s.update(scope, NOTES, "one", 1, by(mem), new_path=other)
    assert (got.written, got.exists, got.fenced) == (None, True, False)
    assert got == MemoryWrite(None, None, exists=True)
    # a stale version is a conflict first, whatever the destination
    assert await s.update(scope, NOTES, "one", 7, by(mem), new_path=other) == MemoryWrite(None, 1)
    assert await s.read(scope, NOTES) == MemoryFile("one", 1)
    assert await s.read(scope, other) == MemoryFile("taken", 1)


async def test_delete_is_conditioned_on_the_version(mem: MemoryCase) -> None:
    s, scope = mem.store, mem.scope
    await s.create(scope, NOTES, "one", by(mem))
    await s.update(scope, NOTES, "two", 1, by(mem))
    assert await s.delete(scope, NOTES, 1, by(mem)) == MemoryWrite(None, 2)
    assert await s.read(scope, NOTES) == MemoryFile("two", 2)
    assert await s.delete(scope, NOTES, 2, by(mem)) == MemoryWrite(0, 2)
    assert await s.read(scope, NOTES) is None
    assert await s.index(scope, "", 10) == []
    assert await s.delete(scope, NOTES, 2, by(mem)) == MemoryWrite(None, None)
    # the path is free again: a new file starts at version 1
    assert await s.create(scope, NOTES, "three", by(mem)) == MemoryWrite(1, None)


# paths whose order is the same in any collation (a database's `ORDER BY path`)
PATHS = ["/memories/a.md", "/memories/b.md", "/memories/c/d.md", "/memories/c/e.md"]


async def _create_all(mem: MemoryCase, paths: list[str]) -> None:
    for p in reversed(paths):  # not in order: the store orders them
        assert (await mem.store.create(mem.scope, p, p.upper(), by(mem))).written == 1


async def test_index_lists_in_path_order_with_prefix_and_limit(mem: MemoryCase) -> None:
    s, scope = mem.store, mem.scope
    await _create_all(mem, PATHS)
    paths = [e.path for e in await s.index(scope, "", 100)]
    assert paths == PATHS
    assert [e.path for e in await s.index(scope, "", 2)] == PATHS[:2]
    assert [e.path for e in await s.index(scope, "/memories/c/", 100)] == PATHS[2:]
    assert [e.path for e in await s.index(scope, "/memories/c/", 1)] == PATHS[2:3]
    assert [e.path for e in await s.index(scope, "/memories/b", 100)] == ["/memories/b.md"]
    assert await s.index(scope, "/memories/z", 100) == []
    assert await s.index(scope, "", 0) == []
    entry = (await s.index(scope, "/memories/a", 1))[0]
    assert entry == MemoryEntry("/memories/a.md", len("/MEMORIES/A.MD"), 1)


async def test_an_index_prefix_is_literal_text(mem: MemoryCase) -> None:
    """No pattern characters: `%`, `_` and `\\` match only themselves."""
    s, scope = mem.store, mem.scope
    await _create_all(mem, ["/memories/a_b.md", "/memories/axb.md", "/memories/a%c.md"])
    assert [e.path for e in await s.index(scope, "/memories/a_", 10)] == ["/memories/a_b.md"]
    assert [e.path for e in await s.index(scope, "/memories/a%", 10)] == ["/memories/a%c.md"]
    assert await s.index(scope, "/memories/%", 10) == []
    assert await s.index(scope, "/memories/a\\", 10) == []


async def test_files_among_names_the_files_in_path_order(mem: MemoryCase) -> None:
    s, scope = mem.store, mem.scope
    await _create_all(mem, PATHS)
    asked = ["/memories/c/e.md", "/memories/nope.md", "/memories/a.md", "/memories/c"]
    assert await s.files_among(scope, asked) == ["/memories/a.md", "/memories/c/e.md"]
    assert await s.files_among(scope, ["/memories/b.md", "/memories/b.md"]) == ["/memories/b.md"]
    assert await s.files_among(scope, []) == []


def _scopes(mem: MemoryCase) -> list[MemoryScope]:
    t, a = mem.scope.tenant_id, mem.scope.agent_id
    return [
        mem.scope,
        MemoryScope(t, a, "session", "session-1"),
        MemoryScope(t, a, "session", "session-2"),
        MemoryScope(t, a, "key", "user-1"),
        MemoryScope(t, a, "key", "session-1"),  # same key, another kind
        MemoryScope(t, mem.other_agent, "agent"),
    ]


async def test_each_scope_has_its_own_files(mem: MemoryCase) -> None:
    s = mem.store
    scopes = _scopes(mem)
    for i, scope in enumerate(scopes):
        assert await s.create(scope, NOTES, f"scope {i}", by(mem)) == MemoryWrite(1, None)
    assert await s.update(scopes[1], NOTES, "edited", 1, by(mem)) == MemoryWrite(2, 1)
    assert await s.delete(scopes[3], NOTES, 1, by(mem)) == MemoryWrite(0, 1)
    for i, scope in enumerate(scopes):
        want = {1: MemoryFile("edited", 2), 3: None}.get(i, MemoryFile(f"scope {i}", 1))
        assert await s.read(scope, NOTES) == want
        assert await s.files_among(scope, [NOTES]) == ([] if want is None else [NOTES])
        assert len(await s.index(scope, "", 10)) == (0 if want is None else 1)


async def test_a_fenced_writer_writes_nothing(mem: MemoryCase) -> None:
    """The run's worker lost the run (another took it over): every write answers
    `fenced` and stores nothing; reads still work."""
    s, scope = mem.store, mem.scope
    await s.create(scope, NOTES, "one", by(mem))
    await mem.fence()
    fenced = MemoryWrite(None, None, fenced=True)
    assert await s.create(scope, "/memories/new.md", "x", by(mem)) == fenced
    assert await s.update(scope, NOTES, "two", 1, by(mem)) == fenced
    assert await s.update(scope, NOTES, "one", 1, by(mem), new_path="/memories/m.md") == fenced
    assert await s.delete(scope, NOTES, 1, by(mem)) == fenced
    assert await s.read(scope, NOTES) == MemoryFile("one", 1)
    assert await s.index(scope, "", 10) == [MemoryEntry(NOTES, 3, 1)]


# -- SkillStore ------------------------------------------------------------------------------


def by_name(found: list[Skill]) -> dict[str, Skill]:
    names = [s.name for s in found]
    assert len(names) == len(set(names)), f"a skill listed twice: {names}"
    return {s.name: s for s in found}


async def test_latest_gives_the_newest_version_of_each_named_skill(skills: SkillCase) -> None:
    add, t = skills.add, skills.tenant
    assert await add(t, "pdf-forms", "Old forms.", "OLD", {"a.md": "A1"}) == 1
    assert await add(t, "pdf-forms", "New forms.", "NEW", {"a.md": "A2", "b/c.txt": "C"}) == 2
    assert await add(t, "brand", "The brand.", "BRAND", {}) == 1
    assert await add(t, "unused", "Not asked for.", "UNUSED", {}) == 1
    found = by_name(await skills.store.latest(t, ["brand", "pdf-forms", "absent"]))
    assert found == {
        "brand": Skill("brand", 1, "The brand.", "BRAND", {}),
        "pdf-forms": Skill("pdf-forms", 2, "New forms.", "NEW", {"a.md": "A2", "b/c.txt": "C"}),
    }
    assert await skills.store.latest(t, []) == []
    assert await skills.store.latest(t, ["absent"]) == []


async def test_latest_names_each_skill_once(skills: SkillCase) -> None:
    await skills.add(skills.tenant, "brand", "The brand.", "BRAND", {})
    found = await skills.store.latest(skills.tenant, ["brand", "brand"])
    assert found == [Skill("brand", 1, "The brand.", "BRAND", {})]


async def test_latest_reads_the_tenants_own_skills_only(skills: SkillCase) -> None:
    await skills.add(skills.other_tenant, "secret", "Another tenant's.", "HIDDEN", {})
    await skills.add(skills.other_tenant, "shared", "Theirs.", "THEIRS", {})
    await skills.add(skills.tenant, "shared", "Ours.", "OURS", {})
    found = by_name(await skills.store.latest(skills.tenant, ["secret", "shared"]))
    assert found == {"shared": Skill("shared", 1, "Ours.", "OURS", {})}
    theirs: Any = by_name(await skills.store.latest(skills.other_tenant, ["shared"]))
    assert theirs["shared"].body == "THEIRS"
