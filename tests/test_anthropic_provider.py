"""AnthropicProvider through the real `anthropic` SDK against FakeAnthropic on 127.0.0.1.

Contract tests run the same scripts through ScriptedProvider and through
AnthropicProvider → FakeAnthropic and compare what comes out (responses and
whole agent-loop transcripts); fault tests drive every failure the fake can
inject through the SDK's retries and our error mapping. Nothing here leaves
the machine.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import pytest

from hango_worker.agent.chain import Chain
from hango_worker.agent.control import RunControl
from hango_worker.agent.loop import AgentLoop, LoopSettings
from hango_worker.agent.ports import Event, Outcome
from hango_worker.agent.spec import AgentSpec
from hango_worker.agent.state import State
from hango_worker.provider.anthropic import (
    AnthropicProvider,
    MissingCredentialsError,
    message_dicts,
    request_params,
)
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import (
    Message,
    ModelError,
    Provider,
    Request,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.testing.network import require_loopback_anthropic
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import ToolResult

KEY = "sk-ant-test-0123456789-SECRET"
MODEL = "claude-test-model"


def test_anthropic_base_url_is_loopback_if_set() -> None:
    require_loopback_anthropic()


# -- fixtures / helpers ----------------------------------------------------------------------


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    """A fake whose script each test sets with `use`."""
    with FakeAnthropic([{"text": "unused"}]) as server:
        yield server


@pytest.fixture
async def provider(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key=KEY, base_url=fake.base_url)
    yield p
    await p.aclose()


def use(fake: FakeAnthropic, script: list[dict[str, Any]]) -> None:
    fake.load(script)


def user(text: str) -> Message:
    return Message("user", [TextBlock(text)])


def request(*messages: Message, **kw: Any) -> Request:
    return Request(model=MODEL, messages=list(messages) or [user("hi")], **kw)


CALC_SPEC = ToolSpec(
    "calculator",
    "Evaluates arithmetic.",
    {"type": "object", "properties": {"expression": {"type": "string"}}},
)


# -- the request we send -----------------------------------------------------------------


def test_request_params_map_every_field() -> None:
    req = Request(
        model=MODEL,
        messages=[user("hi")],
        system=[TextBlock("sys", cache_control={"type": "ephemeral"}), TextBlock("more")],
        tools=[CALC_SPEC],
        max_tokens=123,
        tool_choice={"type": "auto"},
        temperature=0.2,
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    p = request_params(req)
    assert p["system"] == [
        {"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "more"},
    ]
    assert p["tools"] == [CALC_SPEC.to_dict()]
    assert p["tool_choice"] == {"type": "auto"}
    assert p["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert p["extra_body"] == {"temperature": 0.2}
    assert p["max_tokens"] == 123
    assert "system" not in request_params(request())


def test_tool_results_are_moved_first_in_a_user_message() -> None:
    msgs = [
        user("go"),
        Message("assistant", [ToolUseBlock("toolu_1", "calculator", {"expression": "1"})]),
        Message("user", [TextBlock("note"), ToolResultBlock("toolu_1", "1")]),
    ]
    out = message_dicts(msgs)
    assert [b["type"] for b in out[2]["content"]] == ["tool_result", "text"]
    assert out[0] == msgs[0].to_dict()


async def test_sends_everything_the_request_says(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(fake, [{"text": "ok"}])
    req = request(
        system=[TextBlock("You are terse.", cache_control={"type": "ephemeral"})],
        tools=[CALC_SPEC],
        tool_choice={"type": "any"},
        temperature=0.5,
    )
    await provider.complete(req)
    body = fake.requests[-1].body
    assert body["stream"] is True
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert body["tools"][0]["name"] == "calculator"
    assert body["tool_choice"] == {"type": "any"}
    assert body["temperature"] == 0.5
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


async def test_sdk_sends_authorization_bearer_and_it_is_accepted(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(fake, [{"text": "ok"}])
    resp = await provider.complete(request())
    headers = fake.requests[-1].headers
    assert headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in headers
    assert resp.message.text() == "ok"


async def test_the_sdk_span_is_off_by_default(fake: FakeAnthropic) -> None:
    p = AnthropicProvider(api_key=KEY, base_url=fake.base_url)
    assert p.client.open_telemetry["traces"]["enabled"] is False
    own = anthropic.AsyncAnthropic(api_key=KEY, base_url=fake.base_url, open_telemetry={})
    assert own.open_telemetry["traces"]["enabled"] is True
    wrapped = AnthropicProvider(own)
    assert wrapped.client.open_telemetry["traces"]["enabled"] is False
    kept = AnthropicProvider(own, open_telemetry=True)
    assert kept.client is own
    for c in (p, wrapped):
        await c.aclose()


def test_no_key_stops_at_construction(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for var in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("ANTHROPIC_CONFIG_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no SDK profile on disk either
    with pytest.raises(MissingCredentialsError, match="ANTHROPIC_API_KEY"):
        AnthropicProvider(base_url="http://127.0.0.1:9")


# -- contract: scripted model vs AnthropicProvider → FakeAnthropic --------------------------

SCENARIOS: dict[str, list[dict[str, Any]]] = {
    "text answer": [{"text": "Hello there, how can I help?"}],
    "parallel tool calls": [
        {
            "text": "Let me compute both.",
            "tool_calls": [
                {"name": "calculator", "input": {"expression": "2 + 2"}},
                {"name": "calculator", "input": {"expression": "3 * 3"}},
            ],
        },
        {"text": "2 + 2 = 4 and 3 * 3 = 9."},
    ],
    "thinking block": [
        {
            "thinking": "The user wants a sum; use the calculator.",
            "text": "Computing.",
            "tool_calls": [{"name": "calculator", "input": {"expression": "40 + 2"}}],
        },
        {"thinking": "The tool said 42.", "text": "The answer is 42."},
    ],
    "pause_turn then end_turn": [
        {"text": "Working on it", "stop_reason": "pause_turn"},
        {"text": "Finished."},
    ],
}
for _reason in StopReason:
    if _reason is not StopReason.PAUSE_TURN:
        SCENARIOS[f"stop {_reason.value}"] = [{"text": "Stopping here.", "stop_reason": _reason}]


class MemoryIO:
    """RunIO in memory: keeps what the loop would have committed."""

    def __init__(self) -> None:
        self.control = RunControl(retry_base_s=0.01, retry_cap_s=0.05)
        self.messages: list[Message] = []
        self.events: list[Event] = []
        self.outcome: Outcome | None = None

    async def checkpoint(
        self,
        state: State,
        new: list[Message],
        events: list[Event],
        outcome: Outcome | None,
        usage: Any = None,
        states: Any = None,
    ) -> None:
        self.messages.extend(new)
        self.events.extend(events)
        self.outcome = outcome or self.outcome

    async def record_tool_result(
        self, state: State, call: ToolUseBlock, result: ToolResult, event: Event
    ) -> None:
        self.events.append(event)


async def run_loop(provider: Provider, prompt: str = "What is the answer?") -> MemoryIO:
    agent = AgentSpec(
        id="a1", name="contract", model=MODEL, system=["Be brief."], tools=["calculator"]
    )
    state = State(run_id="r1", session_id="s1", agent_id="a1", tenant_id="t1")
    state.messages.append(user(prompt))
    io = MemoryIO()
    settings = LoopSettings(max_turns=6)
    view = Registry.default(load_entry_points=False).view(agent.tools)
    loop = AgentLoop(agent, Chain([]), view, provider, io, settings)
    io.outcome = await loop.run(state)
    return io


def transcript(io: MemoryIO) -> dict[str, Any]:
    assert io.outcome is not None
    return {
        "messages": [m.to_dict() for m in io.messages],
        "stop_reasons": [e.payload["stop_reason"] for e in io.events if e.type == "model_message"],
        "status": io.outcome.status,
        "error": io.outcome.error,
    }


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_contract_same_response_through_both_models(
    name: str, fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    script = SCENARIOS[name]
    use(fake, script)
    req = request(user("What is the answer?"), tools=[CALC_SPEC])
    scripted_deltas: list[str] = []
    wire_deltas: list[str] = []
    expected = await ScriptedProvider(script).complete(req, scripted_deltas.append)
    got = await provider.complete(req, wire_deltas.append)
    assert got.message == expected.message
    assert got.stop_reason == expected.stop_reason
    assert "".join(wire_deltas) == "".join(scripted_deltas) == expected.message.text()
    assert got.id.startswith("msg_") and got.model == MODEL
    assert got.time_to_first_chunk_s is not None and got.time_to_first_chunk_s > 0
    assert got.usage.input_tokens > 0 and got.usage.output_tokens > 0


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_contract_same_loop_transcript_through_both_models(
    name: str, fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    script = SCENARIOS[name]
    use(fake, script)
    expected = transcript(await run_loop(ScriptedProvider(script)))
    got = transcript(await run_loop(provider))
    assert got == expected
    assert len(fake.requests) == len(expected["stop_reasons"])


def test_contract_scenarios_cover_every_stop_reason() -> None:
    covered = {
        str(t.get("stop_reason") or ("tool_use" if t.get("tool_calls") else "end_turn"))
        for script in SCENARIOS.values()
        for t in script
    }
    assert covered == {s.value for s in StopReason}


async def test_thinking_signature_is_kept(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    use(fake, [{"thinking": "step one, step two", "text": "Done."}])
    resp = await provider.complete(request())
    block = resp.message.content[0]
    assert isinstance(block, ThinkingBlock)
    assert block == ThinkingBlock("step one, step two", "scripted-0")


async def test_max_tokens_mid_tool_json_gives_an_incomplete_call(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    long_expr = " + ".join(str(i) for i in range(40))
    use(
        fake,
        [
            {
                "text": "Adding.",
                "tool_calls": [
                    {"name": "calculator", "input": {"expression": "1"}},
                    {"name": "calculator", "input": {"expression": long_expr}},
                ],
                "stop_reason": "max_tokens",
            }
        ],
    )
    resp = await provider.complete(request())
    first, cut = resp.message.tool_uses()
    assert resp.stop_reason is StopReason.MAX_TOKENS
    assert first.complete and first.input == {"expression": "1"}
    assert not cut.complete and cut.input == {}


async def test_max_tokens_cut_call_is_not_executed_by_the_loop(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(
        fake,
        [
            {
                "tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7 * 100"}}],
                "stop_reason": "max_tokens",
            },
            {"text": "Sorry, done."},
        ],
    )
    io = await run_loop(provider)
    results = [e for e in io.events if e.type == "tool_result"]
    assert len(results) == 1 and results[0].payload["is_error"] is True
    assert "not executed" in results[0].payload["content"]
    assert io.outcome is not None and io.outcome.status == "succeeded"


async def test_on_text_gets_only_text_deltas(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(
        fake,
        [
            {
                "thinking": "hidden thoughts",
                "text": "one two three",
                "tool_calls": [{"name": "calculator", "input": {"expression": "1"}}],
            }
        ],
    )
    deltas: list[str] = []
    await provider.complete(request(), deltas.append)
    assert deltas == ["one", " two", " three"]


# -- prompt cache ------------------------------------------------------------------------


async def test_cache_creation_then_read(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    use(fake, [{"text": "ok"}, {"text": "ok again"}])
    system = [TextBlock("You are a careful assistant. " * 200, cache_control={"type": "ephemeral"})]
    first = await provider.complete(request(system=system))
    second = await provider.complete(request(system=system))
    assert first.usage.cache_creation_input_tokens > 1024
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    # the conversation grows and the breakpoint moves to its end: the old prefix is read
    history = [
        user("hi"),
        Message("assistant", [TextBlock("ok")]),
        Message("user", [TextBlock("more " * 50, cache_control={"type": "ephemeral"})]),
    ]
    third = await provider.complete(request(*history, system=system))
    assert third.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert third.usage.cache_creation_input_tokens > 0


async def test_short_prefix_is_not_cached(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    use(fake, [{"text": "ok"}])
    system = [TextBlock("Short.", cache_control={"type": "ephemeral"})]
    for _ in range(2):
        resp = await provider.complete(request(system=system))
        assert resp.usage.cache_creation_input_tokens == resp.usage.cache_read_input_tokens == 0


# -- faults ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        {"fault": "429", "retry_after": 0.01},
        {"fault": "529", "retry_after": 0.01},
        {"fault": "500", "retry_after": 0.01},
        {"fault": "529"},  # no retry-after: the SDK's own backoff
        {"fault": "drop"},
    ],
    ids=["429", "529", "500", "529-sdk-backoff", "dropped-connection"],
)
async def test_sdk_retries_transient_faults_and_succeeds(
    fault: dict[str, Any], fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(fake, [fault, {"text": "Recovered."}])
    resp = await provider.complete(request())
    assert resp.message.text() == "Recovered."
    assert len(fake.requests) == 2
    assert fake.requests[1].headers["x-stainless-retry-count"] == "1"


async def test_retries_exhausted_is_retryable_with_retry_after(fake: FakeAnthropic) -> None:
    use(fake, [{"fault": "429", "retry_after": 0.01, "times": 3}, {"text": "late"}])
    p = AnthropicProvider(api_key=KEY, base_url=fake.base_url, max_retries=1)
    with pytest.raises(ModelError) as info:
        await p.complete(request())
    await p.aclose()
    e = info.value
    assert (e.type, e.status, e.retryable, e.retry_after_s) == ("rate_limit_error", 429, True, 0.01)
    assert e.request_id is not None and e.request_id.startswith("req_fake_")
    assert len(fake.requests) == 2


async def test_loop_retries_after_sdk_gives_up_and_run_succeeds(fake: FakeAnthropic) -> None:
    use(fake, [{"fault": "529", "retry_after": 0.01, "times": 2}, {"text": "Finally."}])
    p = AnthropicProvider(api_key=KEY, base_url=fake.base_url, max_retries=0)
    io = await run_loop(p)
    await p.aclose()
    assert io.outcome is not None and io.outcome.status == "succeeded"
    assert len(fake.requests) == 3


async def test_midstream_overloaded_is_not_retried_by_sdk_but_retryable(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(fake, [{"fault": "midstream_overloaded"}, {"text": "Second try works."}])
    deltas: list[str] = []
    with pytest.raises(ModelError) as info:
        await provider.complete(request(), deltas.append)
    e = info.value
    assert (e.type, e.retryable, e.status) == ("overloaded_error", True, 200)
    assert e.message == "Overloaded"
    assert e.request_id is not None and e.request_id.startswith("req_fake_")
    assert deltas == ["Second"]  # the stream had started
    assert len(fake.requests) == 1  # the SDK did not retry
    resp = await provider.complete(request())
    assert resp.message.text() == "Second try works."


async def test_run_overloaded_midstream_finishes_after_our_retry(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(
        fake,
        [
            {"fault": "midstream_overloaded"},
            {
                "text": "Let me add.",
                "tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}],
            },
            {"fault": "midstream_overloaded", "times": 2},
            {"text": "It is 2."},
        ],
    )
    io = await run_loop(provider)
    assert io.outcome is not None and io.outcome.status == "succeeded", io.outcome
    assert io.messages[-1].text() == "It is 2."
    assert len(fake.requests) == 5


async def test_midstream_drop_is_retryable(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(fake, [{"fault": "midstream_drop"}, {"text": "ok"}])
    with pytest.raises(ModelError) as info:
        await provider.complete(request())
    assert info.value.retryable and info.value.type == "api_connection_error"


async def test_connection_refused_is_retryable() -> None:
    with FakeAnthropic([{"text": "x"}]) as gone:
        url = gone.base_url
    p = AnthropicProvider(api_key=KEY, base_url=url, max_retries=0)
    with pytest.raises(ModelError) as info:
        await p.complete(request())
    await p.aclose()
    assert info.value.retryable and info.value.type == "api_connection_error"


def assert_no_key(e: ModelError) -> None:
    for text in (str(e), repr(e), e.message, repr(e.to_dict()), repr(e.args)):
        assert KEY not in text
    assert e.__cause__ is None and e.__suppress_context__


async def test_400_fails_fast_with_type_message_request_id(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    dangling = [
        user("hi"),
        Message("assistant", [ToolUseBlock("toolu_x", "calculator", {"expression": "1"})]),
        user("and?"),
    ]
    with pytest.raises(ModelError) as info:
        await provider.complete(request(*dangling))
    e = info.value
    assert (e.type, e.status, e.retryable) == ("invalid_request_error", 400, False)
    assert e.message.startswith("messages.1: `tool_use` ids were found without `tool_result`")
    assert e.request_id is not None and e.request_id.startswith("req_fake_")
    assert e.to_dict() == {
        "type": "invalid_request_error",
        "message": e.message,
        "status": 400,
        "request_id": e.request_id,
    }
    assert len(fake.requests) == 1
    assert_no_key(e)


async def test_401_fails_fast_and_never_shows_the_key() -> None:
    with FakeAnthropic([{"text": "x"}], api_key="the-right-key") as fake:
        p = AnthropicProvider(api_key=KEY, base_url=fake.base_url)
        with pytest.raises(ModelError) as info:
            await p.complete(request())
        await p.aclose()
    e = info.value
    assert (e.type, e.status, e.retryable) == ("authentication_error", 401, False)
    assert e.message == "invalid x-api-key"
    assert e.request_id is not None
    assert len(fake.requests) == 1
    assert_no_key(e)


@pytest.mark.parametrize(
    ("status", "etype"),
    [(403, "permission_error"), (404, "not_found_error"), (413, "request_too_large")],
)
async def test_other_client_errors_fail_fast(
    status: int, etype: str, fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    use(fake, [{"fault": str(status)}, {"text": "never"}])
    with pytest.raises(ModelError) as info:
        await provider.complete(request())
    assert (info.value.type, info.value.status, info.value.retryable) == (etype, status, False)
    assert len(fake.requests) == 1


async def test_a_key_echoed_by_the_server_is_redacted(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    fake.inject("400", message=f"bad header value {KEY}")
    with pytest.raises(ModelError) as info:
        await provider.complete(request())
    assert "[redacted]" in info.value.message
    assert_no_key(info.value)


async def test_loop_records_a_fatal_error(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    use(
        fake,
        [{"fault": "403", "message": "This organization cannot use this model."}, {"text": "x"}],
    )
    io = await run_loop(provider)
    assert io.outcome is not None and io.outcome.status == "failed"
    err = io.outcome.error
    assert err is not None
    assert err["type"] == "permission_error"
    assert err["message"] == "This organization cannot use this model."
    assert str(err["request_id"]).startswith("req_fake_")


async def test_slow_chunks_stream_live(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    use(fake, [{"text": "one two three four", "chunk_delay_s": 0.02}])
    stamps: list[float] = []
    started = time.perf_counter()
    resp = await provider.complete(request(), lambda _d: stamps.append(time.perf_counter()))
    assert len(stamps) == 4
    assert resp.time_to_first_chunk_s is not None and resp.time_to_first_chunk_s >= 0.02
    # the server sleeps before every frame: nothing can arrive sooner (lower bounds only)
    assert stamps[-1] - started >= 0.02 * 7  # message_start, ping, block start, 4 deltas


async def test_text_reaches_the_callback_while_the_stream_is_still_going(
    fake: FakeAnthropic, provider: AnthropicProvider
) -> None:
    """Deterministic: the server holds the stream after its first delta until the
    callback has seen that delta; a client that handed text over only at the end
    would never release it (and the hold would time out)."""
    use(fake, [{"text": "one two three four"}])
    hold = fake.hold_after_first_delta()
    seen: list[tuple[str, bool]] = []

    def on_text(delta: str) -> None:
        seen.append((delta, hold.is_set()))
        hold.set()

    resp = await asyncio.wait_for(provider.complete(request(), on_text), 20)
    assert seen[0] == ("one", False), "the first delta came only after the stream ended"
    assert "".join(d for d, _ in seen) == resp.message.text() == "one two three four"


# -- overhead ----------------------------------------------------------------------------


async def test_per_call_overhead_median(fake: FakeAnthropic, provider: AnthropicProvider) -> None:
    """Not a timing assertion: prints the median wall time of one complete() on loopback."""
    use(fake, [{"text": "Hello there, this is a short answer."}])
    req = request(system=[TextBlock("Be brief.")], tools=[CALC_SPEC])
    for _ in range(10):  # warm-up: connection, imports, pydantic caches
        await provider.complete(req)
    samples = []
    for _ in range(200):
        t0 = time.perf_counter()
        resp = await provider.complete(req)
        samples.append(time.perf_counter() - t0)
    assert resp.message.text() == "Hello there, this is a short answer."
    median_ms = statistics.median(samples) * 1000
    p90_ms = statistics.quantiles(samples, n=10)[-1] * 1000
    print(
        f"\nAnthropicProvider.complete() via SDK → FakeAnthropic (loopback, streaming): "
        f"median {median_ms:.2f} ms, p90 {p90_ms:.2f} ms over {len(samples)} calls"
    )
