"""The Filesystem middleware: big tool results offloaded to run files, the file tools,
and run files written inside the fenced commit of the tool result that produced them."""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from pathlib import Path
from typing import Any

import asyncpg
from prometheus_client import REGISTRY

from hango_worker.agent.offload import offload_path, offloaded
from hango_worker.agent.ports import Event, Fenced
from hango_worker.agent.state import FileWrite, State
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import ToolResultBlock, ToolUseBlock
from hango_worker.run.claim import Claim
from hango_worker.run.io import PgRunIO
from hango_worker.store import sql
from hango_worker.store.gc import gc
from hango_worker.testing.chaos_tools import big_text, ensure_table
from hango_worker.testing.inmem import run_agent
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import agent, call, scripted
from tests.procs import kill_worker, start_worker, stop_worker, wait_all_finished, worker_env
from tests.worker_helpers import enqueue, make_agent, run_until_idle

FILE_TOOLS = ["ls", "read_file", "grep", "write_file", "edit_file"]


def big_tool(text: str, name: str = "fetch") -> Tool:
    async def fn(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult(text)

    return Tool(name, "Returns a lot of text.", {"type": "object"}, fn, idempotent=True)


def offloaded_bytes() -> float:
    return REGISTRY.get_sample_value("hango_offloaded_bytes_total") or 0.0


ROW = re.compile(r"^ *(\d+)\t(.*)$", re.S)


def rebuild(pages: list[str]) -> str:
    """The file's text from read_file pages: numbered rows, footers dropped."""
    lines: dict[int, str] = {}
    for page in pages:
        for row in page.split("\n"):
            m = ROW.match(row)
            if m is not None:
                lines[int(m[1])] = m[2]
    assert sorted(lines) == list(range(1, len(lines) + 1)), "pages leave a gap"
    return "\n".join(lines[i] for i in range(1, len(lines) + 1))


def results_of(io: Any) -> dict[str, ToolResult]:
    return dict(io.tool_results)


# -- offloading ---------------------------------------------------------------------------


async def test_a_big_result_is_offloaded_once_and_read_back_page_by_page(spans: Any) -> None:
    text = big_text(60_000, width=120)  # 500 lines of 120 bytes
    pages = [
        call("read_file", path="/large_tool_results/toolu_big", offset=o, limit=200)
        for o in (0, 200, 400)
    ]
    turns = [
        {"tool_calls": [{"name": "fetch", "input": {}, "id": "toolu_big"}]},
        *({"tool_calls": [p]} for p in pages),
        {"text": "done"},
    ]
    before = offloaded_bytes()
    a = agent(tools=["fetch", "read_file"], offload_threshold_bytes=20_000)
    outcome, state, io = await run_agent(a, scripted(*turns), tools=[big_tool(text)])
    assert outcome.status == "succeeded"
    # stored once, in full; the model (and the journal) saw a pointer and a head
    assert list(io.files) == ["/large_tool_results/toolu_big"]
    stored = io.files["/large_tool_results/toolu_big"]
    assert (stored.content, stored.size, stored.tool_use_id) == (text, 60_000, "toolu_big")
    pointer = io.tool_results["toolu_big"].content
    assert offloaded(pointer) == ("/large_tool_results/toolu_big", 60_000)
    assert len(pointer) < 1_200 and pointer.endswith(text[:1000].rsplit("\n", 1)[0])
    blocks = [b for m in state.messages for b in m.content if isinstance(b, ToolResultBlock)]
    assert [b.content for b in blocks if b.tool_use_id == "toolu_big"] == [pointer]
    assert not any(text in b.content for b in blocks)
    # the pages (each over the threshold) are never offloaded themselves
    page_results = [r.content for k, r in results_of(io).items() if k != "toolu_big"]
    assert [offloaded(p) for p in page_results] == [None, None, None]
    assert len(page_results[0]) > 20_000 and len(page_results[1]) > 20_000
    assert "read on with offset=200" in page_results[0]
    assert rebuild(page_results) == text
    (event,) = spans.events("middleware.tool_result_offloaded")
    assert event.attributes["hango.offload.size_bytes"] == 60_000
    assert event.attributes["hango.offload.path"] == "/large_tool_results/toolu_big"
    assert event.attributes["hango.middleware.name"] == "filesystem"
    assert offloaded_bytes() - before == 60_000


async def test_small_results_errors_and_unlisted_thresholds_stay_inline() -> None:
    text = "x" * 25_000

    async def failing(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        return ToolResult.error("y" * 25_000)

    tools = [
        big_tool(text),
        big_tool("small", name="tiny"),
        Tool("broken", "Fails loudly.", {"type": "object"}, failing),
    ]
    turns = [
        {"tool_calls": [call("fetch"), call("tiny"), call("broken")]},
        {"text": "done"},
    ]
    # the default threshold (20_000 bytes) offloads 25 KB; a raised one does not
    _, _, io = await run_agent(
        agent(tools=["fetch", "tiny", "broken"]), scripted(*turns), tools=tools
    )
    assert list(io.files) == [offload_path("toolu_s0000_0")]
    assert io.tool_results["toolu_s0000_1"].content == "small"
    assert io.tool_results["toolu_s0000_2"].content == "y" * 25_000  # errors never offloaded
    a = agent(tools=["fetch"], offload_threshold_bytes=30_000)
    _, _, io = await run_agent(
        a, scripted({"tool_calls": [call("fetch")]}, {"text": "ok"}), tools=tools
    )
    assert io.files == {} and io.tool_results["toolu_s0000_0"].content == text


# -- the file tools -----------------------------------------------------------------------


async def test_write_edit_read_grep_ls() -> None:
    turns = [
        {"tool_calls": [call("write_file", path="/notes//plan.md", content="a\nb TODO\nc TODO\n")]},
        {"tool_calls": [call("edit_file", path="/notes/plan.md", old_string="b", new_string="B")]},
        {
            "tool_calls": [
                call(
                    "edit_file",
                    path="/notes/plan.md",
                    old_string="TODO",
                    new_string="done",
                    replace_all=True,
                )
            ]
        },
        {"tool_calls": [call("read_file", path="/notes/plan.md")]},
        {"tool_calls": [call("grep", pattern="^[ac]", path="/notes")]},
        {"tool_calls": [call("ls")]},
        {"text": "ok"},
    ]
    outcome, _, io = await run_agent(agent(tools=FILE_TOOLS), scripted(*turns))
    assert outcome.status == "succeeded"
    r = [io.tool_results[f"toolu_s{i:04d}_0"] for i in range(6)]
    assert not any(x.is_error for x in r), [x.content for x in r]
    assert r[0].content == "wrote /notes/plan.md (16 bytes)"
    assert r[2].content.startswith("edited /notes/plan.md: 2 replaced")
    assert r[3].content == "     1\ta\n     2\tB done\n     3\tc done\n     4\t"
    assert r[4].content == "/notes/plan.md:1: a\n/notes/plan.md:3: c done"
    assert r[5].content == "/notes/plan.md\t16 bytes"
    assert io.files["/notes/plan.md"].content == "a\nB done\nc done\n"


async def test_bad_input_is_a_clear_tool_error_and_the_run_goes_on() -> None:
    bad = [
        (call("read_file", path="/nope.md"), "read_file: /nope.md does not exist"),
        (call("read_file", path="/f.md", offset=-1), "offset must be 0 or more"),
        (call("read_file", path="/f.md", offset=9), "offset 9 is past the end of the file"),
        (call("read_file", path="/f.md", limit=0), "limit must be between 1 and 2000"),
        (call("grep", pattern="(unclosed"), "invalid regular expression '(unclosed'"),
        (call("read_file", path="/notes/../../etc/passwd"), "contains '..'"),
        (call("write_file", path="relative.md", content="x"), "is not absolute"),
        (call("write_file", path="/" + "p" * 2000, content="x"), "at most 1024"),
        (call("write_file", path="/big.md", content="z" * 1_000_001), "at most 1000000 bytes"),
        (call("edit_file", path="/f.md", old_string="absent", new_string="x"), "was not found"),
        (call("edit_file", path="/f.md", old_string="line", new_string="x"), "occurs 2 times"),
        (call("write_file", path="/large_tool_results/x", content="x"), "is read-only"),
    ]
    turns = [
        {"tool_calls": [call("write_file", path="/f.md", content="line one\nline two")]},
        *({"tool_calls": [c]} for c, _ in bad),
        {"tool_calls": [call("read_file", path="/f.md")]},
        {"text": "still here"},
    ]
    outcome, _, io = await run_agent(agent(tools=FILE_TOOLS), scripted(*turns), max_turns=30)
    assert outcome.status == "succeeded"
    for i, (_, expect) in enumerate(bad, start=1):
        r = io.tool_results[f"toolu_s{i:04d}_0"]
        assert r.is_error and expect in r.content, (i, r.content)
    # nothing was lost or changed by the bad calls
    assert io.files["/f.md"].content == "line one\nline two"
    assert set(io.files) == {"/f.md"}
    last = io.tool_results[f"toolu_s{len(bad) + 1:04d}_0"]
    assert last.content == "     1\tline one\n     2\tline two"


async def test_each_file_tool_is_offered_only_when_listed() -> None:
    from tests.test_chain import CapturingProvider

    turns = [{"tool_calls": [call("write_file", path="/a", content="x")]}, {"text": "ok"}]
    provider = CapturingProvider(scripted(*turns))
    _, _, io = await run_agent(agent(tools=["read_file"]), provider)
    assert [t.name for t in provider.requests[0].tools] == ["read_file"]
    assert io.tool_results["toolu_s0000_0"].is_error and io.files == {}


async def test_long_lines_are_cut_and_pages_stay_bounded() -> None:
    content = "s" * 5000 + "\n" + "\n".join("r" * 1999 for _ in range(200))
    turns = [
        {"tool_calls": [call("write_file", path="/w", content=content)]},
        {"tool_calls": [call("read_file", path="/w", limit=2000)]},
        {"text": "ok"},
    ]
    _, _, io = await run_agent(agent(tools=FILE_TOOLS), scripted(*turns))
    page = io.tool_results["toolu_s0001_0"].content
    first = page.split("\n")[0]
    assert first == "     1\t" + "s" * 2000 + " [… 3000 more characters of this line not shown]"
    assert len(page) <= 101_000 and page.endswith("read on with offset=49]")


# -- durability -----------------------------------------------------------------------------


async def _claimed(pool: asyncpg.Pool, worker: str) -> tuple[Claim, str]:
    await make_agent(pool)
    run_id = await enqueue(pool)
    (row,) = await pool.fetch(sql.CLAIM, worker, 1, 30.0)
    return Claim.from_record(row), run_id


async def test_run_files_ride_on_the_fenced_commit(pool: asyncpg.Pool) -> None:
    claim, run_id = await _claimed(pool, "worker-a")
    io = PgRunIO(
        pool, claim, worker_id="worker-a", lease_s=30, next_message_seq=1, next_event_seq=1
    )
    state = State(run_id, claim.session_id, claim.agent_id, claim.tenant_id)
    use = ToolUseBlock(id="toolu_1", name="write_file", input={})
    state.file_writes.append(FileWrite("/kept", "kept", 4, "toolu_1"))
    await io.record_tool_result(state, use, ToolResult("ok"), Event("tool_result"))
    assert state.file_writes == []  # the outbox is emptied once committed
    assert await io.get_file("/kept") == "kept"
    state.file_writes.append(FileWrite("/at_checkpoint", "c", 1, "toolu_1"))
    await io.checkpoint(state, [], [], None)
    assert [i.path for i in await io.list_files()] == ["/at_checkpoint", "/kept"]
    # another worker takes the lease over: this one's next write stores no file
    await pool.execute("UPDATE runs SET lease_owner = 'worker-b' WHERE id = $1", run_id)
    state.file_writes.append(FileWrite("/lost", "lost", 4, "toolu_2"))
    try:
        await io.record_tool_result(state, use, ToolResult("ok"), Event("tool_result"))
        raise AssertionError("a fenced-out write must raise Fenced")
    except Fenced:
        pass
    rows = await pool.fetch("SELECT path FROM run_files WHERE run_id = $1 ORDER BY 1", run_id)
    assert [r["path"] for r in rows] == ["/at_checkpoint", "/kept"]


async def test_worker_writes_files_cli_shows_them_and_gc_removes_them(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["write_file", "read_file"])
    provider = ScriptedProvider(
        [
            {
                "tool_calls": [
                    call("write_file", path="/out/report.md", content="# Report\nall good\n")
                ]
            },
            {"tool_calls": [call("read_file", path="/out/report.md")]},
            {"text": "written"},
        ]
    )
    run_id = await enqueue(pool)
    await run_until_idle(dsn, provider)
    row = await pool.fetchrow(
        "SELECT path, content, size, tool_use_id FROM run_files WHERE run_id = $1", run_id
    )
    assert dict(row) == {
        "path": "/out/report.md",
        "content": "# Report\nall good\n",
        "size": 18,
        "tool_use_id": "toolu_s0000_0",
    }
    read = await pool.fetchval(
        "SELECT result->>'content' FROM tool_calls WHERE run_id = $1 AND tool_use_id = $2",
        run_id,
        "toolu_s0001_0",
    )
    assert read == "     1\t# Report\n     2\tall good\n     3\t"
    # gc of the run (old and finished) takes its files with it
    await pool.execute(
        "UPDATE runs SET finished_at = now() - interval '40 days' WHERE id = $1", run_id
    )
    res = await gc(pool, older_than=datetime.timedelta(days=30), delete_runs=True)
    assert res.runs_deleted == 1
    assert await pool.fetchval("SELECT count(*) FROM run_files") == 0


async def test_5mb_result_and_a_written_file_survive_kill_9_and_resume_elsewhere(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    size, limit = 5_000_000, 400
    big_path = "/large_tool_results/toolu_big"
    lines = size // 200 + 1
    reads = [
        {"tool_calls": [call("read_file", path=big_path, offset=o, limit=limit)]}
        for o in range(0, lines, limit)
    ]
    script = [
        {
            "tool_calls": [
                {"name": "big", "input": {"bytes": size}, "id": "toolu_big"},
                {
                    "name": "write_file",
                    "input": {"path": "/plan.md", "content": "one\ntwo"},
                    "id": "toolu_plan",
                },
            ]
        },
        {"tool_calls": [{"name": "pause_once", "input": {"seconds": 120}}]},
        {"tool_calls": [{"name": "read_file", "input": {"path": "/plan.md"}, "id": "toolu_r"}]},
        *reads,
        {"text": "read it all"},
    ]
    await ensure_table(pool)
    path = tmp_path / "script.json"
    path.write_text(json.dumps(script))
    tools = ["big", "pause_once", "read_file", "write_file"]
    await make_agent(pool, tools=tools, config={"max_turns": 100})
    run_id = await enqueue(pool, "read the big thing")
    env = worker_env(dsn, path)
    a = await start_worker(env)
    try:
        async with asyncio.timeout(60):  # until A sleeps in pause_once: files committed
            while not await pool.fetchval("SELECT count(*) FROM chaos_exec WHERE tool = 'pause'"):
                await asyncio.sleep(0.1)
        assert await pool.fetchval("SELECT count(*) FROM run_files") == 2
    finally:
        await kill_worker(a)
    b = await start_worker(env)
    try:
        (row,) = await wait_all_finished(pool, [run_id], timeout=240)
    finally:
        await stop_worker(b)
    assert row["status"] == "succeeded", await pool.fetchval(
        "SELECT error::text FROM runs WHERE id = $1", run_id
    )
    assert await pool.fetchval("SELECT attempt FROM runs WHERE id = $1", run_id) == 2
    workers = await pool.fetchval(
        "SELECT count(DISTINCT worker_id) FROM run_events WHERE run_id = $1", run_id
    )
    assert workers == 2
    files = await pool.fetch(
        "SELECT path, content, size, tool_use_id FROM run_files WHERE run_id = $1 ORDER BY 1",
        run_id,
    )
    assert [(f["path"], f["size"], f["tool_use_id"]) for f in files] == [
        (big_path, size, "toolu_big"),
        ("/plan.md", 7, "toolu_plan"),
    ]
    assert files[0]["content"] == big_text(size)
    assert await pool.fetchval("SELECT count(*) FROM chaos_exec WHERE tool = 'big'") == 1
    journal = await pool.fetchval(
        "SELECT result->>'content' FROM tool_calls WHERE run_id = $1 AND tool_use_id = 'toolu_big'",
        run_id,
    )
    assert offloaded(journal) == (big_path, size) and len(journal) < 1_200
    biggest = await pool.fetchval(
        "SELECT max(length(content::text)) FROM messages WHERE run_id = $1", run_id
    )
    assert biggest < 200_000  # a read_file page at most: the 5 MB are in run_files only
    results = await _tool_results(pool, run_id)
    assert results["toolu_r"] == "     1\tone\n     2\ttwo"  # written before the kill
    pages = [results[f"toolu_s{i:04d}_0"] for i in range(3, 3 + len(reads))]
    assert rebuild(pages) == big_text(size)


async def _tool_results(pool: asyncpg.Pool, run_id: str) -> dict[str, str]:
    rows = await pool.fetch(
        "SELECT content::text AS content FROM messages WHERE run_id = $1 AND role = 'user'",
        run_id,
    )
    out = {}
    for r in rows:
        for block in json.loads(r["content"]):
            if block.get("type") == "tool_result":
                out[block["tool_use_id"]] = block["content"]
    return out


async def test_reads_see_writes_still_in_the_outbox() -> None:
    from hango_worker.agent.middlewares.filesystem import Filesystem
    from hango_worker.testing.inmem import MemoryRunIO

    store = MemoryRunIO()
    store.files["/p"] = FileWrite("/p", "stored", 6, "t0")
    fs = Filesystem(store)
    state = State("r", "s", "a", "t")
    state.file_writes.append(FileWrite("/p", "pending", 7, "t1"))
    state.file_writes.append(FileWrite("/q", "new", 3, "t1"))
    tools = {t.name: t for t in fs.provide_tools(state)}
    ctx = ToolContext("r", "t", "t2")
    assert (await tools["read_file"].invoke({"path": "/p"}, ctx)).content == "     1\tpending"
    assert (await tools["ls"].invoke({}, ctx)).content == "/p\t7 bytes\n/q\t3 bytes"
    assert (await tools["grep"].invoke({"pattern": "e"}, ctx)).content == "/p:1: pending\n/q:1: new"


async def test_a_runaway_pattern_is_stopped_and_the_worker_loop_keeps_going(
    monkeypatch: Any,
) -> None:
    from hango_worker.agent import files

    monkeypatch.setattr(files, "GREP_TIMEOUT_S", 1.0)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    turns = [
        {"tool_calls": [call("write_file", path="/a", content="a" * 27 + "b")]},
        {"tool_calls": [call("grep", pattern="(a+)+$")]},
        {"tool_calls": [call("grep", pattern="b$")]},
        {"text": "ok"},
    ]
    task = asyncio.create_task(ticker())
    try:
        outcome, _, io = await run_agent(agent(tools=FILE_TOOLS), scripted(*turns))
    finally:
        task.cancel()
    assert outcome.status == "succeeded"
    stopped = io.tool_results["toolu_s0001_0"]
    assert stopped.is_error and "took longer than 1 s and was stopped" in stopped.content
    assert io.tool_results["toolu_s0002_0"].content == "/a:1: " + "a" * 27 + "b"
    assert ticks >= 5  # the event loop ran while the pattern was being matched
