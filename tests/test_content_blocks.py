"""Claude's content is kept as it came (docs/system-architecture.md, "Content blocks"):
every block the API returns, of any type, with every field, is stored and sent back as
the same JSON value, also after the run waited and was rebuilt from Postgres.

Through a real worker, the real SDK and the fake server, which checks round trips
(testing/fake_anthropic/roundtrip.py): a turn of thinking, redacted thinking, a web
search (server_tool_use and its result), a web fetch result, a code execution result,
text with citations and a block type nobody knows yet, then a tool call; a turn with a
compaction block and an invented fallback block, then an `ask_user` wait; then, once
answered, the final answer."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from anthropic._models import construct_type
from anthropic.types import RawMessageStreamEvent
from prometheus_client import REGISTRY

from hango_worker.provider.accumulate import Accumulator
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.types import RawBlock, TextBlock, message_from_dict
from hango_worker.store import decisions, repo
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.vocab import Decision
from tests.helpers import call, recording_tool
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

T = repo.DEFAULT_TENANT_ID
CITATION = {
    "type": "web_search_result_location",
    "url": "https://example.com/a",
    "title": "A",
    "encrypted_index": "EqgBCioIARgB",
    "cited_text": "the sky is blue",
}
SEARCH = [
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"},
    {
        "type": "server_tool_use",
        "id": "srvtoolu_01",
        "name": "web_search",
        "input": {"query": "sky colour", "allowed": ["example.com"]},
    },
    {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01",
        "content": [
            {
                "type": "web_search_result",
                "url": "https://example.com/a",
                "title": "A",
                "encrypted_content": "EqgfCioIARgBIiQ3",
                "page_age": "April 30, 2025",
            }
        ],
    },
    {
        "type": "web_fetch_tool_result",
        "tool_use_id": "srvtoolu_02",
        "content": {"type": "web_fetch_result", "url": "https://example.com/a", "content": {}},
    },
    {
        "type": "code_execution_tool_result",
        "tool_use_id": "srvtoolu_03",
        "content": {"type": "code_execution_result", "stdout": "4\n", "return_code": 0},
    },
    {"type": "text", "text": "The sky is blue.", "citations": [CITATION, {**CITATION, "url": "u"}]},
    {"type": "future_block", "payload": {"nested": [1, "two", None]}, "flag": True},
]
LATER = [
    {"type": "compaction", "content": "summary of earlier turns", "encrypted": "Zm9v"},
    {"type": "model_fallback", "from": "claude-x", "to": "claude-y"},
]


def turns() -> list[dict[str, Any]]:
    return [
        {"thinking": "I should search.", "blocks": SEARCH, "tool_calls": [call("echo", text="hi")]},
        {"blocks": LATER, "tool_calls": [call("ask_user", question="Which region?")]},
        {"text": "Done: eu-west-1."},
    ]


def said(turn: int) -> list[dict[str, Any]]:
    """The assistant content the fake returned for `turn`, as the API would."""
    t = turns()[turn]
    out: list[dict[str, Any]] = []
    if "thinking" in t:
        out.append({"type": "thinking", "thinking": t["thinking"], "signature": f"scripted-{turn}"})
    out += copy.deepcopy(t.get("blocks", []))
    if "text" in t:
        out.append({"type": "text", "text": t["text"]})
    for j, c in enumerate(t.get("tool_calls", [])):
        out.append({"type": "tool_use", "id": f"toolu_s{turn:04d}_{j}", **c})
    return out


def plain(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in b.items() if k != "cache_control"} for b in content]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(turns()) as f:
        yield f


@pytest.fixture
async def claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    yield p
    await p.aclose()


async def test_every_block_type_goes_back_as_it_came_across_a_wait(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    echo, _ = recording_tool()
    await make_agent(pool, tools=["echo", "ask_user"])
    run_id = await enqueue(pool)
    await run_until_idle(dsn, claude, [echo])
    run = await details(pool, run_id)
    assert run["status"] == "waiting", run["error"]
    await decisions.decide(pool, T, run_id, Decision.ANSWER, text="eu-west-1")
    await run_until_idle(dsn, claude, [echo])  # a new attempt: history from Postgres
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    last = fake.requests[-1].body["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert plain(last[1]["content"]) == said(0), "turn 0 was not sent back as it came"
    assert plain(last[3]["content"]) == said(1), "turn 1 was not sent back as it came"
    # the stored transcript (`runs show --json`) holds every block, byte for byte
    stored = [m["content"] for m in run["transcript"] if m["role"] == "assistant"]
    # the same JSON values: every key, every value, every block in order (jsonb keeps
    # no key order, and JSON objects have none the API reads)
    assert stored == [said(0), said(1), said(2)]


async def test_the_fake_refuses_assistant_content_that_was_changed(
    fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    import anthropic

    first = await claude.client.messages.create(
        model="m", max_tokens=100, messages=[{"role": "user", "content": "go"}]
    )
    content = [b.to_dict() for b in first.content]
    dropped = [b for b in content if b["type"] != "redacted_thinking"]
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": dropped},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_s0000_0", "content": "x"}],
        },
    ]
    with pytest.raises(anthropic.BadRequestError, match="not the one the model returned"):
        await claude.client.messages.create(model="m", max_tokens=100, messages=history)


def _events(*frames: dict[str, Any]) -> list[Any]:
    return [construct_type(type_=RawMessageStreamEvent, value=f) for f in frames]


def test_an_unknown_delta_is_merged_by_the_rule_every_known_delta_follows() -> None:
    before = REGISTRY.get_sample_value("hango_stream_unknown_deltas_total") or 0.0
    acc = Accumulator(None)
    start = {"type": "message_start", "message": {"id": "m", "model": "x", "usage": {}}}
    start["message"].update({"type": "message", "role": "assistant", "content": []})
    start["message"]["usage"] = {"input_tokens": 1, "output_tokens": 1}
    frames = [
        start,
        {"type": "content_block_start", "index": 0, "content_block": {"type": "future_block"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta", "s": "ab"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "future_delta", "s": "cd"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "hi"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "future_delta", "n": [1]}},
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 3},
        },
    ]
    for e in _events(*frames):
        acc.feed(e)
    blocks = acc.response("x").message.content
    assert isinstance(blocks[0], RawBlock) and blocks[0].data == {
        "type": "future_block",
        "s": "abcd",
    }
    assert isinstance(blocks[1], TextBlock) and blocks[1].to_dict() == {
        "type": "text",
        "text": "hi",
        "n": [1],
    }
    after = REGISTRY.get_sample_value("hango_stream_unknown_deltas_total") or 0.0
    assert after - before == 3


def test_stored_blocks_of_any_type_read_back_as_they_were_written() -> None:
    content = [*said(0), *LATER]
    m = message_from_dict({"role": "assistant", "content": content})
    assert [b.to_dict() for b in m.content] == content
    assert m.text() == "The sky is blue."
    assert [u.id for u in m.tool_uses()] == ["toolu_s0000_0"]  # server_tool_use is not ours
    with pytest.raises(ValueError, match="needs a string 'type'"):
        message_from_dict({"role": "assistant", "content": [{"text": "no type"}]})


def test_runs_show_prints_citations_and_every_other_block() -> None:
    import io

    from hango_worker.render import Painter, block_lines

    p = Painter(io.StringIO())
    lines = [line for b in said(0) for line in block_lines(p, "assistant", b)]
    text = "\n".join(lines)
    assert "The sky is blue." in text and "(2 citations: " in text and "example.com/a" in text
    assert "⇢ web_search(" in text and "sky colour" in text
    for kind in ("redacted_thinking", "web_search_tool_result", "web_fetch_tool_result"):
        assert f"[{kind}]" in text
    assert "[future_block]" in text and "nested" in text
