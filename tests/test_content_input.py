"""Content blocks as run input (docs/inputs-and-outputs.md): images, PDFs, documents and
search results given to a run, checked against the SDK's types and the API's limits at
enqueue, stored once (blobs, by tenant and sha256) and sent byte-exact on every request,
also after the run waited and was rebuilt from Postgres.

Through a real worker, the real SDK and the fake server."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.client import Client
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.content import input_block_types, media_types, sniff
from hango_worker.store import decisions, repo
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.vocab import Decision
from tests.helpers import call, recording_tool
from tests.test_cli import cli
from tests.worker_helpers import details, make_agent, run_until_idle

T = repo.DEFAULT_TENANT_ID
MIGRATION = Path(__file__).parent.parent / "alembic" / "versions" / "0016_content_blobs.py"


def png(n: int = 200_000) -> bytes:
    return b"\x89PNG\r\n\x1a\n" + os.urandom(n)


def pdf(pages: int = 2, pad: int = 300_000) -> bytes:
    body = b"".join(b"%d 0 obj << /Type /Page /Parent 1 0 R >> endobj\n" % i for i in range(pages))
    return b"%PDF-1.7\n1 0 obj << /Type /Pages /Count 2 >> endobj\n" + body + os.urandom(pad)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def image(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": b64(data)},
    }


def document(data: bytes, title: str = "contract.pdf") -> dict[str, Any]:
    source = {"type": "base64", "media_type": "application/pdf", "data": b64(data)}
    return {"type": "document", "source": source, "title": title, "citations": {"enabled": True}}


def turns() -> list[dict[str, Any]]:
    return [
        {"tool_calls": [call("echo", text="looked")]},
        {"tool_calls": [call("ask_user", question="Which page?")]},
        {"text": "Page 2 says yes."},
    ]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(turns()) as f:
        yield f


@pytest.fixture
async def claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    yield p
    await p.aclose()


def sent(block: dict[str, Any]) -> bytes:
    return base64.b64decode(block["source"]["data"], validate=True)


async def column_bytes(pool: asyncpg.Pool) -> dict[str, int]:
    """What each table's columns that could hold the bytes take, as Postgres stores them."""
    q = {
        "blobs": "SELECT coalesce(sum(pg_column_size(data)), 0) FROM blobs",
        "runs": "SELECT coalesce(sum(pg_column_size(input) + pg_column_size(state_json)), 0) FROM runs",
        "messages": "SELECT coalesce(sum(pg_column_size(content)), 0) FROM messages",
        "tool_calls": "SELECT coalesce(sum(pg_column_size(result)), 0) FROM tool_calls",
        "run_states": "SELECT coalesce(sum(pg_column_size(state_json)), 0) FROM run_states",
        "run_events": "SELECT coalesce(sum(pg_column_size(payload)), 0) FROM run_events",
    }
    return {k: int(await pool.fetchval(v)) for k, v in q.items()}


async def test_a_png_and_a_pdf_go_through_a_tool_call_and_a_wait_byte_exact_and_stored_once(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    picture, contract = png(), pdf()
    loaded_before = REGISTRY.get_sample_value("hango_content_blobs_loaded_total") or 0.0
    echo, _ = recording_tool()
    await make_agent(pool, tools=["echo", "ask_user"])
    client = Client(pool)
    r = await client.enqueue(
        "agent", "What does the contract say?", content=[image(picture), document(contract)]
    )
    await run_until_idle(dsn, claude, [echo])
    run = await details(pool, r.run_id)
    assert run["status"] == "waiting", run["error"]
    await decisions.decide(pool, T, r.run_id, Decision.ANSWER, text="page 2")
    await run_until_idle(dsn, claude, [echo])  # a new attempt: history from Postgres
    run = await details(pool, r.run_id)
    assert run["status"] == "succeeded", run["error"]
    assert run["transcript"][-1]["content"] == [{"type": "text", "text": "Page 2 says yes."}]

    assert len(fake.requests) == 3
    for req in fake.requests:  # every request, the first and the rebuilt ones
        first = req.body["messages"][0]["content"]
        assert [b["type"] for b in first] == ["image", "document", "text"]
        assert sent(first[0]) == picture and sent(first[1]) == contract
        assert first[1]["title"] == "contract.pdf" and first[1]["citations"] == {"enabled": True}
        assert "hango_blob" not in json.dumps(first[0]["source"]) + json.dumps(first[1]["source"])
    assert (REGISTRY.get_sample_value("hango_content_blobs_loaded_total") or 0) - loaded_before == 4

    sizes = await column_bytes(pool)
    attached = len(picture) + len(contract)
    # each attachment's bytes once: in blobs (stored uncompressed), nowhere else
    assert attached <= sizes["blobs"] < attached + 1000, sizes
    others = sum(v for k, v in sizes.items() if k != "blobs")
    assert others < 20_000, sizes
    rows = await pool.fetch("SELECT media_type, size FROM blobs ORDER BY size")
    assert [(x["media_type"], x["size"]) for x in rows] == [
        ("image/png", len(picture)),
        ("application/pdf", len(contract)),
    ]
    assert await pool.fetchval("SELECT count(*) FROM run_blobs WHERE run_id = $1", r.run_id) == 2


def test_the_input_blocks_and_media_types_are_the_sdks() -> None:
    kinds = input_block_types()
    assert {"text", "image", "document", "search_result", "container_upload"} <= set(kinds)
    assert not {"tool_use", "tool_result", "thinking", "redacted_thinking"} & set(kinds)
    spec = importlib.util.spec_from_file_location("hango_migration_0016", MIGRATION)
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)
    assert media_types("image") == migration.IMAGE_TYPES  # SQL checks the SDK's list
    assert media_types("document") == ("application/pdf",)


