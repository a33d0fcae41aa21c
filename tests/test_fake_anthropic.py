"""FakeAnthropic on its own: the wire format, auth, validation with the real API's
messages, faults, the prompt cache, the script format and the CLI.

Wire checks use raw HTTP (http.client); behaviour checks use the real SDK. Only
127.0.0.1 is ever contacted.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from hango_worker.provider.scripted import ScriptError
from hango_worker.testing.fake_anthropic import (
    MESSAGE_OVERHEAD_TOKENS,
    TOOL_OVERHEAD_TOKENS,
    FakeAnthropic,
    FakeTurn,
    Fault,
    PromptCache,
    RecordedRequest,
    count_tokens,
    load_fake_script,
    parse_fake_script,
)
from hango_worker.testing.network import require_loopback_anthropic

KEY = "sk-ant-fake-test-key"
MODEL = "claude-test-model"
VERSION = "2023-06-01"


def test_anthropic_base_url_is_loopback_if_set() -> None:
    require_loopback_anthropic()


# -- helpers -------------------------------------------------------------------------------


def post(
    fake: FakeAnthropic,
    body: Any,
    headers: dict[str, str] | None = None,
    path: str = "/v1/messages",
) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP request (blocking; the fake runs in its own thread)."""
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
    hdrs = {"content-type": "application/json", "anthropic-version": VERSION, "x-api-key": KEY}
    hdrs.update(headers or {})
    hdrs = {k: v for k, v in hdrs.items() if v}
    try:
        conn.request("POST", path, body=json.dumps(body), headers=hdrs)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def body_for(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    msgs = list(messages) or [{"role": "user", "content": "hi"}]
    return {"model": MODEL, "max_tokens": 100, "messages": msgs, **extra}


def parse_sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    frames = []
    for raw in data.decode().split("\n\n"):
        if not raw.strip():
            continue
        lines = dict(line.split(": ", 1) for line in raw.split("\n"))
        frames.append((lines["event"], json.loads(lines["data"])))
    return frames


def error_of(data: bytes) -> dict[str, Any]:
    body = json.loads(data)
    assert body["type"] == "error"
    assert body["request_id"].startswith("req_fake_")
    err: dict[str, Any] = body["error"]
    return err


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic([{"text": "Hello there world."}]) as server:
        yield server


def tool_use(tid: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tid, "name": "calc", "input": {}}


def tool_result(tid: str) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tid, "content": "ok"}


# -- wire format ---------------------------------------------------------------------------


def test_streaming_sse_frames_in_api_order(fake: FakeAnthropic) -> None:
    fake.load(
        [
            {
                "thinking": "hmm",
                "text": "Hi you",
                "tool_calls": [{"name": "calc", "input": {"expression": "1 + 2"}}],
            }
        ]
    )
    status, headers, data = post(fake, body_for(stream=True))
    assert status == 200
    assert headers["content-type"].startswith("text/event-stream")
    assert headers["request-id"].startswith("req_fake_")
    frames = parse_sse(data)
    kinds = [k for k, _ in frames]
    assert all(k == d["type"] for k, d in frames)
    assert kinds[:2] == ["message_start", "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    deltas = [d["delta"] for k, d in frames if k == "content_block_delta"]
    assert {d["type"] for d in deltas} == {
        "thinking_delta",
        "signature_delta",
        "text_delta",
        "input_json_delta",
    }
    json_parts = [d["partial_json"] for d in deltas if d["type"] == "input_json_delta"]
    assert json_parts[0] == "" and json.loads("".join(json_parts)) == {"expression": "1 + 2"}
    start = frames[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["model"] == MODEL
    delta = frames[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["output_tokens"] > 1


def test_non_streaming_message(fake: FakeAnthropic) -> None:
    status, headers, data = post(fake, body_for())
    assert status == 200 and headers["content-type"] == "application/json"
    msg = json.loads(data)
    assert msg["type"] == "message" and msg["role"] == "assistant"
    assert msg["content"] == [{"type": "text", "text": "Hello there world."}]
    assert msg["stop_reason"] == "end_turn" and msg["stop_sequence"] is None
    assert set(msg["usage"]) >= {
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    }


async def test_sdk_non_streaming_and_stream_helper() -> None:
    async with FakeAnthropic(
        [{"text": "one"}, {"text": "two", "stop_reason": "stop_sequence"}]
    ) as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
        msg = await client.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        assert msg.content[0].type == "text" and msg.content[0].text == "one"
        history: list[Any] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "one"},
            {"role": "user", "content": "again"},
        ]
        async with client.messages.stream(
            model=MODEL, max_tokens=10, messages=history, stop_sequences=["END"]
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text == "two"
        assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "END")
        await client.close()


def test_sequential_requests_reuse_one_connection(fake: FakeAnthropic) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=10)
    hdrs = {"content-type": "application/json", "anthropic-version": VERSION, "x-api-key": KEY}
    for stream in (True, False, True):
        conn.request("POST", "/v1/messages", body=json.dumps(body_for(stream=stream)), headers=hdrs)
        resp = conn.getresponse()
        assert resp.status == 200
        resp.read()
    conn.close()
    assert len(fake.requests) == 3


