"""Memory: long-term memory files that outlive runs, after the cache breakpoint.

In memory (the harness and its in-memory store) for the tool's behaviour and the
block order; on Postgres (the real worker, the real fenced statements) for scopes,
tenants, conflicts and fencing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg
from prometheus_client import REGISTRY

from hango_worker.agent.middlewares.memory import FENCED, Memory, MemoryBinding
from hango_worker.agent.ports import MemoryScope
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.run.claim import Claim
from hango_worker.run.io import PgRunIO
from hango_worker.run.memory import PgMemoryStore
from hango_worker.store import repo, sql
from hango_worker.testing.inmem import InMemoryMemoryStore, make_state, run_agent
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import agent, call, scripted
from tests.test_chain import CapturingProvider
from tests.worker_helpers import details, make_agent, run_until_idle

NOTES = "/memories/notes.md"


def mem(**args: Any) -> dict[str, Any]:
    return call("memory", **args)


def writes(command: str, result: str) -> float:
    v = REGISTRY.get_sample_value(
        "hango_memory_writes_total", {"command": command, "result": result}
    )
    return v or 0.0


def results(io: Any) -> list[ToolResult]:
    return list(io.tool_results.values())


# -- in memory: the tool, the block, the conflict ----------------------------------------------


async def test_the_memory_slot_is_filled_only_for_agents_that_list_the_tool() -> None:
    store = InMemoryMemoryStore()
    binding = MemoryBinding(store, MemoryScope("t", "a", "agent"))
    plain = default_stack(StackConfig(allowlist=("calculator",), memory=binding))
    assert plain[8] is None
    listed = default_stack(StackConfig(allowlist=("memory",), memory=binding))
    names = [m.name if m else None for m in listed]
    assert names[7:9] == ["prompt_cache", "memory"]  # PromptCache, then Memory
    provider = CapturingProvider(scripted({"text": "ok"}))
    await run_agent(agent(tools=["calculator"]), provider)
    assert [t.name for t in provider.requests[0].tools] == ["calculator"]
    assert len(provider.requests[0].system) == 1  # no memory block for this agent


async def test_the_index_is_a_system_block_after_the_agents_and_earlier_contributors() -> None:
    """By index: agent blocks, then Todo's plan (before PromptCache), then the memory
    index (after it). The index is the attempt's snapshot: a write during the run
    does not change the block, so the prompt stays byte-stable."""
    store = InMemoryMemoryStore()
    a = agent(tools=["memory", "write_todos"])
    a = a.model_copy(update={"system": ["Agent block one.", "Agent block two."]})
    setup = scripted({"tool_calls": [mem(command="create", path=NOTES, file_text="tea")]}, {})
    await run_agent(a, setup, memory=store)
    provider = CapturingProvider(
        scripted(
            {"tool_calls": [call("write_todos", todos=[{"content": "x", "status": "pending"}])]},
            {"tool_calls": [mem(command="create", path="/memories/new.md", file_text="n")]},
            {"text": "done"},
        )
    )
    out, _, _ = await run_agent(a, provider, memory=store)
    assert out.status == "succeeded"
    first, second, third = (r.system for r in provider.requests)
    assert [b.text for b in first[:2]] == ["Agent block one.", "Agent block two."]
    assert len(first) == 3 and "3\t/memories/notes.md" in first[2].text
    assert first[2].text.startswith("You have long-term memory")
    # with a plan: the plan block (Todo) at 2, the memory block at 3 — after it
    assert second[2].text.startswith("Current todo list")
    assert second[3].text == first[2].text
    assert third[3].text == first[2].text  # /memories/new.md written: block unchanged
    assert "new.md" not in third[3].text


async def test_commands_follow_the_memory_tool_and_bad_ones_are_tool_errors() -> None:
    store = InMemoryMemoryStore()
    turns = [
        mem(command="create", path="/memories/a/notes.md", file_text="hello\nworld\n"),
        mem(command="str_replace", path="/memories/a/notes.md", old_str="world", new_str="you"),
        mem(command="insert", path="/memories/a/notes.md", insert_line=0, insert_text="top"),
        mem(command="view", path="/memories/a/notes.md"),
        mem(command="rename", old_path="/memories/a/notes.md", new_path="/memories/b.md"),
        mem(command="view", path="/memories"),
        mem(command="view", path="/memories/../etc/passwd"),
        mem(command="create", path="/memories/./x", file_text="x"),
        mem(command="create", path="/other/x", file_text="x"),
        mem(command="create", path="/memories/big.md", file_text="x" * 65537),
        mem(command="explode", path="/memories/b.md"),
        mem(command="str_replace", path="/memories/b.md", old_str="absent", new_str="y"),
        mem(command="view", path="/memories/missing.md"),
        mem(command="create", path="/memories/b.md", file_text="again"),
        mem(command="delete", path="/memories/b.md"),
    ]
    before = writes("create", "rejected")
    out, _, io = await run_agent(
        agent(tools=["memory"]),
        scripted(*({"tool_calls": [t]} for t in turns), {"text": "done"}),
        memory=store,
    )
    assert out.status == "succeeded"  # every error went to the model; the run went on
    r = [x.content for x in results(io)]
    assert r[0] == "File created successfully at: /memories/a/notes.md"
    assert r[1].startswith("The memory file has been edited.") and "you" in r[1]
    assert r[2] == "The file /memories/a/notes.md has been edited."
    assert r[3] == (
        "Here's the content of /memories/a/notes.md with line numbers:\n"
        "     1\ttop\n     2\thello\n     3\tyou\n     4\t"
    )
    assert r[4] == "Successfully renamed /memories/a/notes.md to /memories/b.md"
    assert r[5].splitlines()[1:] == ["14B\t/memories", "14B\t/memories/b.md"]
    errors = results(io)[6:14]
    assert all(e.is_error for e in errors)
    assert "would escape /memories" in r[6] and "would escape /memories" in r[7]
    assert r[8] == "Path must start with /memories, got: /other/x"
    assert "65537 bytes, over the limit of 65536 bytes" in r[9]
    assert "'explode' is not one of ['view', 'create'" in r[10]
    assert "old_str `absent` did not appear verbatim in /memories/b.md" in r[11]
    assert r[12] == "The path /memories/missing.md does not exist. Please provide a valid path."
    assert r[13].startswith("File /memories/b.md already exists")
    assert r[14] == "Successfully deleted /memories/b.md"
    assert store.files == {}
    assert writes("create", "rejected") - before == 4  # ./x, /other, big, exists


async def test_a_concurrent_edit_is_refused_and_both_texts_are_kept(spans: Any) -> None:
    """Run A views the file, run B edits it meanwhile, A's edit is refused: nothing is
    overwritten, B's text is in the file, A's is in its tool call's input."""
    store = InMemoryMemoryStore()
    a = agent(tools=["memory", "meanwhile"])
    await run_agent(
        a, scripted({"tool_calls": [mem(command="create", path=NOTES, file_text="v1")]}, {}),
        memory=store,
    )  # fmt: skip

    async def meanwhile(args: dict[str, Any], ctx: ToolContext) -> str:
        other = scripted(
            {"tool_calls": [mem(command="str_replace", path=NOTES, old_str="v1", new_str="B")]},
            {"text": "ok"},
        )
        state = make_state(a)
        state.run_id = "run-B"
        out, _, _ = await run_agent(a, other, memory=store, state=state)
        return out.status

    gate = Tool("meanwhile", "Let another run go.", {"type": "object"}, meanwhile)
    before = writes("str_replace", "conflict")
    out, state, io = await run_agent(
        a,
        scripted(
            {"tool_calls": [mem(command="view", path=NOTES)]},
            {"tool_calls": [call("meanwhile")]},
            {"tool_calls": [mem(command="str_replace", path=NOTES, old_str="v1", new_str="A")]},
            {"text": "done"},
        ),
        tools=[gate],
        memory=store,
    )
    assert out.status == "succeeded"
    refused = results(io)[-1]
    assert refused.is_error
    assert refused.content == (
        f"Conflict: {NOTES} was changed by another run (it is now at version 2; this run "
        "last saw version 1), so nothing was written. Your text is kept in this tool call's "
        f"input in the conversation. View {NOTES} again and redo your change on its current "
        "content."
    )
    (only,) = store.files.values()
    assert only.content == "B" and only.version == 2 and only.run_id == "run-B"
    last_call = state.messages[-3].tool_uses()[0]
    assert last_call.input["new_str"] == "A"  # the loser's text, kept in the history
    assert writes("str_replace", "conflict") - before == 1
    (event,) = spans.events("agent.memory_conflict")
    assert event.attributes["hango.memory.seen_version"] == 1
    assert event.attributes["hango.memory.current_version"] == 2