def test_sniffing_reads_the_bytes_not_the_name() -> None:
    assert sniff(png(10)) == "image/png"
    assert sniff(b"\xff\xd8\xff\xe0rest") == "image/jpeg"
    assert sniff(b"GIF89a....") == "image/gif"
    assert sniff(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    assert sniff(pdf(1, 10)) == "application/pdf"
    assert sniff(b"hello") is None


def _bad_blocks() -> list[tuple[str, list[dict[str, Any]], str]]:
    """(what, content, the SQL API's line) for each input the API's limits refuse."""
    big = png(4_000_000)  # 5.3 MB of base64: over the API's 5 MB per image
    long_pdf = pdf(101, 10)
    return [
        (
            "media type",
            [{"type": "text", "text": "x"}, image(png(10), "image/bmp")],
            "input.content[1] (image): media type 'image/bmp' is not one the API takes",
        ),
        ("oversized", [image(big)], "input.content[0] (image): the image is 5333344 characters"),
        ("pages", [document(long_pdf)], "input.content[0] (document): the PDF has 101 pages"),
        (
            "base64",
            [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVB*"},
                }
            ],
            "input.content[0] (image): source.data is not valid base64",
        ),
        (
            "bytes",
            [image(png(10), "image/jpeg")],
            "input.content[0] (image): the data is not image/jpeg: its first bytes say image/png",
        ),
        (
            "a turn's block",
            [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
            "input.content[0] (tool_result): not a block a run's input may hold",
        ),
    ]


async def _nothing_queued(pool: asyncpg.Pool) -> None:
    for table in ("runs", "sessions", "blobs", "run_blobs"):
        assert await pool.fetchval(f"SELECT count(*) FROM {table}") == 0, table


@pytest.mark.parametrize(
    ("what", "content", "line"), _bad_blocks(), ids=[b[0] for b in _bad_blocks()]
)
async def test_the_sql_api_refuses_each_bad_block_in_one_line_and_queues_nothing(
    pool: asyncpg.Pool, what: str, content: list[dict[str, Any]], line: str
) -> None:
    await make_agent(pool)
    with pytest.raises(asyncpg.PostgresError) as e:
        await pool.fetchval(
            "SELECT hango_api.enqueue('agent', $1::text::jsonb)", json.dumps({"content": content})
        )
    assert e.value.sqlstate == "QH003", what
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)
    await _nothing_queued(pool)


async def test_the_client_refuses_a_bad_block_in_one_line(pool: asyncpg.Pool) -> None:
    await make_agent(pool)
    client = Client(pool)
    for what, content, line in _bad_blocks():
        with pytest.raises(ValueError) as e:
            await client.enqueue("agent", content=content)
        assert "\n" not in str(e.value), what
        if what not in ("media type", "a turn's block"):  # the SDK's types say it first
            assert str(e.value).startswith(line), str(e.value)
    with pytest.raises(ValueError, match=r"input.content\[0\] \(image\): source.media_type: "):
        await client.enqueue("agent", content=[image(png(10), "image/bmp")])
    with pytest.raises(ValueError, match=r"input.content\[0\] \(text\): unknown key 'colour'"):
        await client.enqueue("agent", content=[{"type": "text", "text": "x", "colour": "red"}])
    await _nothing_queued(pool)


