"""Stored blocks sent as Files API files (`files_api: true`; docs/inputs-and-outputs.md,
"Files API"): through the worker, the real SDK and the fake API, on a real Postgres."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.client import Client
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.files import FILES_BETA
from hango_worker.testing.fake_anthropic import FakeAnthropic, RecordedRequest
from tests.conftest import SpanReader
from tests.helpers import call, recording_tool
from tests.test_content_input import b64, document, pdf, png, screenshot_tool
from tests.worker_helpers import details, make_agent, run_until_idle

THREE_TURNS = [
    {"tool_calls": [call("echo", text="one")]},
    {"tool_calls": [call("echo", text="two")]},
    {"text": "The contract says yes."},
]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(THREE_TURNS) as f:
        yield f


@pytest.fixture
async def claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    yield p
    await p.aclose()


def uploaded(outcome: str) -> float:
    return REGISTRY.get_sample_value("hango_files_uploaded_total", {"outcome": outcome}) or 0.0


def messages_calls(fake: FakeAnthropic) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.path.startswith("/v1/messages")]


def first_block(req: RecordedRequest) -> dict[str, Any]:
    block: dict[str, Any] = req.body["messages"][0]["content"][0]
    return block


async def run_one(pool: asyncpg.Pool, dsn: str, claude: AnthropicProvider, data: bytes) -> str:
    echo, _ = recording_tool()
    r = await Client(pool).enqueue("agent", "What does it say?", content=[document(data)])
    await run_until_idle(dsn, claude, [echo])
    run = await details(pool, r.run_id)
    assert run["status"] == "succeeded", run["error"]
    return r.run_id


async def test_a_pdf_is_uploaded_once_across_turns_and_runs_and_sent_as_a_file(
    pool: asyncpg.Pool,
    dsn: str,
    fake: FakeAnthropic,
    claude: AnthropicProvider,
    spans: SpanReader,
) -> None:
    contract = pdf()
    before = {o: uploaded(o) for o in ("uploaded", "reused", "reuploaded")}
    await make_agent(pool, tools=["echo"], config={"files_api": True})
    await run_one(pool, dsn, claude, contract)
    await run_one(pool, dsn, claude, contract)  # another run of the same bytes

    assert fake.files.uploads == 1
    (file_id,) = fake.files.files
    assert fake.files.files[file_id].data == contract
    assert fake.files.files[file_id].mime_type == "application/pdf"
    calls = messages_calls(fake)
    assert len(calls) == 6
    for req in calls:
        block = first_block(req)
        assert block["source"] == {"type": "file", "file_id": file_id}
        assert block["title"] == "contract.pdf" and block["citations"] == {"enabled": True}
        assert FILES_BETA in req.headers["anthropic-beta"]
        assert b64(contract)[:200] not in json.dumps(req.body)
    rows = await pool.fetch("SELECT file_id, account FROM blob_files")
    assert [r["file_id"] for r in rows] == [file_id]
    assert "test-key" not in rows[0]["account"]
    after = {o: uploaded(o) - before[o] for o in before}
    assert after == {"uploaded": 1, "reused": 5, "reuploaded": 0}
    uploading = [s for s in spans.all() if any(e.name == "model.files_uploaded" for e in s.events)]
    assert [s.name for s in uploading] == ["chat claude-test"]  # the first call's span
    events = spans.events("model.files_uploaded")
    assert len(events) == 1 and events[0].attributes == {
        "hango.files.uploaded": 1,
        "hango.files.reuploaded": 0,
    }


async def test_a_file_the_api_lost_is_uploaded_again_and_the_run_succeeds(
    pool: asyncpg.Pool, dsn: str
) -> None:
    def script(rec: RecordedRequest) -> dict[str, Any]:
        if rec.turn_index == 1:  # the API loses the file between the first calls
            for file_id in list(fake.files.files):
                fake.files.forget(file_id)
        return THREE_TURNS[rec.turn_index]

    contract = pdf()
    reuploaded = uploaded("reuploaded")
    await make_agent(pool, tools=["echo"], config={"files_api": True})
    with FakeAnthropic(handler=script) as fake:
        claude = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
        try:
            run_id = await run_one(pool, dsn, claude, contract)
        finally:
            await claude.aclose()
    assert fake.files.uploads == 2
    (new_id,) = fake.files.files
    calls = messages_calls(fake)
    old_id = first_block(calls[0])["source"]["file_id"]
    assert old_id != new_id
    # the third call was refused (404 naming the file), then made again with the new file
    assert [first_block(r)["source"]["file_id"] for r in calls] == [old_id, old_id, old_id, new_id]
    assert uploaded("reuploaded") - reuploaded == 1
    assert await pool.fetchval("SELECT file_id FROM blob_files") == new_id
    run = await details(pool, run_id)
    assert run["transcript"][-1]["content"] == [{"type": "text", "text": "The contract says yes."}]


async def test_without_files_api_blocks_are_sent_inline_as_before(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    contract = pdf()
    await make_agent(pool, tools=["echo"])
    await run_one(pool, dsn, claude, contract)
    assert fake.files.uploads == 0
    for req in messages_calls(fake):
        assert first_block(req)["source"] == {
            "type": "base64",
            "media_type": "application/pdf",
            "data": b64(contract),
        }
        assert "anthropic-beta" not in req.headers
    assert await pool.fetchval("SELECT count(*) FROM blob_files") == 0


async def test_the_fake_files_api_through_the_sdk() -> None:
    picture = png(1000)
    async with FakeAnthropic([{"text": "ok"}, {"text": "ok"}]) as fake:
        client = anthropic.AsyncAnthropic(api_key="k", base_url=fake.base_url, max_retries=0)
        meta = await client.beta.files.upload(
            file=("p.png", picture, "image/png"), betas=[FILES_BETA]
        )
        assert (meta.mime_type, meta.size_bytes, meta.filename) == ("image/png", 1008, "p.png")
        got = await client.beta.files.retrieve_metadata(meta.id, betas=[FILES_BETA])
        assert got.id == meta.id

        async def send(block: dict[str, Any], betas: list[str]) -> Any:
            return await client.beta.messages.create(
                model="claude-test",
                max_tokens=10,
                messages=[{"role": "user", "content": [block]}],
                betas=betas,
            )

        image = {"type": "image", "source": {"type": "file", "file_id": meta.id}}
        assert (await send(image, [FILES_BETA])).content[0].text == "ok"
        with pytest.raises(anthropic.BadRequestError, match=FILES_BETA):
            await send(image, [])
        as_pdf = {"type": "document", "source": {"type": "file", "file_id": meta.id}}
        with pytest.raises(anthropic.BadRequestError, match="application/pdf"):
            await send(as_pdf, [FILES_BETA])
        await client.beta.files.delete(meta.id, betas=[FILES_BETA])
        with pytest.raises(anthropic.NotFoundError, match=meta.id):
            await send(image, [FILES_BETA])
        with pytest.raises(anthropic.NotFoundError):
            await client.beta.files.retrieve_metadata(meta.id, betas=[FILES_BETA])
        await client.close()


async def test_an_image_a_tool_returned_is_sent_as_a_file_in_the_next_calls(
    pool: asyncpg.Pool, dsn: str
) -> None:
    shot = png(150_000)
    await make_agent(pool, tools=["screenshot", "echo"], config={"files_api": True})
    script = [
        {"tool_calls": [call("screenshot")]},
        {"tool_calls": [call("echo", text="seen")]},
        {"text": "It is the page."},
    ]
    echo, _ = recording_tool()
    with FakeAnthropic(script) as fake:
        claude = AnthropicProvider(api_key="k", base_url=fake.base_url, max_retries=0)
        try:
            r = await Client(pool).enqueue("agent", "Take a screenshot.")
            await run_until_idle(dsn, claude, [screenshot_tool(shot), echo])
        finally:
            await claude.aclose()
    run = await details(pool, r.run_id)
    assert run["status"] == "succeeded", run["error"]
    assert fake.files.uploads == 1
    (file_id,) = fake.files.files
    assert fake.files.files[file_id].data == shot
    for req in messages_calls(fake)[1:]:
        result = req.body["messages"][2]["content"][0]
        assert result["content"] == [
            {"type": "image", "source": {"type": "file", "file_id": file_id}}
        ]
