"""The anthropic SDK's own retries are counted (hango_model_sdk_retries_total, by the
failed attempt's error type; provider/sdk_retries.py): the real SDK against the fake
Anthropic server, the counter read back from the registry."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.types import Message, Request, TextBlock
from hango_worker.testing.fake_anthropic import FakeAnthropic

KEY = "sk-ant-test-sdk-retries"


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic([{"text": "unused"}]) as server:
        yield server


def sdk_retries() -> dict[str, float]:
    out = {}
    for family in REGISTRY.collect():
        if family.name == "hango_model_sdk_retries":
            for s in family.samples:
                if s.name.endswith("_total"):
                    out[s.labels["error_type"]] = s.value
    return out


def grew(before: dict[str, float]) -> dict[str, float]:
    after = sdk_retries()
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


async def complete(fake: FakeAnthropic, script: list[dict[str, Any]], retries: int) -> str:
    fake.load(script)
    p = AnthropicProvider(api_key=KEY, base_url=fake.base_url, max_retries=retries)
    try:
        req = Request(model="claude-test", messages=[Message("user", [TextBlock("hi")])])
        return (await p.complete(req)).message.text()
    finally:
        await p.aclose()


async def test_every_label_exists_from_the_start() -> None:
    assert {"rate_limit_error", "overloaded_error", "api_error", "api_connection_error"} <= set(
        sdk_retries()
    )


@pytest.mark.parametrize(
    ("fault", "label"),
    [
        ({"fault": "429", "retry_after": 0.01, "times": 2}, "rate_limit_error"),
        ({"fault": "529", "retry_after": 0.01, "times": 2}, "overloaded_error"),
        ({"fault": "500", "retry_after": 0.01, "times": 2}, "api_error"),
    ],
)
async def test_the_sdk_retries_are_counted_by_error_type(
    fake: FakeAnthropic, fault: dict[str, Any], label: str
) -> None:
    before = sdk_retries()
    assert await complete(fake, [fault, {"text": "Recovered."}], retries=2) == "Recovered."
    assert len(fake.requests) == 3
    assert grew(before) == {label: 2.0}


async def test_a_call_that_needs_no_retry_counts_nothing(fake: FakeAnthropic) -> None:
    before = sdk_retries()
    assert await complete(fake, [{"text": "First time."}], retries=2) == "First time."
    assert grew(before) == {}


async def test_a_dropped_connection_retried_counts_as_a_connection_error(
    fake: FakeAnthropic,
) -> None:
    before = sdk_retries()
    assert await complete(fake, [{"fault": "drop"}, {"text": "Back."}], retries=2) == "Back."
    assert grew(before) == {"api_connection_error": 1.0}