# -- Postgres: scopes, tenants, the fenced statement -------------------------------------------


def _view_then_answer(path: str = NOTES) -> Any:
    return CapturingProvider(
        scripted({"tool_calls": [mem(command="view", path=path)]}, {"text": "ok"})
    )


async def _enqueue(
    pool: asyncpg.Pool,
    agent_name: str = "mem",
    key: str | None = None,
    session: str | None = None,
    tenant: str = repo.DEFAULT_TENANT_ID,
) -> dict[str, str]:
    r = await repo.enqueue_run(
        pool,
        tenant_id=tenant,
        agent=agent_name,
        input_text="go",
        session_id=session,
        memory_key=key,
    )
    return {"run_id": r.run_id, "session_id": r.session_id}


def _tool_results(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [e["payload"] for e in run["events"] if e["type"] == "tool_result"]


async def test_key_scope_written_in_run_1_read_in_run_2_not_by_others(
    pool: asyncpg.Pool, dsn: str, spans: Any
) -> None:
    await make_agent(pool, name="mem", tools=["memory"], config={"memory_scope": "key"})
    first = await _enqueue(pool, key="alice")
    create = mem(command="create", path=NOTES, file_text="likes tea")
    await run_until_idle(dsn, scripted({"tool_calls": [create]}, {"text": "noted"}))
    assert (await details(pool, first["run_id"]))["status"] == "succeeded"
    # run 2, same key, a new session: reads it, and its index lists it
    second = await _enqueue(pool, key="alice")
    provider = _view_then_answer()
    await run_until_idle(dsn, provider)
    (seen,) = _tool_results(await details(pool, second["run_id"]))
    assert seen["content"].endswith("1\tlikes tea") and not seen["is_error"]
    assert "9\t/memories/notes.md" in provider.requests[0].system[-1].text
    hooks = spans.named("agent.before_run memory")
    assert len(hooks) == 2  # once per attempt: run 1, run 2
    hook = hooks[-1]
    assert hook.parent.span_id in {s.context.span_id for s in spans.named("agent.before_run")}
    assert [e.name for e in hook.events] == ["agent.memory_loaded"]
    assert hook.events[0].attributes["hango.memory.files"] == 1
    # another key of the same agent sees nothing
    other = await _enqueue(pool, key="bob")
    provider = _view_then_answer()
    await run_until_idle(dsn, provider)
    (missing,) = _tool_results(await details(pool, other["run_id"]))
    assert missing["is_error"] and "does not exist" in missing["content"]
    assert "(no memory files yet)" in provider.requests[0].system[-1].text
    # another tenant, an agent of the same name, the same key: nothing either
    t2 = str(uuid.uuid4())
    await pool.execute("INSERT INTO tenants (id, name) VALUES ($1, 'second')", t2)
    await repo.create_agent(
        pool, tenant_id=t2, name="mem", model="m", system=[], tools=["memory"],
        config={"memory_scope": "key"},
    )  # fmt: skip
    foreign = await _enqueue(pool, key="alice", tenant=t2)
    await run_until_idle(dsn, _view_then_answer())
    run = await repo.run_details(pool, t2, foreign["run_id"])
    (missing,) = _tool_results(run)
    assert missing["is_error"] and "does not exist" in missing["content"]


async def test_session_scope_is_shared_by_the_runs_of_one_session_only(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="mem", tools=["memory"], config={"memory_scope": "session"})
    first = await _enqueue(pool)
    create = mem(command="create", path=NOTES, file_text="step 3 done")
    # the scripted model answers by turn of the session: runs 1 and 2 share one history
    session = [{"tool_calls": [create]}, {"text": "noted"}]
    session += [{"tool_calls": [mem(command="view", path=NOTES)]}, {"text": "ok"}]
    await run_until_idle(dsn, scripted(*session))
    same = await _enqueue(pool, session=first["session_id"])
    await run_until_idle(dsn, scripted(*session))
    (seen,) = _tool_results(await details(pool, same["run_id"]))
    assert seen["content"].endswith("1\tstep 3 done")
    fresh = await _enqueue(pool)
    await run_until_idle(dsn, _view_then_answer())
    (missing,) = _tool_results(await details(pool, fresh["run_id"]))
    assert missing["is_error"] and "does not exist" in missing["content"]


async def test_key_scope_without_a_memory_key_fails_the_run_clearly(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="mem", tools=["memory"], config={"memory_scope": "key"})
    run = await _enqueue(pool)
    await run_until_idle(dsn, scripted({"text": "never called"}))
    got = await details(pool, run["run_id"])
    assert got["status"] == "failed"
    assert got["error"]["type"] == "invalid_input"
    assert "memory_key" in got["error"]["message"]


async def test_a_concurrent_edit_on_postgres_keeps_both_texts(pool: asyncpg.Pool, dsn: str) -> None:
    """Another writer (here: a direct update, as a second run would make) changes the
    file between run A's view and its edit: A's edit is refused, nothing is overwritten,
    A's text is in its tool_use input in the session's history."""
    await make_agent(pool, name="mem", tools=["memory", "meanwhile"])
    seed = await _enqueue(pool)
    create = mem(command="create", path=NOTES, file_text="v1")
    await run_until_idle(dsn, scripted({"tool_calls": [create]}, {"text": "ok"}))
    assert (await details(pool, seed["run_id"]))["status"] == "succeeded"

    async def meanwhile(args: dict[str, Any], ctx: ToolContext) -> str:
        await pool.execute(
            "UPDATE memories SET content = 'B', version = version + 1 WHERE path = $1", NOTES
        )
        return "done"

    gate = Tool("meanwhile", "Let another writer go.", {"type": "object"}, meanwhile)
    run = await _enqueue(pool)
    script = scripted(
        {"tool_calls": [mem(command="view", path=NOTES)]},
        {"tool_calls": [call("meanwhile")]},
        {"tool_calls": [mem(command="str_replace", path=NOTES, old_str="v1", new_str="A")]},
        {"text": "done"},
    )
    await run_until_idle(dsn, script, tools=[gate])
    got = await details(pool, run["run_id"])
    assert got["status"] == "succeeded"
    refused = _tool_results(got)[-1]
    assert refused["is_error"] and refused["content"].startswith(f"Conflict: {NOTES} was changed")
    row = await pool.fetchrow("SELECT content, version FROM memories WHERE path = $1", NOTES)
    assert (row["content"], row["version"]) == ("B", 2)
    uses = [
        b for m in got["transcript"] if m["role"] == "assistant" for b in m["content"]
        if b.get("type") == "tool_use" and b["input"].get("new_str") == "A"
    ]  # fmt: skip
    assert len(uses) == 1


async def _claimed(pool: asyncpg.Pool) -> tuple[PgRunIO, str]:
    await make_agent(pool, name="mem", tools=["memory"])
    await _enqueue(pool)
    (row,) = await pool.fetch(sql.CLAIM, "worker-a", 1, 30.0)
    claim = Claim.from_record(row)
    io = PgRunIO(pool, claim, worker_id="worker-a", lease_s=30.0, next_message_seq=1,
                 next_event_seq=1)  # fmt: skip
    return io, claim.agent_id


async def test_the_write_statement_checks_the_version_it_was_made_on(pool: asyncpg.Pool) -> None:
    io, agent_id = await _claimed(pool)
    store = PgMemoryStore(pool, io)
    scope = MemoryScope(repo.DEFAULT_TENANT_ID, agent_id, "agent")
    by = type("By", (), {"run_id": io.claim.run_id, "tool_use_id": "toolu_1"})()
    assert (await store.create(scope, NOTES, "one", by)).written == 1
    assert (await store.create(scope, NOTES, "two", by)).written is None  # exists: no write
    stale = await store.update(scope, NOTES, "stale", 0, by)
    assert (stale.written, stale.current) == (None, 1)
    assert (await store.update(scope, NOTES, "fresh", 1, by)).written == 2
    assert (await store.read(scope, NOTES)) is not None
    gone = await store.delete(scope, NOTES, 1, by)
    assert (gone.written, gone.current) == (None, 2)
    row = await pool.fetchrow("SELECT content, version, tool_use_id FROM memories")
    assert tuple(row) == ("fresh", 2, "toolu_1")


async def test_a_fenced_out_write_stores_nothing(pool: asyncpg.Pool) -> None:
    """The worker lost the lease (another took the run over): the memory write is
    refused by its own fenced statement, and the run's next write raises Fenced."""
    io, agent_id = await _claimed(pool)
    scope = MemoryScope(repo.DEFAULT_TENANT_ID, agent_id, "agent")
    memory = Memory(MemoryBinding(PgMemoryStore(pool, io), scope))
    state = make_state(agent(tools=["memory"]))
    state.run_id = io.claim.run_id
    await pool.execute("UPDATE runs SET lease_owner = 'worker-b', attempt = attempt + 1")
    before = writes("create", "fenced")
    ctx = ToolContext(run_id=io.claim.run_id, tenant_id=scope.tenant_id, tool_use_id="toolu_1")
    result = await memory.run_command(
        state, {"command": "create", "path": NOTES, "file_text": "lost"}, ctx
    )
    assert result.is_error and result.content == FENCED
    assert await pool.fetchval("SELECT count(*) FROM memories") == 0
    assert io.control.lost  # the run's next checkpoint raises Fenced without a query
    assert writes("create", "fenced") - before == 1


# -- the operators' CLI ------------------------------------------------------------------------


async def test_memory_cli_lists_shows_and_removes_files_with_clear_exit_codes(
    pool: asyncpg.Pool, dsn: str
) -> None:
    from tests.test_cli import cli

    cfg = '{"memory_scope": "key"}'
    cli(
        dsn,
        "agents",
        "create",
        "--name",
        "mem",
        "--model",
        "m",
        "--tool",
        "memory",
        "--config",
        cfg,
    )
    run_id = cli(dsn, "enqueue", "--agent", "mem", "--input", "hi", "--memory-key", "alice").stdout
    run = await details(pool, run_id.strip())
    assert run["input"] == {"text": "hi", "memory_key": "alice"}
    bad = cli(dsn, "enqueue", "--agent", "mem", "--input", "hi", "--memory-key", " ", ok=False)
    assert bad.returncode == 2 and "--memory-key: must not be empty" in bad.stderr
    agent_id = (await repo.find_agent(pool, repo.DEFAULT_TENANT_ID, "mem"))["id"]
    for scope, key, content in (("key", "alice", "likes tea\n"), ("agent", "", "shared\n")):
        await pool.execute(
            "INSERT INTO memories (tenant_id, agent_id, scope, scope_key, path, content, size) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7)",
            repo.DEFAULT_TENANT_ID, agent_id, scope, key, NOTES, content, len(content),
        )  # fmt: skip
    listed = json.loads(cli(dsn, "memory", "ls", "--json").stdout)
    assert [(f["scope"], f["scope_key"], f["path"]) for f in listed] == [
        ("agent", "", NOTES),
        ("key", "alice", NOTES),
    ]
    one = cli(dsn, "memory", "ls", "--agent", "mem", "--key", "alice").stdout.splitlines()
    assert len(one) == 1 and "key:alice" in one[0] and one[0].endswith(NOTES)
    shown = cli(dsn, "memory", "show", NOTES, "--agent", "mem", "--key", "alice").stdout
    assert shown == "likes tea\n"
    assert cli(dsn, "memory", "show", NOTES, "--agent", "mem").stdout == "shared\n"
    gone = cli(dsn, "memory", "rm", NOTES, "--agent", "mem", "--key", "alice").stdout
    assert gone.strip() == f"deleted {NOTES} (version 1)"
    for args, code, says in (
        (("show", NOTES, "--agent", "mem", "--key", "alice"), 3, "no memory file"),
        (("rm", NOTES, "--agent", "mem", "--key", "alice"), 3, "no memory file"),
        (("show", "/memories/../x", "--agent", "mem"), 2, "would escape /memories"),
        (("ls", "--agent", "nobody"), 3, "no agent 'nobody'"),
        (("show", NOTES), 2, "--agent"),
    ):
        p = cli(dsn, "memory", *args, ok=False)
        assert p.returncode == code and says in p.stderr, (args, p.stderr)
    assert await pool.fetchval("SELECT count(*) FROM memories") == 1


async def test_a_write_the_store_could_not_complete_says_its_outcome_is_unknown() -> None:
    class Broken(InMemoryMemoryStore):
        async def update(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionResetError("server closed the connection")

    store = Broken()
    before = writes("insert", "failed")
    out, _, io = await run_agent(
        agent(tools=["memory"]),
        scripted(
            {"tool_calls": [mem(command="create", path=NOTES, file_text="a")]},
            {"tool_calls": [mem(command="insert", path=NOTES, insert_line=0, insert_text="b")]},
            {"text": "done"},
        ),
        memory=store,
    )
    assert out.status == "succeeded"
    failed = results(io)[-1]
    assert failed.is_error and failed.outcome == "crashed"
    assert failed.content == (
        "The memory insert could not be completed (ConnectionResetError: server closed the "
        f"connection); it may or may not have been applied. View {NOTES} before trying again."
    )
    assert writes("insert", "failed") - before == 1
