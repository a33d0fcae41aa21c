"""Claude on Bedrock and Vertex AI (provider/platforms.py): a worker's runs through the
SDK's own platform clients (`AsyncAnthropicBedrock`, `AsyncAnthropicVertex`) with dummy
credentials, against the fake's platform routes (testing/fake_anthropic/platforms.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import asyncpg
import httpx2
import pytest

from hango_worker.agent.spec import AgentConfig
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.platforms import Target
from hango_worker.provider.types import Request
from hango_worker.run.ratelimit import RunRateGate
from hango_worker.testing import FakeAnthropic
from tests.conftest import SpanReader
from tests.helpers import call, recording_tool
from tests.test_anthropic_e2e import work
from tests.test_cli import cli
from tests.worker_helpers import details, enqueue, make_agent

SCRIPT: list[dict[str, Any]] = [
    {"text": "Echoing.", "tool_calls": [call("echo", text="hi")]},
    {"text": "Done: hi.", "usage": {"output_tokens": 7}},
]
VERTEX = {
    "platform": "vertex",
    "region": "us-east5",
    "project_id": "proj-1",
    "models": {"vertex": "claude-test@20250101", "bedrock": "anthropic.claude-test-v1:0"},
}
BEDROCK = {**VERTEX, "platform": "bedrock", "region": "eu-west-1"}
PRICES = {
    "claude-test": dict.fromkeys(
        ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read"), 1.0
    ),
    "bedrock/claude-test": dict.fromkeys(
        ("input", "output", "cache_write_5m", "cache_write_1h", "cache_read"), 2.0
    ),
}


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(SCRIPT) as server:
        yield server


@pytest.fixture(autouse=True)
def dummy_aws(monkeypatch: pytest.MonkeyPatch) -> None:
    """AWS's standard chain finds these (no profile, no instance metadata)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFAKEFAKEFAKE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fake-secret")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_BEARER_TOKEN_BEDROCK", raising=False)


def provider(fake: FakeAnthropic) -> AnthropicProvider:
    return AnthropicProvider(
        api_key="unused",
        base_url=fake.base_url,
        max_retries=0,
        platform_options={
            "vertex": {"access_token": "dummy-token", "base_url": f"{fake.base_url}/v1"},
            "bedrock": {"base_url": fake.base_url},
        },
    )


async def run_on(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, config: dict[str, Any], **over: Any
) -> Any:
    tool, calls = recording_tool()
    await make_agent(pool, config=config)
    run_id = await enqueue(pool, "say hi")
    built = provider(fake)
    try:
        await work(dsn, built, tools=(tool,), **over)
    finally:
        await built.aclose()
    assert calls == [{"text": "hi"}]
    return await details(pool, run_id)


async def test_a_run_on_vertex_through_the_sdk_vertex_client(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, spans: SpanReader
) -> None:
    run = await run_on(pool, dsn, fake, VERTEX)
    assert run["status"] == "succeeded", run["error"]
    assert run["transcript"][-1]["content"][0]["text"] == "Done: hi."
    paths = [r.path for r in fake.requests]
    assert (
        paths
        == [
            "/v1/projects/proj-1/locations/us-east5/publishers/anthropic/models/"
            "claude-test@20250101:streamRawPredict"
        ]
        * 2
    )
    first = fake.requests[0]
    assert first.platform == "vertex"
    assert first.headers["authorization"] == "Bearer dummy-token"
    assert first.body["model"] == "claude-test@20250101"  # from the path (the model map)
    assert run["usage"]["output_tokens"] > 0
    chats = spans.named("chat ")
    assert chats and {s.attributes["gen_ai.provider.name"] for s in chats} == {"gcp.vertex_ai"}
    assert {s.attributes["gen_ai.request.model"] for s in chats} == {"claude-test"}


async def test_a_run_on_bedrock_through_the_sdk_bedrock_client(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, spans: SpanReader
) -> None:
    run = await run_on(pool, dsn, fake, BEDROCK, model_prices=PRICES)
    assert run["status"] == "succeeded", run["error"]
    usage = run["usage"]
    per_token = 1e-6 * PRICES["bedrock/claude-test"]["input"]  # all five equal
    expected = per_token * (usage["input_tokens"] + usage["output_tokens"])
    assert usage["cost_usd"] == pytest.approx(expected)  # the platform's prices
    assert run["transcript"][-1]["content"][0]["text"] == "Done: hi."
    assert [r.path for r in fake.requests] == [
        "/model/anthropic.claude-test-v1:0/invoke-with-response-stream"
    ] * 2
    first = fake.requests[0]
    assert first.platform == "bedrock"
    assert first.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAFAKE")
    assert "eu-west-1/bedrock/aws4_request" in first.headers["authorization"]
    assert run["usage"]["output_tokens"] > 0
    chats = spans.named("chat ")
    assert chats and {s.attributes["gen_ai.provider.name"] for s in chats} == {"aws.bedrock"}