# -- auth ----------------------------------------------------------------------------------


def test_accepts_x_api_key_and_bearer(fake: FakeAnthropic) -> None:
    assert post(fake, body_for())[0] == 200
    assert post(fake, body_for(), {"x-api-key": "", "authorization": f"Bearer {KEY}"})[0] == 200
    assert [r.api_key for r in fake.requests] == [KEY, KEY]


def test_missing_or_wrong_key_is_401() -> None:
    with FakeAnthropic([{"text": "x"}], api_key=KEY) as fake:
        status, _, data = post(fake, body_for(), {"x-api-key": ""})
        assert status == 401
        assert error_of(data) == {
            "type": "authentication_error",
            "message": "x-api-key header is required",
        }
        status, _, data = post(fake, body_for(), {"x-api-key": "wrong"})
        assert status == 401 and error_of(data)["message"] == "invalid x-api-key"
        assert post(fake, body_for())[0] == 200


def test_records_every_request_with_body_and_headers(fake: FakeAnthropic) -> None:
    post(fake, body_for(), {"x-custom": "1"})
    post(fake, body_for(stream=True))
    assert len(fake.requests) == 2
    first = fake.requests[0]
    assert isinstance(first, RecordedRequest)
    assert first.method == "POST" and first.path == "/v1/messages"
    assert first.headers["x-custom"] == "1" and first.headers["anthropic-version"] == VERSION
    assert first.body == body_for()
    assert fake.requests[1].body["stream"] is True
    fake.clear()
    assert fake.requests == []


def test_unknown_path_is_404(fake: FakeAnthropic) -> None:
    status, _, data = post(fake, {}, path="/v1/complete")
    assert status == 404 and error_of(data)["type"] == "not_found_error"


# -- validation ----------------------------------------------------------------------------

DANGLING = (
    "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: "
    "toolu_x. Each `tool_use` block must have a corresponding `tool_result` block in the "
    "next message."
)


async def test_sdk_gets_the_real_api_error_for_a_dangling_tool_use() -> None:
    async with FakeAnthropic([{"text": "x"}, {"text": "y"}]) as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
        messages: list[Any] = [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [tool_use("toolu_x")]},
            {"role": "user", "content": "what now?"},
        ]
        with pytest.raises(anthropic.BadRequestError) as info:
            await client.messages.create(model=MODEL, max_tokens=10, messages=messages)
        await client.close()
    e = info.value
    assert e.status_code == 400 and e.type == "invalid_request_error"
    assert e.api_message == DANGLING
    assert e.request_id is not None and e.request_id.startswith("req_fake_")


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (  # one of two calls answered
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [tool_use("toolu_a"), tool_use("toolu_b")]},
                {"role": "user", "content": [tool_result("toolu_a")]},
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: toolu_b.",
        ),
        (  # results present but not first
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [tool_use("toolu_a")]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "x"}, tool_result("toolu_a")],
                },
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: toolu_a.",
        ),
        (  # the history ends on the call
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [tool_use("toolu_a"), tool_use("toolu_b")]},
            ],
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately "
            "after: toolu_a, toolu_b.",
        ),
        (  # a result with no call
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [tool_use("toolu_a")]},
                {"role": "user", "content": [tool_result("toolu_a"), tool_result("toolu_z")]},
            ],
            "messages.2.content.1: unexpected `tool_use_id` found in `tool_result` blocks: "
            "toolu_z. Each `tool_result` block must have a corresponding `tool_use` block in "
            "the previous message.",
        ),
        ([], "messages: at least one message is required"),
    ],
    ids=["one-unanswered", "results-not-first", "ends-on-call", "stray-result", "empty"],
)
def test_invalid_histories_are_400(
    fake: FakeAnthropic, messages: list[dict[str, Any]], message: str
) -> None:
    status, _, data = post(
        fake, body_for(*messages) if messages else {**body_for(), "messages": []}
    )
    assert status == 400
    err = error_of(data)
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith(message)