async def test_the_sql_api_and_the_client_take_every_input_block(pool: asyncpg.Pool) -> None:
    await make_agent(pool)
    search = {
        "type": "search_result",
        "source": "https://kb.example/returns",
        "title": "Returns policy",
        "content": [{"type": "text", "text": "Returns within 30 days."}],
        "citations": {"enabled": True},
    }
    blocks = [
        {"type": "text", "text": "Read these."},
        image(png(100)),  # small: stays inline
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
        document(pdf(1, 100)),
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "Clause 1."},
            "title": "Terms",
            "context": "signed 2025",
            "citations": {"enabled": True},
        },
        {
            "type": "document",
            "source": {"type": "content", "content": [{"type": "text", "text": "Part A."}]},
        },
        search,
        {"type": "container_upload", "file_id": "file_011"},
    ]
    run_id = await pool.fetchval(
        "SELECT hango_api.enqueue('agent', $1::text::jsonb)", json.dumps({"content": blocks})
    )
    stored = json.loads(await pool.fetchval("SELECT input::text FROM runs WHERE id = $1", run_id))
    assert stored == {"content": blocks}  # small blocks are kept as given
    r = await Client(pool).enqueue("agent", "and these", content=blocks)
    stored = json.loads(await pool.fetchval("SELECT input::text FROM runs WHERE id = $1", r.run_id))
    assert stored == {"text": "and these", "content": blocks}