async def test_a_platform_client_is_built_once_per_platform_and_region(
    fake: FakeAnthropic,
) -> None:
    built = provider(fake)
    try:
        one = built.on_platform(Target("bedrock", "eu-west-1"))
        assert built.on_platform(Target("bedrock", "eu-west-1")) is one
        assert built.on_platform(Target("bedrock", "us-east-1")) is not one
        assert built.on_platform(Target("anthropic")) is built
    finally:
        await built.aclose()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"platform": "bedrock", "files_api": True},
            "files_api: the Files API is not available on bedrock",
        ),
        (
            {"platform": "vertex", "betas": ["files-api-2025-04-14"]},
            "betas: the beta 'files-api-2025-04-14' is not available on vertex",
        ),
        (
            {
                "platform": "bedrock",
                "server_tools": [{"type": "web_search_20250305", "name": "web_search"}],
            },
            "server_tools: the server tool 'web_search_20250305' is not available on bedrock",
        ),
    ],
)
def test_a_feature_the_platform_lacks_is_refused_in_one_line(
    config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as e:
        AgentConfig.model_validate(config)
    assert message in str(e.value)
    assert AgentConfig.model_validate({**config, "platform": "anthropic"})


def test_vertex_serves_web_search() -> None:
    tools = [{"type": "web_search_20250305", "name": "web_search"}]
    assert AgentConfig.model_validate({"platform": "vertex", "server_tools": tools})


def test_agents_create_refuses_a_feature_the_platform_lacks_in_one_line(dsn: str) -> None:
    config = '{"platform": "bedrock", "files_api": true}'
    p = cli(dsn, "agents", "create", "--name", "x", "--model", "m", "--config", config, ok=False)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "files_api: the Files API is not available on bedrock" in lines[0]


async def test_bedrock_invoke_and_a_midstream_error_through_the_sdk(fake: FakeAnthropic) -> None:
    client = anthropic.AsyncAnthropicBedrock(
        aws_region="us-east-1", base_url=fake.base_url, max_retries=0
    )
    try:
        message = await client.messages.create(
            model="anthropic.claude-test-v1:0",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
        )
        assert message.content[0].type == "text" and message.content[0].text == "Echoing."
        assert fake.requests[-1].path == "/model/anthropic.claude-test-v1:0/invoke"
        fake.inject("midstream_overloaded")
        with pytest.raises(anthropic.APIStatusError) as e:
            stream = await client.messages.create(
                model="anthropic.claude-test-v1:0",
                max_tokens=100,
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
            )
            async for _ in stream:
                pass
        assert "overloaded_error" in str(e.value.body)
    finally:
        await client.close()


async def test_vertex_raw_predict_and_a_missing_version(fake: FakeAnthropic) -> None:
    client = anthropic.AsyncAnthropicVertex(
        region="us-east5",
        project_id="p",
        access_token="dummy",
        base_url=f"{fake.base_url}/v1",
        max_retries=0,
    )
    try:
        message = await client.messages.create(
            model="claude-test@20250101",
            max_tokens=100,
            messages=[{"role": "user", "content": "hi"}],
        )
        assert message.content[0].type == "text" and message.content[0].text == "Echoing."
        assert fake.requests[-1].path.endswith("/models/claude-test@20250101:rawPredict")
        assert fake.requests[-1].body["model"] == "claude-test@20250101"
    finally:
        await client.close()
    path = "/v1/projects/p/locations/r/publishers/anthropic/models/m:rawPredict"
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx2.AsyncClient(base_url=fake.base_url) as http:
        refused = await http.post(path, json=body, headers={"authorization": "Bearer t"})
        anonymous = await http.post(path, json={**body, "anthropic_version": "vertex-2023-10-16"})
    assert refused.status_code == 400 and "anthropic_version" in refused.text
    assert anonymous.status_code == 401


def test_agents_create_checks_the_fleet_platform_for_an_agent_without_one(dsn: str) -> None:
    config = '{"files_api": true}'
    args = ("agents", "create", "--name", "x", "--model", "m", "--config", config)
    p = cli(dsn, *args, ok=False, env={"HANGO_PLATFORM": "vertex"})
    assert p.returncode == 2, p.stderr
    assert "files_api: the Files API is not available on vertex (the fleet's HANGO_PLATFORM)" in (
        p.stderr
    )
    assert len(p.stderr.strip().splitlines()) == 1


def test_the_rate_limit_bucket_is_per_platform_and_region() -> None:
    gate = RunRateGate(pool=None, key_template="anthropic:{model}")  # type: ignore[arg-type]
    request = Request(model="claude-test", messages=[], max_tokens=10)
    assert gate.key(request) == "anthropic:claude-test"
    gate.place = "@bedrock:eu-west-1"
    assert gate.key(request) == "anthropic:claude-test@bedrock:eu-west-1"


async def test_the_fleet_default_platform_from_the_environment(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an operator (or a user's test) sets it: no Anthropic key, the SDK's own base URL
    variable, the agent without a platform of its own."""
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("HANGO_MODEL_PROVIDER", "auto")
    monkeypatch.setenv("HANGO_PLATFORM", "bedrock")
    monkeypatch.setenv("HANGO_PLATFORM_REGION", "us-west-2")
    monkeypatch.setenv("ANTHROPIC_BEDROCK_BASE_URL", fake.base_url)
    tool, calls = recording_tool()
    await make_agent(pool)
    run_id = await enqueue(pool, "say hi")
    await work(dsn, tools=(tool,))
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    assert calls == [{"text": "hi"}]
    assert fake.requests[0].path == "/model/claude-test/invoke-with-response-stream"
    assert "us-west-2/bedrock/aws4_request" in fake.requests[0].headers["authorization"]