def test_a_valid_tool_round_trip_is_accepted(fake: FakeAnthropic) -> None:
    fake.load([{"text": "a"}, {"text": "b"}])
    history: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "text", "text": "x"}, tool_use("toolu_a")]},
        {
            "role": "user",
            "content": [tool_result("toolu_a"), {"type": "text", "text": "also this"}],
        },
    ]
    status, _, data = post(fake, body_for(*history))
    assert status == 200, data


def test_more_than_four_cache_control_blocks_is_400(fake: FakeAnthropic) -> None:
    cc = {"type": "ephemeral"}
    body = body_for(
        {"role": "user", "content": [{"type": "text", "text": "a", "cache_control": cc}]},
        system=[{"type": "text", "text": f"s{i}", "cache_control": cc} for i in range(3)],
        tools=[{"name": "t", "input_schema": {"type": "object"}, "cache_control": cc}],
    )
    status, _, data = post(fake, body)
    assert status == 400
    assert error_of(data)["message"] == (
        "A maximum of 4 blocks with cache_control may be provided. Found 5."
    )
    body["tools"][0].pop("cache_control")
    assert post(fake, body)[0] == 200


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"anthropic-version": ""}, "anthropic-version: header is required"),
        ({"drop": "model"}, "model: Field required"),
        ({"drop": "max_tokens"}, "max_tokens: Field required"),
    ],
)
def test_missing_required_parts_are_400(
    fake: FakeAnthropic, change: dict[str, str], message: str
) -> None:
    body = body_for()
    headers = dict(change)
    body.pop(headers.pop("drop", ""), None)
    status, _, data = post(fake, body, headers)
    assert status == 400 and error_of(data)["message"] == message


def test_script_exhausted_is_a_clear_400(fake: FakeAnthropic) -> None:
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "b"},
    ]
    status, _, data = post(fake, body_for(*history))
    assert status == 400
    assert "the script has no turn 2 (it has 1)" in error_of(data)["message"]


# -- faults --------------------------------------------------------------------------------


def test_http_faults_with_headers(fake: FakeAnthropic) -> None:
    fake.load(
        [
            {"fault": "429"},
            {"fault": "rate_limit", "retry_after": 0.25},
            {"fault": 529},
            {"fault": "500", "message": "boom"},
            {"text": "finally"},
        ]
    )
    status, headers, data = post(fake, body_for())
    assert (status, headers["retry-after"], error_of(data)["type"]) == (
        429,
        "1",
        "rate_limit_error",
    )
    status, headers, _ = post(fake, body_for())
    assert (status, headers["retry-after"]) == (429, "0.25")
    status, headers, data = post(fake, body_for())
    assert (status, error_of(data)) == (529, {"type": "overloaded_error", "message": "Overloaded"})
    status, _, data = post(fake, body_for())
    assert (status, error_of(data)) == (500, {"type": "api_error", "message": "boom"})
    status, _, data = post(fake, body_for())
    assert status == 200 and json.loads(data)["content"][0]["text"] == "finally"


def test_dropped_connection(fake: FakeAnthropic) -> None:
    fake.inject("drop")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
        post(fake, body_for())
    assert post(fake, body_for())[0] == 200


def test_midstream_overloaded_error_event(fake: FakeAnthropic) -> None:
    fake.inject("midstream_overloaded")
    status, _, data = post(fake, body_for(stream=True))
    assert status == 200
    frames = parse_sse(data)
    assert [k for k, _ in frames] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "error",
    ]
    assert frames[-1][1]["error"] == {"type": "overloaded_error", "message": "Overloaded"}


def test_midstream_drop_cuts_the_chunked_body(fake: FakeAnthropic) -> None:
    fake.inject("midstream_drop")
    with pytest.raises(http.client.IncompleteRead):
        post(fake, body_for(stream=True))


