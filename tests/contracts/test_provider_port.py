"""Contract suite of the Provider port (provider/types.py): every test runs against each
implementation — ScriptedProvider, and the real AnthropicProvider through the SDK
against the fake Anthropic server (testing/fake_anthropic) — with the same script, and
asserts the same `Response`: its message's blocks (thinking, text, tool calls with their
ids and arguments), stop reason, usage, streamed text, and the `ModelError`s.

(tests/test_anthropic_provider.py compares the two with each other, scenario by
scenario and over whole agent loops; this suite holds each to the port.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import (
    Message,
    ModelError,
    Provider,
    RawBlock,
    Request,
    Response,
    StopReason,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
)
from hango_worker.testing.fake_anthropic import FakeAnthropic

MODEL = "claude-test-model"
Script = list[dict[str, Any]]
Models = Callable[[Script], Provider]

CALC = ToolSpec(
    "calculator",
    "Evaluates arithmetic.",
    {"type": "object", "properties": {"expression": {"type": "string"}}},
)


@pytest.fixture(params=["scripted", "anthropic"])
async def models(request: pytest.FixtureRequest) -> AsyncIterator[Models]:
    """`models(script)`: the implementation answering with that script."""
    if request.param == "scripted":
        yield ScriptedProvider
        return
    fake: FakeAnthropic = request.getfixturevalue("fake")
    # no SDK retries: an error reaches the port as the server sent it
    provider = AnthropicProvider(api_key="sk-ant-test", base_url=fake.base_url, max_retries=0)

    def use(script: Script) -> Provider:
        fake.load(script)
        return provider

    yield use
    await provider.aclose()


@pytest.fixture
def fake() -> Any:
    with FakeAnthropic([{"text": "unused"}]) as server:
        yield server


def user(text: str = "What is the answer?") -> Message:
    return Message("user", [TextBlock(text)])


def request(*messages: Message, **kw: Any) -> Request:
    return Request(model=MODEL, messages=list(messages) or [user()], tools=[CALC], **kw)


async def answer(provider: Provider, req: Request | None = None) -> tuple[Response, str]:
    """The response, and the text handed to `on_text` while it streamed."""
    deltas: list[str] = []
    resp = await provider.complete(req or request(), deltas.append)
    return resp, "".join(deltas)


def calc(expression: str, tid: str) -> ToolUseBlock:
    return ToolUseBlock(tid, "calculator", {"expression": expression})


async def test_a_text_answer(models: Models) -> None:
    resp, streamed = await answer(models([{"text": "Hello there, how can I help?"}]))
    assert resp.message == Message("assistant", [TextBlock("Hello there, how can I help?")])
    assert resp.stop_reason is StopReason.END_TURN
    assert streamed == "Hello there, how can I help?"
    assert resp.id and resp.model == MODEL
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens > 0


async def test_tool_calls_with_their_ids_and_arguments(models: Models) -> None:
    turn = {
        "text": "Let me compute both.",
        "tool_calls": [
            {"name": "calculator", "input": {"expression": "2 + 2"}},
            {"name": "calculator", "input": {"expression": "3 * 3"}, "id": "toolu_mine"},
        ],
    }
    resp, streamed = await answer(models([turn]))
    assert resp.message.content == [
        TextBlock("Let me compute both."),
        calc("2 + 2", "toolu_s0000_0"),
        calc("3 * 3", "toolu_mine"),
    ]
    assert resp.stop_reason is StopReason.TOOL_USE
    assert streamed == "Let me compute both."  # tool arguments are not text


async def test_arguments_that_are_not_an_object_are_flagged(models: Models) -> None:
    resp, _ = await answer(models([{"tool_calls": [{"name": "calculator", "input": [1, 2]}]}]))
    (block,) = resp.message.content
    assert isinstance(block, ToolUseBlock)
    assert (block.id, block.name, block.input) == ("toolu_s0000_0", "calculator", {})
    assert block.input_error == "arguments must be a JSON object, got array"


async def test_the_turn_played_follows_the_history(models: Models) -> None:
    """Turn N answers a history holding N assistant messages, so a resumed run gets the
    answer (and tool_use ids) the crashed attempt got."""
    provider = models(
        [
            {"tool_calls": [{"name": "calculator", "input": {"expression": "40 + 2"}}]},
            {"text": "It is 42.", "tool_calls": [{"name": "calculator", "input": {}}]},
        ]
    )
    first, _ = await answer(provider)
    assert first.message.content == [calc("40 + 2", "toolu_s0000_0")]
    result = Message("user", [ToolResultBlock("toolu_s0000_0", "42")])
    again, _ = await answer(provider)  # the same history: the same answer
    assert again.message == first.message
    second, streamed = await answer(provider, request(user(), first.message, result))
    assert second.message.content == [
        TextBlock("It is 42."),
        ToolUseBlock("toolu_s0001_0", "calculator", {}),
    ]
    assert streamed == "It is 42."


async def test_a_thinking_block_comes_first_with_its_signature(models: Models) -> None:
    resp, streamed = await answer(models([{"thinking": "Add them.", "text": "Done."}]))
    assert resp.message.content == [ThinkingBlock("Add them.", "scripted-0"), TextBlock("Done.")]
    assert streamed == "Done."  # thinking is not streamed as text


async def test_other_blocks_are_kept_as_they_came(models: Models) -> None:
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    turn = {"blocks": [redacted], "text": "Answer."}
    resp, _ = await answer(models([turn]))
    first, text = resp.message.content
    assert first == RawBlock(redacted)
    assert text == TextBlock("Answer.")


USAGE = {
    "input_tokens": 1234,
    "output_tokens": 56,
    "cache_read_input_tokens": 700,
    "cache_creation_input_tokens": 300,
    "output_tokens_details": {"thinking_tokens": 20},
    "server_tool_use": {"web_search_requests": 2},
}


async def test_usage_is_the_apis(models: Models) -> None:
    resp, _ = await answer(models([{"text": "Counted.", "usage": USAGE}]))
    u = resp.usage
    counts = (u.input_tokens, u.output_tokens, u.cache_read_input_tokens)
    assert counts == (1234, 56, 700)
    assert (u.cache_creation_input_tokens, u.thinking_tokens) == (300, 20)
    assert u.server_tool_use == {"web_search_requests": 2}


STOPS = [s for s in StopReason if s not in (StopReason.TOOL_USE, StopReason.END_TURN)]


@pytest.mark.parametrize("stop", STOPS, ids=[s.value for s in STOPS])
async def test_every_stop_reason_comes_through(models: Models, stop: StopReason) -> None:
    resp, _ = await answer(models([{"text": "Stopping here.", "stop_reason": stop.value}]))
    assert resp.stop_reason is stop
    assert resp.message.content == [TextBlock("Stopping here.")]


async def test_a_refusal_carries_its_stop_details(models: Models) -> None:
    details = {"type": "refusal", "category": "cyber", "explanation": "Not this."}
    turn = {"text": "I can't help.", "stop_reason": "refusal", "stop_details": details}
    resp, _ = await answer(models([turn]))
    assert resp.stop_reason is StopReason.REFUSAL
    assert resp.stop_details == details


async def test_tool_choice_none_answers_in_text_only(models: Models) -> None:
    turn = {"text": "Here.", "tool_calls": [{"name": "calculator", "input": {}}]}
    resp, _ = await answer(models([turn]), request(tool_choice={"type": "none"}))
    assert resp.message.content == [TextBlock("Here.")]
    assert resp.stop_reason is StopReason.END_TURN


@pytest.mark.parametrize(
    ("etype", "retryable"), [("overloaded_error", True), ("invalid_request_error", False)]
)
async def test_a_failed_call_is_a_model_error_then_the_turn_answers(
    models: Models, etype: str, retryable: bool
) -> None:
    error = {"type": etype, "message": "scripted failure here", "retryable": retryable}
    provider = models([{"text": "Recovered.", "error": error}])
    with pytest.raises(ModelError) as e:
        await provider.complete(request())
    assert (e.value.type, e.value.message, e.value.retryable) == (
        etype,
        "scripted failure here",
        retryable,
    )
    resp, _ = await answer(provider)  # `times` 1: the next attempt answers
    assert resp.message == Message("assistant", [TextBlock("Recovered.")])


async def test_a_request_past_the_script_is_an_error_not_retried(models: Models) -> None:
    provider = models([{"text": "Only one."}])
    first, _ = await answer(provider)
    history = request(user(), first.message, user("And then?"))
    with pytest.raises(ModelError) as e:
        await provider.complete(history)
    assert not e.value.retryable
