"""Images and PDFs count as the tokens the API documents for them, never as their
base64 (issue 39, item 6; docs/inputs-and-outputs.md, "Tokens of images and
documents"): the dimensions from the file's header, the PDF's pages; the compaction
and window decisions (agent/context.py) and the rate limit's first estimate
(run/ratelimit.py) use them. End to end: Postgres queue → worker → the real SDK →
FakeAnthropic."""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from hango_worker.agent.context import DEFAULT_CHARS_PER_TOKEN, media_chars, message_chars
from hango_worker.client import Client
from hango_worker.provider import media_tokens as mt
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.content import store_form
from hango_worker.provider.types import Message, RawBlock, Request, TextBlock, ToolResultBlock
from hango_worker.run.ratelimit import estimate_tokens
from hango_worker.testing.fake_anthropic import FakeAnthropic
from tests.test_content_input import image, pdf
from tests.worker_helpers import details, make_agent, run_until_idle


def png(width: int, height: int, pad: int = 0) -> bytes:
    ihdr = struct.pack(">II", width, height) + b"\x08\x06\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0" * 4 + b"\0" * pad


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\x01\x01\0\0\x01\0\x01\0\0"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\0" * 9
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def test_image_dimensions_come_from_the_header_of_each_format() -> None:
    assert mt.image_dims(png(640, 480)) == (640, 480)
    assert mt.image_dims(jpeg(1024, 768)) == (1024, 768)
    assert mt.image_dims(b"GIF89a" + struct.pack("<HH", 30, 20)) == (30, 20)
    vp8x = (
        b"RIFF\0\0\0\0WEBPVP8X"
        + b"\0" * 8
        + (799).to_bytes(3, "little")
        + (599).to_bytes(3, "little")
    )
    assert mt.image_dims(vp8x) == (800, 600)
    bits = (100 - 1) | ((50 - 1) << 14)
    vp8l = b"RIFF\0\0\0\0WEBPVP8L" + b"\0" * 5 + struct.pack("<I", bits)
    assert mt.image_dims(vp8l) == (100, 50)
    vp8 = b"RIFF\0\0\0\0WEBPVP8 " + b"\0" * 10 + struct.pack("<HH", 320, 240)
    assert mt.image_dims(vp8) == (320, 240)
    assert mt.image_dims(b"\x89PNG\r\n\x1a\n" + b"\0" * 4) is None  # cut short
    assert mt.image_dims(b"\xff\xd8\xff\xe0\x00\x02") is None


def test_image_tokens_are_pixels_over_750_up_to_the_resize_limit() -> None:
    assert mt.image_tokens(200, 200) == 54
    assert mt.image_tokens(1000, 1000) == 1334
    assert mt.image_tokens(4000, 3000) == mt.IMAGE_MAX_TOKENS == 1600
    unknown = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert mt.block_tokens(unknown) == 1600
    assert mt.block_tokens(image(b"\x89PNG\r\n\x1a\n" + b"\1" * 100)) == 1600  # header unread


def test_a_pdf_counts_its_pages_and_plain_text_documents_their_text() -> None:
    doc = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}
    doc["source"]["data"] = base64.b64encode(pdf(pages=3, pad=1000)).decode()
    assert mt.block_tokens(doc) == 3 * (2250 + 1600)
    text = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
    assert mt.block_tokens(text) is None  # its text counts as text
    assert mt.block_tokens({"type": "text", "text": "hi"}) is None


def test_a_stored_image_counts_its_pixels_not_its_base64_and_is_estimated_once() -> None:
    big = image(png(64, 64, pad=3_000_000))
    (ref,), _ = store_form([big])
    assert "data" not in ref["source"]
    block = RawBlock(ref, wire=big)
    assert message_chars(Message("user", [block])) < 100  # 6 tokens, not 4 MB of base64
    assert mt._BY_SHA[ref["source"]["hango_blob"]] == 6
    assert mt.block_tokens(ref) == 6  # from the cache: the bytes are not read again
    small = image(png(64, 64, pad=8000))  # kept inline (below the store-once threshold)
    assert message_chars(Message("user", [RawBlock(small)])) < 100
    result = ToolResultBlock("t1", "[image]", blocks=[ref], wire=[big])
    assert media_chars([ref], [big]) == int(6 * DEFAULT_CHARS_PER_TOKEN)
    msgs = [Message("user", [block, TextBlock("what is it?")]), Message("user", [result])]
    req = Request(model="m", messages=msgs, system=[TextBlock("s")])
    assert estimate_tokens(req) < 50
    huge = RawBlock(image(png(3000, 2000, pad=100)))
    assert estimate_tokens(Request("m", [Message("user", [huge])])) >= 1600


async def _claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    yield p
    await p.aclose()


async def _run(pool: asyncpg.Pool, dsn: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    await make_agent(pool, config={"context_window": 8000})
    with FakeAnthropic([{"text": "A picture."}]) as fake:
        limits = {"max_input_tokens": 4000}  # the fake counts an image as 1,600 tokens
        r = await Client(pool).enqueue("agent", "What is this?", content=content, limits=limits)
        async for claude in _claude(fake):
            await run_until_idle(dsn, claude)
        run = await details(pool, r.run_id)
        run["requests"] = len(fake.requests)
        return run


async def test_a_large_image_of_few_pixels_does_not_fill_the_window(
    pool: asyncpg.Pool, dsn: str
) -> None:
    run = await _run(pool, dsn, [image(png(64, 64, pad=3_000_000))])  # 4 MB of base64
    assert run["status"] == "succeeded", run["error"]  # no limit reached, nothing compacted
    assert run["requests"] == 1  # no summary call


async def test_images_big_in_tokens_do_fill_the_window(pool: asyncpg.Pool, dsn: str) -> None:
    run = await _run(pool, dsn, [image(png(2000, 2000)) for _ in range(6)])  # 9,600 tokens
    assert run["status"] == "failed"
    assert run["error"]["type"] == "context_window_too_small", run["error"]
    assert run["requests"] == 0  # refused before any call
