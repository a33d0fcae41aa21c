"""A run's own Messages API parameters (enqueue-time overrides) and the per-tenant
`metadata.user_id`: given through the CLI (`enqueue --params`), the Python client and
the SQL API (`config => {"params": …}`), checked against the agent's config by the same
rules as `agents.config` (agent/spec.py with_params over provider/params.py), stored in
`runs.input.params`, sent with every model call of the run (across a wait and a fork),
shown by `runs show`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest

from hango_worker.client import Client
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.store import decisions, fork, repo
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.vocab import Decision
from tests.helpers import call
from tests.test_cli import cli
from tests.worker_helpers import details, make_agent, run_until_idle

T = repo.DEFAULT_TENANT_ID
THINK = {"thinking": {"type": "enabled", "budget_tokens": 2048}}
PARAMS = {**THINK, "metadata": {"user_id": "caller-7"}, "service_tier": "standard_only"}

SCRIPT = [
    {"thinking": "Ask.", "tool_calls": [call("ask_user", question="Which region?")]},
    {"thinking": "Done.", "text": "ok"},
    {"thinking": "Again.", "text": "again"},
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


async def runs(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM runs"))


async def test_run_params_reach_every_model_call_across_a_wait_and_a_fork(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider, spans: Any
) -> None:
    agent_config = {"max_tokens": 8000, "stop_sequences": ["END"], "service_tier": "auto"}
    await make_agent(pool, tools=["ask_user"], config=agent_config)
    r = await Client(pool).enqueue("agent", "go", params=PARAMS)
    assert (await details(pool, r.run_id))["input"]["params"] == PARAMS
    await run_until_idle(dsn, claude)
    assert (await details(pool, r.run_id))["status"] == "waiting"
    await decisions.decide(pool, T, r.run_id, Decision.ANSWER, text="eu-west-1")
    await run_until_idle(dsn, claude)  # a new attempt: the parameters from runs.input
    assert (await details(pool, r.run_id))["status"] == "succeeded"
    forked = await fork.fork(pool, T, r.run_id, 2, "once more")
    await run_until_idle(dsn, claude)
    assert (await details(pool, forked["run_id"]))["status"] == "succeeded"
    assert len(fake.requests) == 3
    for rec in fake.requests:
        body = rec.body
        assert body["thinking"] == THINK["thinking"]
        assert body["metadata"] == {"user_id": "caller-7"}  # the run's metadata wins
        assert body["service_tier"] == "standard_only"  # the run's value over the agent's
        assert body["stop_sequences"] == ["END"]  # the agent's, not overridden
    roots = [s for s in spans.named("invoke_agent") if s.attributes.get("hango.run.params")]
    assert len(roots) == 3
    assert list(roots[0].attributes["hango.run.params"]) == sorted(PARAMS)


def _input_text(body: dict[str, Any]) -> str:
    first = body["messages"][0]["content"]
    return str(first if isinstance(first, str) else first[0]["text"])


async def test_metadata_user_id_is_the_tenant_id_unless_the_agent_or_the_run_sets_one(
    pool: asyncpg.Pool, dsn: str
) -> None:
    with FakeAnthropic([{"text": "a"}, {"text": "b"}, {"text": "c"}]) as fake:
        claude = AnthropicProvider(api_key="k", base_url=fake.base_url, max_retries=0)
        try:
            await make_agent(pool, name="plain", tools=[])
            await make_agent(pool, name="named", tools=[], config={"metadata": {"user_id": "a-1"}})
            client = Client(pool)
            await client.enqueue("plain", "default")
            await client.enqueue("named", "agent's")
            await client.enqueue("plain", "run's", params={"metadata": {"user_id": "r-1"}})
            await run_until_idle(dsn, claude)
        finally:
            await claude.aclose()
    sent = {_input_text(rec.body): rec.body.get("metadata") for rec in fake.requests}
    assert sent == {
        "default": {"user_id": T},  # the tenant's id: opaque, stable, no name
        "agent's": {"user_id": "a-1"},
        "run's": {"user_id": "r-1"},
    }


@pytest.mark.parametrize(
    ("agent_config", "params", "expected"),
    [
        (
            {},
            {"thinking": {"type": "enabled", "budget_tokens": 8000}},
            "thinking.budget_tokens (8000) must be below max_tokens (4096)",
        ),
        (
            {"temperature": 0.5},
            THINK,
            "temperature (0.5) and thinking cannot be used together",
        ),
        ({}, {"max_turns": 3}, "params.max_turns: not a Messages API parameter"),
        ({}, {"service_tier": "fast"}, "service_tier: Input should be 'auto' or"),
        ({}, {"thinking": {"type": "sometimes"}}, "thinking.type: 'sometimes' is not one of"),
        ({}, ["thinking"], "params must be a JSON object, got list"),
    ],
)
async def test_a_refused_override_is_one_line_and_queues_nothing(
    pool: asyncpg.Pool, agent_config: dict[str, Any], params: Any, expected: str
) -> None:
    await make_agent(pool, tools=[], config=agent_config)
    with pytest.raises(ValueError) as e:
        await Client(pool).enqueue("agent", "go", params=params)
    assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert await runs(pool) == 0


async def test_cli_enqueue_params_refuses_with_exit_2_and_runs_show_prints_them(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[], config={"temperature": 0.5})
    args = ("enqueue", "--agent", "agent", "--input", "go", "--params", json.dumps(THINK))
    bad = cli(dsn, *args, ok=False)
    assert bad.returncode == 2, bad.stderr
    (line,) = bad.stderr.strip().splitlines()
    assert line.startswith("hango-worker: --params: temperature (0.5) and thinking"), line
    assert await runs(pool) == 0
    good = {"stop_sequences": ["STOP"], "metadata": {"user_id": "u-9"}}
    run_id = cli(
        dsn, "enqueue", "--agent", "agent", "--input", "go", "--params", json.dumps(good)
    ).stdout.strip()
    shown = cli(dsn, "runs", "show", run_id).stdout
    assert f"params {json.dumps(good, sort_keys=True)}" in shown
    as_json = json.loads(cli(dsn, "runs", "show", run_id, "--json").stdout)
    assert as_json["input"]["params"] == good


SQL_ENQUEUE = "SELECT hango_api.enqueue('agent', '{\"text\": \"go\"}', config => $1::jsonb)::text"


async def test_the_sql_api_stores_params_and_the_worker_checks_them_before_any_call(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await make_agent(pool, tools=[])
    conn = await asyncpg.connect(dsn)
    try:
        with pytest.raises(asyncpg.PostgresError) as e:
            await conn.fetchval(SQL_ENQUEUE, '{"params": ["thinking"]}')
        assert e.value.sqlstate == "QH003" and "config.params must be a JSON object" in str(e.value)
        assert await runs(pool) == 0
        bad = {"params": {"thinking": {"type": "enabled", "budget_tokens": 9000}}}
        run_id = await conn.fetchval(SQL_ENQUEUE, json.dumps(bad))
    finally:
        await conn.close()
    assert (await details(pool, run_id))["input"]["params"] == bad["params"]
    await run_until_idle(dsn, claude)
    run = await details(pool, run_id)
    assert run["status"] == "failed" and run["error"]["type"] == "invalid_input"
    assert run["error"]["message"] == (
        "runs.input.params: thinking.budget_tokens (9000) must be below max_tokens (4096)"
    )
    assert fake.requests == []  # refused before any model call