def test_midstream_garbage_sends_a_frame_that_is_not_json(fake: FakeAnthropic) -> None:
    fake.inject("midstream_garbage", message="{half")
    status, _, data = post(fake, body_for(stream=True))
    assert status == 200
    *good, last = data.decode().rstrip("\n").split("\n\n")
    assert [f.split("\n")[0] for f in good] == [
        "event: message_start",
        "event: ping",
        "event: content_block_start",
        "event: content_block_delta",
    ]
    assert last == "event: content_block_delta\ndata: {half"


def test_a_fault_can_echo_the_key_in_its_request_id(fake: FakeAnthropic) -> None:
    fake.inject("400", request_id="req_{api_key}_x")
    status, headers, data = post(fake, body_for())
    assert status == 400 and headers["request-id"] == f"req_{KEY}_x"
    assert json.loads(data)["request_id"] == f"req_{KEY}_x"


def test_tool_inputs_can_be_any_json_and_come_whole_in_block_start(fake: FakeAnthropic) -> None:
    calls = [{"name": "t", "input": [1, 2]}, {"name": "t", "input": "s"}]
    fake.load([{"tool_calls": calls, "inputs_in_start": True}])
    frames = parse_sse(post(fake, body_for(stream=True))[2])
    starts = [f["content_block"] for k, f in frames if k == "content_block_start"]
    assert [b["input"] for b in starts] == [[1, 2], "s"]
    assert not [f for k, f in frames if k == "content_block_delta"]
    fake.load([{"tool_calls": calls}])
    frames = parse_sse(post(fake, body_for(stream=True))[2])
    deltas = [f["delta"]["partial_json"] for k, f in frames if k == "content_block_delta"]
    assert "".join(deltas) == '[1, 2]"s"'


def test_injected_faults_come_before_the_script(fake: FakeAnthropic) -> None:
    fake.inject(Fault(fault="500", times=2))
    fake.inject({"fault": "403", "message": "nope"})
    codes = [post(fake, body_for())[0] for _ in range(4)]
    assert codes == [500, 500, 403, 200]


def test_scripted_model_error_key_becomes_an_http_error(fake: FakeAnthropic) -> None:
    fake.load(
        [{"text": "ok", "error": {"type": "overloaded_error", "message": "busy", "times": 2}}]
    )
    assert [post(fake, body_for())[0] for _ in range(3)] == [529, 529, 200]


async def test_slow_chunks_are_spread_out() -> None:
    async with FakeAnthropic([{"text": "a b c"}], chunk_delay_s=0.01) as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        stamps = []
        stream = await client.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}], stream=True
        )
        async for _event in stream:
            stamps.append(loop.time() - t0)
        await client.close()
    assert len(stamps) == 8  # start, block start, 3 deltas, block stop, delta, stop (pings skipped)
    assert stamps[-1] >= 0.01 * 10


# -- handler -------------------------------------------------------------------------------


async def test_handler_function_of_the_request() -> None:
    seen: list[RecordedRequest] = []

    async def handler(req: RecordedRequest) -> dict[str, Any]:
        seen.append(req)
        last = req.messages[-1]["content"]
        if last == "fail":
            return {"fault": "400", "message": "asked to fail"}
        return {"text": f"echo: {last}"}

    async with FakeAnthropic(handler=handler) as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
        msg = await client.messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "ping"}]
        )
        assert msg.content[0].type == "text" and msg.content[0].text == "echo: ping"
        with pytest.raises(anthropic.BadRequestError, match="asked to fail"):
            await client.messages.create(
                model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "fail"}]
            )
        await client.close()
    assert len(seen) == 2 and seen[0].turn_index == 0


def test_constructor_needs_script_or_handler() -> None:
    with pytest.raises(ValueError, match="either a script or a handler"):
        FakeAnthropic()


# -- script format -------------------------------------------------------------------------


def test_fault_entries_attach_to_the_next_turn() -> None:
    turns = parse_fake_script(
        [
            {"fault": "429", "times": 2},
            {"text": "a", "faults": [{"fault": "drop"}]},
            {"text": "b"},
        ]
    )
    assert len(turns) == 2
    assert [f.fault for f in turns[0].all_faults()] == ["429", "429", "drop"]
    assert turns[1].all_faults() == []


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"text": "x"}, "a script is a JSON list"),
        ([{"text": "x"}, {"fault": "500"}], "not followed by a turn"),
        ([{"fault": "teapot"}, {"text": "x"}], "unknown fault 'teapot'"),
        ([{"txt": "x"}], "entry 0: txt"),
    ],
)
def test_bad_scripts_are_refused_clearly(raw: Any, message: str) -> None:
    with pytest.raises(ScriptError, match=message):
        parse_fake_script(raw)


