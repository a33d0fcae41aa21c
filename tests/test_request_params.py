"""Per-agent Messages API parameters (provider/params.py): every parameter the installed
SDK knows is accepted in the agent config, checked by the SDK's own types, refused in
the combinations the API refuses with one line naming both keys, and sent with every
model call, through the beta endpoint when a beta parameter asks for it."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from anthropic.types import message_create_params
from pydantic import ValidationError

from hango_worker.agent.spec import AgentConfig
from hango_worker.provider import params as api
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.testing.fake_anthropic import FakeAnthropic
from tests.helpers import call, recording_tool
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

WEB_SEARCH = {
    "type": "web_search_20250305",
    "name": "web_search",
    "max_uses": 3,
    "allowed_domains": ["example.com"],
}
PLAIN = {
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "stop_sequences": ["END"],
    "metadata": {"user_id": "tenant-42"},
    "service_tier": "standard_only",
    "output_config": {"effort": "high"},
}
BETA = {
    "betas": ["context-management-2025-06-27"],
    "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
}


def refusal(config: dict[str, Any]) -> str:
    with pytest.raises(ValidationError) as e:
        AgentConfig.model_validate(config)
    (err,) = e.value.errors()
    return str(err["msg"])


def test_the_parameters_are_the_sdks_own() -> None:
    sdk = set(typing.get_type_hints(message_create_params.MessageCreateParamsBase))
    assert sdk - api.OWNED == api.API_PARAMS
    assert {"thinking", "stop_sequences", "metadata", "service_tier"} <= api.API_PARAMS
    assert {"betas", "context_management", "mcp_servers"} <= api.BETA_PARAMS
    for owned in ("model", "messages", "tools", "max_tokens"):
        assert owned not in api.ALL_PARAMS


def test_valid_parameters_are_kept_and_dumped_at_the_top_level() -> None:
    cfg = AgentConfig.model_validate({**PLAIN, "server_tools": [WEB_SEARCH], "max_tokens": 8000})
    assert cfg.api_params() == PLAIN
    dumped = cfg.model_dump(exclude_none=True)
    assert {k: dumped[k] for k in PLAIN} == PLAIN and dumped["server_tools"] == [WEB_SEARCH]
    again = AgentConfig.model_validate(dumped)  # what agents.config holds reads back
    assert again.api_params() == PLAIN
    assert AgentConfig.model_validate(BETA).api_params() == BETA


@pytest.mark.parametrize(
    ("config", "line"),
    [
        ({"thinkng": {}}, "thinkng: Extra inputs are not permitted"),
        ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens: Field required"),
        ({"thinking": {"type": "sometimes"}}, "thinking.type: 'sometimes' is not one of"),
        ({"service_tier": "fast"}, "service_tier: Input should be 'auto' or 'standard_only'"),
        ({"stop_sequences": "END"}, "stop_sequences: 'str' instances are not allowed"),
        ({"metadata": {"user_id": 7}}, "metadata.user_id: Input should be a valid string"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}, "temperature": 0.2},
            "temperature (0.2) and thinking cannot be used together",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 4096}},
            "thinking.budget_tokens (4096) must be below max_tokens (4096)",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 100}, "max_tokens": 9000},
            "thinking.budget_tokens (100) must be at least 1024",
        ),
        ({"server_tools": [{"name": "mine"}]}, "server_tools.0: a server tool is an object"),
        (
            {"server_tools": [{**WEB_SEARCH, "max_uses": "many"}]},
            "server_tools.0.max_uses: Input should be a valid integer",
        ),
        ({"server_tools": [{"type": "teleport"}]}, "server_tools.0.type: 'teleport' is not one"),
    ],
)
def test_each_bad_parameter_is_one_line_naming_it(config: dict[str, Any], line: str) -> None:
    msg = refusal(config)
    assert line in msg and "\n" not in msg, msg


def test_agents_create_refuses_a_bad_combination_with_one_line() -> None:
    config = json.dumps(
        {"thinking": {"type": "enabled", "budget_tokens": 2048}, "temperature": 0.5}
    )
    args = ["agents", "create", "--name", "a", "--model", "m", "--config", config]
    p = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HANGO_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "PATH": ""},
    )
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "temperature (0.5) and thinking cannot be used together" in line


# -- every parameter reaches the request -------------------------------------------------

SCRIPT = [
    {"thinking": "Use the tool.", "tool_calls": [call("echo", text="x")]},
    {"thinking": "Done.", "text": "ok"},
]


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(SCRIPT) as f:
        yield f


@pytest.fixture
async def claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    yield p
    await p.aclose()


@pytest.mark.parametrize("extra", [PLAIN, {**PLAIN, **BETA}], ids=["plain", "beta"])
async def test_every_parameter_reaches_every_model_call(
    pool: asyncpg.Pool,
    dsn: str,
    fake: FakeAnthropic,
    claude: AnthropicProvider,
    extra: dict[str, Any],
) -> None:
    echo, _ = recording_tool()
    config = {**extra, "server_tools": [WEB_SEARCH], "max_tokens": 8000}
    await make_agent(pool, tools=["echo"], config=config)
    run_id = await enqueue(pool)
    await run_until_idle(dsn, claude, [echo])
    assert (await details(pool, run_id))["status"] == "succeeded"
    assert len(fake.requests) == 2
    for rec in fake.requests:
        body = rec.body
        for key, value in extra.items():
            if key != "betas":
                assert body[key] == value, key
        names = [t["name"] for t in body["tools"]]
        assert names == ["echo", "web_search"], "server tools after hango's own"
        assert body["tools"][1] == WEB_SEARCH
        beta = rec.headers.get("anthropic-beta", "")
        assert ("context-management-2025-06-27" in beta) == ("betas" in extra)
