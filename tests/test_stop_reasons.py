"""The loop understands every stop reason (agent/stops.py), through a real worker, the
real SDK and the fake server scripting them:

- `pause_turn` continues the turn by sending the paused response back as it came, and
  each continuation counts as a turn (max_turns);
- `refusal` ends the run with the refusal recorded (its category and explanation), never
  retried;
- `max_tokens` in the middle of a tool call: the request again, once, with twice the
  max_tokens; the call then runs once with its whole arguments; a retry the API refuses
  leaves the cut call unexecuted;
- `model_context_window_exceeded`: compaction at once and one more call; still
  exceeded, the run fails with that named error."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.render import Painter, print_run
from hango_worker.testing.fake_anthropic import FakeAnthropic, RecordedRequest
from tests.helpers import call, recording_tool
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

SEARCH = [
    {
        "type": "server_tool_use",
        "id": "srvtoolu_01",
        "name": "web_search",
        "input": {"query": "weather"},
    },
    {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_01",
        "content": [{"type": "web_search_result", "url": "https://e.com", "title": "E"}],
    },
]


def stops(reason: str, then: str) -> float:
    labels = {"stop_reason": reason, "then": then}
    return REGISTRY.get_sample_value("hango_model_stops_total", labels) or 0.0


async def run(
    pool: asyncpg.Pool,
    dsn: str,
    script: Any,
    *,
    config: dict[str, Any] | None = None,
    tools: Any = (),
) -> tuple[dict[str, Any], FakeAnthropic]:
    await make_agent(pool, tools=["echo"], config=config)
    run_id = await enqueue(pool)
    async with FakeAnthropic(handler=script) if callable(script) else FakeAnthropic(script) as fake:
        provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
        try:
            await run_until_idle(dsn, provider, list(tools))
        finally:
            await provider.aclose()
    return await details(pool, run_id), fake


# -- pause_turn -------------------------------------------------------------------------------


async def test_a_paused_turn_is_sent_back_as_it_came_and_counts_as_a_turn(
    pool: asyncpg.Pool, dsn: str, spans: Any
) -> None:
    before = stops("pause_turn", "continued")
    script = [
        {"blocks": SEARCH, "text": "Still searching", "stop_reason": "pause_turn"},
        {"text": "Sunny."},
    ]
    got, fake = await run(pool, dsn, script)
    assert got["status"] == "succeeded", got["error"]
    assert len(fake.requests) == 2
    paused = fake.requests[1].body["messages"][-1]  # the continuation: the paused message last
    content = [{k: v for k, v in b.items() if k != "cache_control"} for b in paused["content"]]
    assert paused["role"] == "assistant" and content == [
        *SEARCH,
        {"type": "text", "text": "Still searching"},
    ]
    assert stops("pause_turn", "continued") - before == 1
    assert len(spans.events("model.pause_turn")) == 1
    assert [m["role"] for m in got["transcript"]] == ["user", "assistant", "assistant"]


async def test_pause_turn_continuations_count_against_max_turns(
    pool: asyncpg.Pool, dsn: str
) -> None:
    paused = {"blocks": SEARCH, "text": "…", "stop_reason": "pause_turn"}
    script = [paused, {**paused, "blocks": []}, {"text": "never reached"}]
    got, fake = await run(pool, dsn, script, config={"max_turns": 2, "on_limit": "fail"})
    assert got["status"] == "failed" and got["error"]["type"] == "max_turns"
    assert len(fake.requests) == 2  # the third call was never made


# -- refusal ----------------------------------------------------------------------------------

DETAILS = {"type": "refusal", "category": "cyber", "explanation": "exploit development"}


async def test_a_refusal_ends_the_run_recorded_and_is_not_retried(
    pool: asyncpg.Pool, dsn: str, spans: Any
) -> None:
    echo, calls = recording_tool()
    before = stops("refusal", "failed")
    script = [
        {"tool_calls": [call("echo", text="a")]},
        # a refusal mid-turn: the tool call in it never runs
        {
            "text": "I can't help with that.",
            "tool_calls": [call("echo", text="b")],
            "stop_reason": "refusal",
            "stop_details": DETAILS,
        },
    ]
    got, fake = await run(pool, dsn, script, tools=[echo])
    assert got["status"] == "failed"
    assert got["error"]["type"] == "refusal"
    assert got["error"]["stop_details"] == DETAILS
    assert "category cyber: exploit development" in got["error"]["message"]
    assert len(fake.requests) == 2 and [c["text"] for c in calls] == ["a"]  # not retried
    assert stops("refusal", "failed") - before == 1
    (event,) = spans.events("model.refusal")
    assert event.attributes["hango.refusal.category"] == "cyber"
    out = StringIO()
    print_run(Painter(out), got)  # `runs show`
    assert "error refusal: the model declined to answer" in out.getvalue()
    # the refused answer is in the transcript, as the API returned it
    assert got["transcript"][-1]["content"][0] == {
        "type": "text",
        "text": "I can't help with that.",
    }


# -- max_tokens in the middle of a tool call ----------------------------------------------------

LONG = " + ".join(str(i) for i in range(60))


def cut_below(limit: int, refuse_over: int | None = None) -> Any:
    """A model whose tool call is cut off unless max_tokens is at least `limit` (and
    an API that refuses a max_tokens over `refuse_over`)."""

    def answer(rec: RecordedRequest) -> dict[str, Any]:
        max_tokens = rec.body["max_tokens"]
        if refuse_over is not None and max_tokens > refuse_over:
            return {"fault": "400", "message": f"max_tokens: {max_tokens} > {refuse_over}"}
        if rec.turn_index >= 1:
            return {"text": "done"}
        turn = {
            "text": "Adding.",
            "tool_calls": [call("echo", text=LONG)],
            "usage": {"input_tokens": 100, "output_tokens": max_tokens},
        }
        return turn if max_tokens >= limit else {**turn, "stop_reason": "max_tokens"}

    return answer


async def test_a_tool_call_cut_off_by_max_tokens_is_asked_again_with_twice_the_room(
    pool: asyncpg.Pool, dsn: str, spans: Any
) -> None:
    echo, calls = recording_tool()
    before = stops("max_tokens", "retried")
    got, fake = await run(pool, dsn, cut_below(2000), config={"max_tokens": 1000}, tools=[echo])
    assert got["status"] == "succeeded", got["error"]
    assert [r.body["max_tokens"] for r in fake.requests] == [1000, 2000, 1000]
    assert [c["text"] for c in calls] == [LONG]  # ran once, with its whole arguments
    usage = got["usage"] if isinstance(got["usage"], dict) else json.loads(got["usage"])
    assert usage["output_tokens"] >= 1000 + 2000  # the dropped response is counted
    assert stops("max_tokens", "retried") - before == 1
    (event,) = spans.events("model.tool_call_cut")
    assert event.attributes["hango.retry.max_tokens"] == 2000
    # the cut response is not in the history: the retry's answer is
    assistants = [m for m in got["transcript"] if m["role"] == "assistant"]
    assert assistants[0]["content"][-1]["input"] == {"text": LONG}


async def test_a_retry_the_api_refuses_leaves_the_cut_call_unexecuted(
    pool: asyncpg.Pool, dsn: str
) -> None:
    echo, calls = recording_tool()
    before = stops("max_tokens", "kept")
    script = cut_below(5000, refuse_over=1000)
    got, fake = await run(pool, dsn, script, config={"max_tokens": 1000}, tools=[echo])
    assert got["status"] == "succeeded", got["error"]
    assert [r.body["max_tokens"] for r in fake.requests] == [1000, 2000, 1000]
    assert calls == []  # the cut call never runs; the model is told to send it again
    results = [b for m in got["transcript"] for b in m["content"] if b["type"] == "tool_result"]
    assert "cut off by max_tokens" in results[0]["content"]
    assert stops("max_tokens", "kept") - before == 1


async def test_the_retry_never_asks_for_more_than_the_output_budget_has_left(
    pool: asyncpg.Pool, dsn: str
) -> None:
    echo, calls = recording_tool()
    before = stops("max_tokens", "kept")
    config = {"max_tokens": 1000, "max_output_tokens": 2000}
    got, fake = await run(pool, dsn, cut_below(2000), config=config, tools=[echo])
    assert got["status"] == "succeeded", got["error"]
    assert 2000 not in [r.body["max_tokens"] for r in fake.requests]  # no room to double
    assert calls == [] and stops("max_tokens", "kept") - before == 1


# -- model_context_window_exceeded --------------------------------------------------------------


def exceeded_until_compacted(always: bool = False) -> tuple[Any, list[int]]:
    """Three tool turns, then a call stopped at the context window; the call after it
    answers (unless `always`). `sizes`: the characters of each of those calls' history."""
    sizes: list[int] = []
    seen: list[int] = []

    def answer(rec: RecordedRequest) -> dict[str, Any]:
        seen.append(1)
        if len(seen) <= 3:
            return {"tool_calls": [call("echo", text="x" * 400)]}
        sizes.append(len(json.dumps(rec.messages)))
        if always or len(sizes) == 1:
            return {"text": "cut", "stop_reason": "model_context_window_exceeded"}
        return {"text": "done"}

    return answer, sizes