def test_the_demo_script_loads(tmp_path: Path) -> None:
    demo = Path(__file__).resolve().parents[1] / "hango_worker" / "demo" / "script.json"
    if not demo.exists():
        pytest.skip("no demo script in this checkout")
    turns = load_fake_script(demo)
    assert turns and all(isinstance(t, FakeTurn) for t in turns)


# -- prompt cache --------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cached_body(system_chars: int, *messages: dict[str, Any], ttl: str | None = None) -> Any:
    cc: dict[str, str] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    system = [{"type": "text", "text": "x" * system_chars, "cache_control": cc}]
    return body_for(*messages, system=system)


def test_cache_counts_add_up_and_respect_ttl() -> None:
    clock = Clock()
    cache = PromptCache(min_cacheable_tokens=100, clock=clock)
    first = cache.account(cached_body(800))
    assert (first.cache_creation_input_tokens, first.cache_read_input_tokens) == (200, 0)
    second = cache.account(cached_body(800))
    assert (second.cache_creation_input_tokens, second.cache_read_input_tokens) == (0, 200)
    assert second.input_tokens >= 1
    clock.now += 301  # past the 5 minute TTL
    third = cache.account(cached_body(800))
    assert (third.cache_creation_input_tokens, third.cache_read_input_tokens) == (200, 0)
    one_hour = cache.account(cached_body(900, ttl="1h"))
    assert one_hour.creation_ttl == "1h"
    clock.now += 1800
    assert cache.account(cached_body(900, ttl="1h")).cache_read_input_tokens == 225


def test_cache_below_minimum_and_per_model() -> None:
    cache = PromptCache(min_cacheable_tokens=1024)
    for _ in range(2):
        usage = cache.account(cached_body(400))
        assert usage.cache_creation_input_tokens == usage.cache_read_input_tokens == 0
    big = cached_body(8000)
    cache.account(big)
    assert cache.account(big).cache_read_input_tokens == 2000
    assert cache.account({**big, "model": "other-model"}).cache_read_input_tokens == 0


def test_cache_looks_back_from_a_moved_breakpoint() -> None:
    cache = PromptCache(min_cacheable_tokens=10)
    cc = {"type": "ephemeral"}
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": "m" * 40} for i in range(6)]

    def body(n: int) -> dict[str, Any]:
        msgs: list[dict[str, Any]] = [dict(m) for m in turns[:n]]
        msgs[-1] = {
            **msgs[-1],
            "content": [{"type": "text", "text": "m" * 40, "cache_control": cc}],
        }
        return body_for(*msgs)

    first = cache.account(body(3))
    assert first.cache_creation_input_tokens > 0
    later = cache.account(body(5))
    assert later.cache_read_input_tokens == first.cache_creation_input_tokens
    assert later.cache_creation_input_tokens > 0


async def test_cache_usage_reaches_the_sdk() -> None:
    async with FakeAnthropic([{"text": "a"}], min_cacheable_tokens=100) as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url)
        usages = []
        for _ in range(2):
            msg = await client.messages.create(**cached_body(1000))
            usages.append(msg.usage)
        await client.close()
    assert usages[0].cache_creation_input_tokens == 250 and usages[0].cache_read_input_tokens == 0
    assert usages[1].cache_read_input_tokens == 250 and usages[1].cache_creation_input_tokens == 0


# -- token counting and the context window ------------------------------------------------