async def test_the_cli_attaches_files_by_their_bytes_and_shows_them_without_base64(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    await make_agent(pool)
    picture, contract = png(30_000), pdf(3, 20_000)
    (tmp_path / "chart.pdf").write_bytes(picture)  # the name says PDF: the bytes say PNG
    (tmp_path / "scan").write_bytes(contract)
    blocks = [{"type": "text", "text": "Context first."}, image(png(50))]
    (tmp_path / "blocks.json").write_text(json.dumps({"content": blocks}))
    p = cli(
        dsn, "enqueue", "--agent", "agent", "--input", "Compare them.",
        "--attach", str(tmp_path / "chart.pdf"), "--attach", str(tmp_path / "scan"),
        "--input-json", str(tmp_path / "blocks.json"),
    )  # fmt: skip
    run_id = p.stdout.strip()
    stored = json.loads(await pool.fetchval("SELECT input::text FROM runs WHERE id = $1", run_id))
    kinds = [(b["type"], b.get("source", {}).get("media_type")) for b in stored["content"]]
    assert kinds == [
        ("text", None),
        ("image", "image/png"),
        ("image", "image/png"),
        ("document", "application/pdf"),
    ]
    assert stored["content"][3]["title"] == "scan" and stored["text"] == "Compare them."
    # the run's first message is its input: show it as the transcript shows it
    await pool.execute(
        "INSERT INTO messages (session_id, seq, run_id, role, content) "
        "SELECT session_id, 1, id, 'user', input->'content' FROM runs WHERE id = $1",
        run_id,
    )
    shown = cli(dsn, "runs", "show", run_id).stdout
    assert "[image image/png 29.3 KiB sha256 " in shown, shown
    assert "[document 'scan' application/pdf " in shown and "[image image/png 58 B]" in shown
    assert b64(png(0))[:8] not in shown and len(max(shown.split(), key=len)) < 100, shown
    # --json too: the small inline image by its size, its base64 only with --with-bytes
    as_json = cli(dsn, "runs", "show", run_id, "--json").stdout
    small = json.loads(as_json)["transcript"][0]["content"][1]["source"]
    assert small == {"type": "base64", "media_type": "image/png", "size": 58, "data_omitted": True}
    small_b64 = blocks[1]["source"]["data"]
    assert small_b64 not in as_json
    raw = json.loads(cli(dsn, "runs", "show", run_id, "--json", "--with-bytes").stdout)
    assert raw["transcript"][0]["content"][1]["source"]["data"] == small_b64


@pytest.mark.parametrize(
    ("make", "args", "line"),
    [
        (lambda d: (d / "notes.txt").write_text("hi"), ["--attach", "notes.txt"],
         "--attach notes.txt: not a PNG, JPEG, GIF, WebP or PDF file (by its first bytes)"),
        (lambda d: (d / "long.pdf").write_bytes(pdf(101, 10)), ["--attach", "long.pdf"],
         "input.content[0] (document): the PDF has 101 pages; the API takes at most 100"),
        (lambda d: (d / "b.json").write_text('[{"type": "image"}]'), ["--input-json", "b.json"],
         "input.content[0] (image): source: Field required"),
        (lambda d: (d / "b.json").write_text('{"type": "text"}'), ["--input-json", "b.json"],
         "give a JSON list of content blocks"),
        (lambda d: None, ["--attach", "missing.png"], "--attach missing.png: cannot read it"),
        (lambda d: None, [], "enqueue: give --input, --input-file, --attach or --input-json"),
    ],
    ids=["not-media", "pages", "sdk-types", "not-a-list", "missing", "nothing"],
)  # fmt: skip
async def test_the_cli_refuses_bad_content_in_one_line_with_exit_2(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path, make: Any, args: list[str], line: str
) -> None:
    from tests.test_cli_errors import one_line

    await make_agent(pool)
    make(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        p = cli(dsn, "enqueue", "--agent", "agent", *args, ok=False)
    finally:
        os.chdir(cwd)
    one_line(p, 2, line)
    await _nothing_queued(pool)


async def test_a_fork_copies_references_not_bytes_and_gc_deletes_blobs_no_run_refers_to(
    pool: asyncpg.Pool, dsn: str
) -> None:
    import datetime

    from hango_worker.store import fork as forks
    from hango_worker.store.gc import gc

    picture = png()
    echo, _ = recording_tool()
    await make_agent(pool)
    with FakeAnthropic([{"tool_calls": [call("echo", text="x")]}, {"text": "done"}]) as fake:
        claude = AnthropicProvider(api_key="k", base_url=fake.base_url, max_retries=0)
        try:
            r = await Client(pool).enqueue("agent", "look", content=[image(picture)])
            await run_until_idle(dsn, claude, [echo])
            assert (await details(pool, r.run_id))["status"] == "succeeded"
            stored_before = await column_bytes(pool)
            forked = await forks.fork(pool, T, r.run_id, at_turn=1, input_text="again")
            after = await column_bytes(pool)
            # the fork's history refers to the blob: a reference row, no bytes
            assert after["blobs"] == stored_before["blobs"]
            assert after["messages"] - stored_before["messages"] < 2000, after
            refs = await pool.fetch("SELECT run_id::text FROM run_blobs")
            assert {x["run_id"] for x in refs} == {r.run_id, forked["run_id"]}
            # gc deletes the source run; the fork still refers to the blob: it stays
            res = await gc(pool, older_than=datetime.timedelta(0), delete_runs=True)
            assert res.runs_deleted == 1 and res.blobs_deleted == 0
            assert await pool.fetchval("SELECT count(*) FROM blobs") == 1
            await run_until_idle(dsn, claude, [echo])
            assert (await details(pool, forked["run_id"]))["status"] == "succeeded"
            first = fake.requests[-1].body["messages"][0]["content"]
            assert sent(first[0]) == picture  # rebuilt from the fork's references
        finally:
            await claude.aclose()
    res = await gc(pool, older_than=datetime.timedelta(0), delete_runs=True)
    assert res.runs_deleted == 1 and res.blobs_deleted == 1
    assert await pool.fetchval("SELECT count(*) FROM blobs") == 0


def screenshot_tool(data: bytes) -> Any:
    from hango_worker.tool.types import Tool

    async def fn(args: dict[str, Any], ctx: Any) -> bytes:
        return data  # bytes: an image by its first bytes

    return Tool("screenshot", "A screenshot of the page.", {"type": "object"}, fn)


async def test_a_tool_returning_an_image_is_sent_byte_exact_stored_once_and_shown(
    pool: asyncpg.Pool, dsn: str
) -> None:
    shot = png(150_000)
    stored_before = REGISTRY.get_sample_value("hango_content_blob_bytes_stored_total") or 0.0
    await make_agent(pool, tools=["screenshot", "ask_user"])
    script = [
        {"tool_calls": [call("screenshot")]},
        {"tool_calls": [call("ask_user", question="Is this the page?")]},
        {"text": "It is."},
    ]
    with FakeAnthropic(script) as fake:
        claude = AnthropicProvider(api_key="k", base_url=fake.base_url, max_retries=0)
        try:
            r = await Client(pool).enqueue("agent", "Take a screenshot.")
            await run_until_idle(dsn, claude, [screenshot_tool(shot)])
            await decisions.decide(pool, T, r.run_id, Decision.ANSWER, text="yes")
            await run_until_idle(dsn, claude, [screenshot_tool(shot)])  # from Postgres
        finally:
            await claude.aclose()
    run = await details(pool, r.run_id)
    assert run["status"] == "succeeded", run["error"]
    for req in fake.requests[1:]:
        result = req.body["messages"][2]["content"][0]
        assert result["type"] == "tool_result" and result["content"][0]["type"] == "image"
        assert sent(result["content"][0]) == shot
    stored = REGISTRY.get_sample_value("hango_content_blob_bytes_stored_total") or 0.0
    assert stored - stored_before == len(shot)
    sizes = await column_bytes(pool)
    assert len(shot) <= sizes["blobs"] < len(shot) + 1000, sizes
    assert sum(v for k, v in sizes.items() if k != "blobs") < 20_000, sizes
    shown = cli(dsn, "runs", "show", r.run_id).stdout
    assert "← [image image/png 146.5 KiB sha256 " in shown, shown
    assert len(max(shown.split(), key=len)) < 100


def test_compaction_clears_an_old_image_result_to_a_note_saying_it_is_kept() -> None:
    from hango_worker.agent import compaction as cp
    from hango_worker.provider.types import Message, TextBlock, ToolUseBlock
    from hango_worker.tool.types import ToolResult

    result = ToolResult.of_bytes(png(150_000))
    assert result.blocks is not None and result.stored is not None and len(result.blobs) == 1
    assert "data" not in result.stored[0]["source"]  # stored by reference
    call_msg = Message("assistant", [ToolUseBlock("toolu_1", "screenshot", {})])
    results = Message("user", [result.to_block("toolu_1"), TextBlock("next")])
    assert results.to_dict()["content"][0]["content"][0]["source"]["data"]  # sent whole
    shown = cp.cleared(results, call_msg)
    note = shown.content[0].to_dict()["content"]
    assert note.startswith("[tool result cleared from the context: screenshot returned image ")
    assert "image/png 146.5 KiB sha256 " in note and "it is kept with the run" in note
    assert shown.content[1] is results.content[1]
    saved = cp.message_chars(results) - cp.message_chars(shown)
    assert saved > 5000  # the rung pays: an image counts as the API's tokens for it


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (image(png(10), "image/bmp"), "messages.0.content.0.source.base64.media_type: Input should be"),
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iV*="}},
            "messages.0.content.0.source.base64.data: invalid base64 data",
        ),
        (image(png(4_000_000)), "image exceeds 5 MB maximum: 5333344 bytes > 5242880 bytes"),
        (image(png(10), "image/gif"), "specified using the image/gif media type, but the data"),
        (document(pdf(101, 10)), "A maximum of 100 PDF pages may be provided."),
    ],
    ids=["media-type", "base64", "size", "bytes", "pages"],
)  # fmt: skip
async def test_the_fake_refuses_media_as_the_api_does(block: dict[str, Any], message: str) -> None:
    import anthropic

    async with FakeAnthropic([{"text": "ok"}]) as fake:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=fake.base_url, max_retries=0)
        messages: Any = [{"role": "user", "content": [block, {"type": "text", "text": "?"}]}]
        with pytest.raises(anthropic.BadRequestError, match=re.escape(message)):
            await client.messages.create(model="m", max_tokens=10, messages=messages)
        ok: Any = [{"role": "user", "content": [image(png(100)), document(pdf(2, 100))]}]
        reply = await client.messages.create(model="m", max_tokens=10, messages=ok)
        assert reply.content[0].type == "text"
        await client.close()


async def test_a_block_the_sdk_refuses_given_through_sql_fails_the_run_before_any_call(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await make_agent(pool)
    bad = {"type": "search_result", "source": "kb", "content": [{"type": "text", "text": "x"}]}
    content = [image(png()), bad]  # the SQL API checks limits; the SDK's types at load
    run_id = await pool.fetchval(
        "SELECT hango_api.enqueue('agent', $1::text::jsonb)::text", json.dumps({"content": content})
    )
    await run_until_idle(dsn, claude)
    run = await details(pool, run_id)
    assert run["status"] == "failed" and fake.requests == []
    assert run["error"]["type"] == "invalid_input"
    assert run["error"]["message"] == "runs.input.content[1] (search_result): title: Field required"