CONTEXT = {"context_window": 4096, "compact_trigger": 0.95, "keep_tool_results": 1}


async def test_a_full_context_window_compacts_at_once_and_asks_again(
    pool: asyncpg.Pool, dsn: str
) -> None:
    echo, _ = recording_tool()
    before = stops("model_context_window_exceeded", "compacted")
    handler, sizes = exceeded_until_compacted()
    got, _ = await run(pool, dsn, handler, config=CONTEXT, tools=[echo])
    assert got["status"] == "succeeded", got["error"]
    assert len(sizes) == 2 and sizes[1] < sizes[0]  # the retry's history was compacted
    assert stops("model_context_window_exceeded", "compacted") - before == 1
    assert got["transcript"][-1]["content"] == [{"type": "text", "text": "done"}]


async def test_a_context_window_still_full_after_compaction_fails_the_run_by_name(
    pool: asyncpg.Pool, dsn: str
) -> None:
    echo, _ = recording_tool()
    before = stops("model_context_window_exceeded", "failed")
    handler, sizes = exceeded_until_compacted(always=True)
    got, _ = await run(pool, dsn, handler, config=CONTEXT, tools=[echo])
    assert got["status"] == "failed"
    assert got["error"]["type"] == "model_context_window_exceeded"
    assert "compaction could not make room" in got["error"]["message"]
    assert len(sizes) == 2  # one compaction, one more call: bounded
    assert stops("model_context_window_exceeded", "failed") - before == 1


@pytest.mark.parametrize("reason", ["refusal", "model_context_window_exceeded"])
async def test_both_end_the_run_even_when_the_response_holds_a_tool_call(
    pool: asyncpg.Pool, dsn: str, reason: str
) -> None:
    echo, calls = recording_tool()
    script = [{"tool_calls": [call("echo", text="never")], "stop_reason": reason}]
    got, _ = await run(pool, dsn, script, tools=[echo], config={"keep_tool_results": 1})
    assert got["status"] == "failed" and got["error"]["type"] == reason
    assert calls == []
