"""Recorded Messages API streams replayed through the real SDK and hango's provider.

Each `tests/streams/NAME.sse` is a raw server-sent-event stream in the exact wire format
the Messages API streams (`event:` and `data:` lines, a blank line after each event,
`ping`s included), written for this project: thinking with its `signature_delta` and a
tool call after it, `redacted_thinking`, `server_tool_use` + `web_search_tool_result`
with a cited answer, `citations_delta`s on text blocks, a `compaction` block, and an
invented block type with an invented delta type. `NAME.expected.json` is the message the
events describe: each block as the API would have returned it unstreamed.

The bytes are served by an httpx transport under the SDK's own client (its SSE decoder,
its event types, the plain and the beta endpoint), and folded by
`provider/accumulate.py` as in production; the assembled blocks must equal the
expected JSON, key for key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import pytest
from prometheus_client import REGISTRY

from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.types import Message, Request, Response, TextBlock

STREAMS = Path(__file__).with_name("streams")
NAMES = sorted(p.stem for p in STREAMS.glob("*.sse"))
BETA = {"betas": ["compact-2026-01-12", "context-management-2025-06-27"]}


def events(name: str) -> list[dict[str, Any]]:
    """The stream's events, as the JSON of their `data:` lines."""
    text = (STREAMS / f"{name}.sse").read_text()
    return [json.loads(ln[len("data: ") :]) for ln in text.splitlines() if ln.startswith("data: ")]


async def replay(name: str, params: dict[str, Any] | None) -> tuple[Response, list[str], str]:
    """The stream `name` served to the SDK; the response, the text handed to on_text,
    and the request's `anthropic-beta` header."""
    body = (STREAMS / f"{name}.sse").read_bytes()
    paths: list[str] = []

    def serve(request: httpx2.Request) -> httpx2.Response:
        paths.append(request.headers.get("anthropic-beta", ""))
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(serve))
    client = anthropic.AsyncAnthropic(api_key="test-key", http_client=http, max_retries=0)
    provider = AnthropicProvider(client)
    seen: list[str] = []
    try:
        request = Request(
            model="claude-test",
            messages=[Message("user", [TextBlock(text="hi")])],
            max_tokens=4096,
            params=params,
        )
        resp = await provider.complete(request, seen.append)
    finally:
        await provider.aclose()
    (betas,) = paths
    return resp, seen, betas


def unknown_deltas() -> float:
    return REGISTRY.get_sample_value("hango_stream_unknown_deltas_total") or 0.0


def test_every_fixture_has_its_expected_message_and_the_wire_format() -> None:
    assert NAMES == [
        "citations",
        "compaction",
        "future_block",
        "redacted_thinking",
        "thinking",
        "web_search",
    ]
    for name in NAMES:
        raw = (STREAMS / f"{name}.sse").read_text()
        assert raw.endswith("\n\n"), name
        for frame in raw.strip("\n").split("\n\n"):  # `event: T` then `data: {"type": T}`
            head, data = frame.split("\n")
            kind = head.removeprefix("event: ")
            assert json.loads(data.removeprefix("data: "))["type"] == kind, (name, frame)
        assert (STREAMS / f"{name}.expected.json").is_file()


@pytest.mark.parametrize("endpoint", ["plain", "beta"])
@pytest.mark.parametrize("name", NAMES)
async def test_a_recorded_stream_assembles_into_the_blocks_it_describes(
    name: str, endpoint: str
) -> None:
    expected = json.loads((STREAMS / f"{name}.expected.json").read_text())
    before = unknown_deltas()
    resp, seen, betas = await replay(name, BETA if endpoint == "beta" else None)
    assert ("compact-2026-01-12" in betas) == (endpoint == "beta"), betas
    assert [b.to_dict() for b in resp.message.content] == expected["content"]
    assert resp.stop_reason.value == expected["stop_reason"]
    usage = {k: getattr(resp.usage, k) for k in expected["usage"]}
    assert usage == expected["usage"]
    assert resp.id == events(name)[0]["message"]["id"]
    # the text deltas, and only those, reach the live-text sink, in order
    texts = [
        e["delta"]["text"]
        for e in events(name)
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta"
    ]
    assert seen == texts
    # only a delta type nobody knows counts as unknown (compaction_delta is known)
    assert unknown_deltas() - before == expected.get("unknown_deltas", 0)