def test_token_counting_is_documented_and_stable() -> None:
    """ceil(chars / 4) per block, plus 4 per message and 4 per tool definition."""
    assert count_tokens(body_for({"role": "user", "content": "x" * 400})) == 100 + 4
    assert count_tokens(body_for({"role": "user", "content": "x" * 401})) == 101 + 4
    tool = {"name": "t", "description": "d", "input_schema": {"type": "object"}}
    raw = json.dumps(tool, sort_keys=True, separators=(",", ":"))
    convo = [
        {"role": "user", "content": [{"type": "text", "text": "abcd"}]},
        {"role": "assistant", "content": [tool_use("toolu_1")]},
        {"role": "user", "content": [{**tool_result("toolu_1"), "content": "r" * 8}]},
    ]
    body = body_for(*convo, system="s" * 12, tools=[tool])
    use_chars = len("calc{}")
    expected = (
        (-(-len(raw) // 4) + TOOL_OVERHEAD_TOKENS)
        + 3  # system
        + (1 + MESSAGE_OVERHEAD_TOKENS)
        + (-(-use_chars // 4) + MESSAGE_OVERHEAD_TOKENS)
        + (2 + MESSAGE_OVERHEAD_TOKENS)
    )
    assert count_tokens(body) == expected
    assert count_tokens(json.loads(json.dumps(body))) == expected  # same bytes, same count


async def test_count_tokens_through_the_sdk_matches_the_usage_reported() -> None:
    system = "a system prompt " * 50
    messages: Any = [{"role": "user", "content": "count me " * 100}]
    async with FakeAnthropic([{"text": "ok"}]) as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url)
        counted = await client.messages.count_tokens(model=MODEL, messages=messages, system=system)
        msg = await client.messages.create(
            model=MODEL, max_tokens=10, messages=messages, system=system
        )
        await client.close()
    expected = count_tokens(body_for(*messages, system=system))
    assert counted.input_tokens == expected
    u = msg.usage
    used = u.input_tokens + (u.cache_read_input_tokens or 0)
    assert used + (u.cache_creation_input_tokens or 0) == expected
    assert [r.path for r in fake.requests] == ["/v1/messages/count_tokens", "/v1/messages"]
    assert [r.input_tokens for r in fake.requests] == [expected, expected]


async def test_an_oversized_request_gets_the_apis_400_through_the_sdk() -> None:
    small, big = "small-window-model", "big-window-model"
    messages: Any = [{"role": "user", "content": "y" * 4000}]  # 1004 tokens
    windows = {small: 1000, big: 5000}
    async with FakeAnthropic([{"text": "ok"}], context_windows=windows) as fake:
        client = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as err:
            await client.messages.create(model=small, max_tokens=10, messages=messages)
        ok = await client.messages.create(model=big, max_tokens=10, messages=messages)
        # counting is allowed past the window, as in the API
        counted = await client.messages.count_tokens(model=small, messages=messages)
        await client.close()
    assert err.value.status_code == 400
    body: Any = err.value.body
    assert body["error"] == {
        "type": "invalid_request_error",
        "message": "prompt is too long: 1004 tokens > 1000 maximum",
    }
    assert ok.content[0].type == "text" and counted.input_tokens == 1004
    assert fake.window_of(small) == 1000 and fake.window_of("any-other") == 200_000


# -- CLI -----------------------------------------------------------------------------------

CLI = [sys.executable, "-m", "hango_worker.testing.fake_anthropic"]


def test_cli_serves_a_script_until_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "from the CLI"}]))
    proc = subprocess.Popen(
        [*CLI, "--port", "0", "--script", str(script), "--context-window", "100"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        fake = FakeAnthropic([{"text": "unused"}], port=port)  # only for `post`'s port
        status, _, data = post(fake, body_for())
        assert status == 200 and json.loads(data)["content"][0]["text"] == "from the CLI"
        status, _, data = post(fake, body_for({"role": "user", "content": "z" * 400}))
        assert (status, error_of(data)["message"]) == (
            400,
            "prompt is too long: 104 tokens > 100 maximum",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert code == 0


def test_cli_refuses_a_bad_script(tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text("{not json")
    out = subprocess.run(
        [*CLI, "--port", "0", "--script", str(script)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "not JSON" in out.stderr


async def test_serve_script_runs_on_the_current_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hango_worker.testing.fake_anthropic import serve_script

    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "in-loop"}]))
    task = asyncio.create_task(serve_script(0, script))
    for _ in range(100):
        await asyncio.sleep(0.01)
        out = capsys.readouterr().out
        if "listening on" in out:
            break
    base_url = out.split("listening on ")[1].split()[0]
    client = anthropic.AsyncAnthropic(api_key=KEY, base_url=base_url, max_retries=0)
    msg = await client.messages.create(
        model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )
    await client.close()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert msg.content[0].type == "text" and msg.content[0].text == "in-loop"
