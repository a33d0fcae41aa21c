"""Structured final answers (docs/structured-output.md): an agent's `output_schema`,
asked for with the API's structured outputs (a model that has them) or a forced final
tool (any other), the answer checked against the schema, one violation told to the
model, a second one ending the run `output_invalid` with the JSON path; the parsed
answer as `output` in `runs show --json`, the Client and the producer view, also after
an `ask_user` wait rebuilt from Postgres.

Through a real worker, the real SDK and the fake server, which checks
`output_config.format` and forced tool choices as the API does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.client import Client
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.store import decisions, repo
from hango_worker.testing.fake_anthropic import FakeAnthropic
from hango_worker.vocab import Decision
from tests.conftest import SpanReader
from tests.helpers import call
from tests.test_cli import cli
from tests.worker_helpers import run_until_idle

T = repo.DEFAULT_TENANT_ID
NATIVE = "claude-sonnet-4-5"  # has structured outputs
OLDER = "claude-3-5-haiku-20241022"  # has not: the forced final tool
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "price": {"type": "number"}},
                "required": ["name", "price"],
            },
        },
        "total": {"type": "number", "minimum": 0},
    },
    "required": ["items", "total"],
}
GOOD = {"items": [{"name": "a", "price": 1}, {"name": "b", "price": 2}], "total": 3}
BAD = {"items": [{"name": "a", "price": 1}, {"name": "b", "price": 2}, {"name": "c"}], "total": 3}
PATH = "$.items[2]"  # where BAD breaks the schema: 'price' is a required property
WORSE = {**GOOD, "items": [*GOOD["items"], {"name": "c", "price": "x"}]}  # $.items[2].price


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic([]) as f:
        yield f


@pytest.fixture
async def claude(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    p = AnthropicProvider(api_key="test-key", base_url=fake.base_url, max_retries=0)
    yield p
    await p.aclose()


async def _agent(
    pool: asyncpg.Pool, model: str, tools: list[str] | None = None, **config: Any
) -> None:
    await repo.create_agent(
        pool,
        tenant_id=T,
        name="agent",
        model=model,
        system=["Extract the order."],
        tools=tools or [],
        config={"output_schema": SCHEMA, **config},
    )


async def _run(pool: asyncpg.Pool, dsn: str, claude: AnthropicProvider) -> dict[str, Any]:
    run_id = (await repo.enqueue(pool, tenant_id=T, agent="agent", input_text="order"))["run_id"]
    await run_until_idle(dsn, claude)
    return await Client(pool).get(run_id)


def _invalid(attempt: str) -> float:
    value = REGISTRY.get_sample_value("hango_output_invalid_total", {"attempt": attempt})
    return value or 0.0


def _final(value: Any) -> dict[str, Any]:
    return {"tool_calls": [call("final_answer", **value)]}


# -- native: the API's structured outputs -----------------------------------------------


async def test_native_answer_is_the_runs_output_everywhere(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, NATIVE)
    fake.load([{"output": GOOD}])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == GOOD  # Client.get
    body = fake.requests[0].body
    fmt = body["output_config"]["format"]
    assert fmt["type"] == "json_schema" and fmt["schema"]["additionalProperties"] is False
    assert "tool_choice" not in body and not body.get("tools")
    shown = json.loads(cli(dsn, "runs", "show", run["id"], "--json").stdout)
    assert shown["output"] == GOOD
    assert f"output: {json.dumps(GOOD)}" in cli(dsn, "runs", "show", run["id"]).stdout
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SET LOCAL ROLE hango_producer")
        view = await conn.fetchval("SELECT output FROM hango_api.runs WHERE run_id = $1", run["id"])
    assert view == GOOD


async def test_native_invalid_then_fixed_is_told_once(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider, spans: SpanReader
) -> None:
    await _agent(pool, NATIVE)
    fake.load([{"output": WORSE}, {"output": GOOD}])
    before = _invalid("1")
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == GOOD
    told = fake.requests[1].body["messages"][-1]
    assert told["role"] == "user"
    text = told["content"][0]["text"]
    assert "$.items[2].price" in text and "'x' is not of type 'number'" in text
    assert _invalid("1") == before + 1
    (event,) = spans.events("agent.output_invalid")
    assert event.attributes["hango.output.path"] == "$.items[2].price"
    assert event.attributes["hango.output.attempt"] == 1
    assert event.attributes["hango.output.mode"] == "native"
    assert [e["payload"]["turn"] for e in run["events"] if e["type"] == "model_message"] == [1, 2]


async def test_native_invalid_twice_fails_output_invalid_naming_the_path(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, NATIVE)
    fake.load([{"output": WORSE}, {"output": WORSE}])
    before = _invalid("2")
    run = await _run(pool, dsn, claude)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "output_invalid"
    assert run["error"]["path"] == "$.items[2].price"
    assert "$.items[2].price" in run["error"]["message"]
    assert run["output"] is None
    assert _invalid("2") == before + 1
    assert len(fake.requests) == 2  # told once, then failed


async def test_not_json_is_a_violation_at_the_root(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, NATIVE)
    fake.load([{"text": "Sure! Here it is."}, {"output": GOOD}])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert (
        "at $: the answer is not valid JSON"
        in fake.requests[1].body["messages"][-1]["content"][0]["text"]
    )


# -- the forced final tool ----------------------------------------------------------------


async def test_final_tool_for_a_model_without_structured_outputs(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, OLDER)
    fake.load([_final(BAD), _final(GOOD)])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == GOOD
    first = fake.requests[0].body
    assert "output_config" not in first
    assert first["tool_choice"] == {"type": "any"}
    (tool,) = [t for t in first["tools"] if t["name"] == "final_answer"]
    assert tool["input_schema"] == SCHEMA
    result = fake.requests[1].body["messages"][-1]["content"][0]
    assert result["type"] == "tool_result" and result["is_error"] is True
    assert PATH in result["content"] and "'price' is a required property" in result["content"]
    # the accepted call is answered too: the session's history stays valid
    last = run["transcript"][-1]["content"][0]
    assert last["type"] == "tool_result" and not last.get("is_error")


async def test_final_tool_twice_invalid_fails_with_the_path(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, OLDER)
    fake.load([_final(WORSE), _final(BAD)])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "output_invalid" and run["error"]["path"] == PATH


async def test_a_schema_that_is_not_an_object_is_wrapped_in_the_final_tool(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, OLDER, output_schema={"type": "array", "items": {"type": "integer"}})
    fake.load([{"tool_calls": [call("final_answer", answer=[1, 2, 3])]}])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == [1, 2, 3]


async def test_the_wind_up_forces_the_final_tool(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, OLDER, ["current_time"], max_turns=1)
    fake.load([{"tool_calls": [call("current_time")]}, _final(GOOD)])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert run["limit_reached"] == "max_turns" and run["output"] == GOOD
    assert fake.requests[1].body["tool_choice"] == {"type": "tool", "name": "final_answer"}


async def test_with_thinking_no_tool_is_forced_and_a_json_text_answer_counts(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    thinking = {"type": "enabled", "budget_tokens": 1024}
    await _agent(pool, OLDER, thinking=thinking)
    fake.load([{"output": GOOD}])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == GOOD
    assert "tool_choice" not in fake.requests[0].body


# -- across a wait, rebuilt from Postgres ------------------------------------------------


async def _answer_and_resume(
    pool: asyncpg.Pool, dsn: str, claude: AnthropicProvider, run_id: str
) -> dict[str, Any]:
    run = await Client(pool).get(run_id)
    assert run["status"] == "waiting", run["error"]
    await decisions.decide(pool, T, run_id, Decision.ANSWER, text="two items")
    await run_until_idle(dsn, claude)  # a new attempt: history and state from Postgres
    return await Client(pool).get(run_id)


async def test_output_after_an_ask_user_wait(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, OLDER, ["ask_user"])
    fake.load([{"tool_calls": [call("ask_user", question="How many?")]}, _final(GOOD)])
    run = await _run(pool, dsn, claude)
    run = await _answer_and_resume(pool, dsn, claude, run["id"])
    assert run["status"] == "succeeded", run["error"]
    client = Client(pool)
    assert (await client.wait(run["id"], timeout_s=10))["output"] == GOOD
    assert json.loads(cli(dsn, "runs", "show", run["id"], "--json").stdout)["output"] == GOOD


async def test_a_violation_before_a_wait_still_counts_after_it(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, NATIVE, ["ask_user"])
    fake.load(
        [
            {"output": WORSE},
            {"tool_calls": [call("ask_user", question="How many?")]},
            {"output": WORSE},
        ]
    )
    run = await _run(pool, dsn, claude)
    run = await _answer_and_resume(pool, dsn, claude, run["id"])
    assert run["status"] == "failed"
    assert run["error"]["type"] == "output_invalid"
    assert all("output_config" in r.body for r in fake.requests)


# -- refused up front ----------------------------------------------------------------------


def test_a_schema_that_is_not_a_json_schema_is_refused_at_agents_create(dsn: str) -> None:
    config = json.dumps({"output_schema": {"type": "objekt"}})
    p = cli(dsn, "agents", "create", "--name", "x", "--model", "m", "--config", config, ok=False)
    assert p.returncode == 2
    (line,) = p.stderr.strip().splitlines()
    assert "output_schema" in line and "not a valid JSON Schema" in line
    assert json.loads(cli(dsn, "agents", "list", "--json").stdout) == []


async def test_client_create_agent_refuses_it_too(pool: asyncpg.Pool) -> None:
    bad = {"output_schema": {"type": "object", "required": "name"}}
    with pytest.raises(ValueError, match="output_schema") as e:
        await Client(pool).create_agent("x", NATIVE, config=bad)
    assert "not a valid JSON Schema at ['required']" in str(e.value)
    assert await repo.list_agents(pool, T) == []


async def test_the_fake_refuses_structured_outputs_for_a_model_without_them(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, OLDER, output_mode="native")
    fake.load([{"output": GOOD}])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "invalid_request_error"
    assert "does not support structured outputs" in run["error"]["message"]


async def test_the_final_tool_beside_other_calls_is_answered_as_an_error_not_taken(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, claude: AnthropicProvider
) -> None:
    await _agent(pool, OLDER, ["current_time"])
    both = {"tool_calls": [call("current_time"), call("final_answer", **GOOD)]}
    fake.load([both, _final(GOOD)])
    run = await _run(pool, dsn, claude)
    assert run["status"] == "succeeded", run["error"]
    assert run["output"] == GOOD
    results = fake.requests[1].body["messages"][-1]["content"]
    assert [r.get("is_error", False) for r in results] == [False, True]
    assert "call it alone" in results[1]["content"]


async def test_a_subagent_with_a_schema_hands_its_parent_the_output(
    pool: asyncpg.Pool, dsn: str, claude: AnthropicProvider, fake: FakeAnthropic
) -> None:
    await _agent(pool, OLDER)  # the child: "agent", the forced final tool
    await repo.create_agent(
        pool,
        tenant_id=T,
        name="boss",
        model=OLDER,
        system=["Boss."],
        tools=["task"],
        config={"subagents": ["agent"]},
    )

    def play(rec: Any) -> dict[str, Any]:
        if rec.body["system"][0]["text"] != "Boss.":
            return _final(GOOD)
        if rec.turn_index == 0:  # its own id: the child's first call is toolu_s0000_0 too
            task = call("task", description="extract", subagent_type="agent")
            return {"tool_calls": [{**task, "id": "toolu_task_0"}]}
        return {"text": "done"}

    fake.handler = play
    run_id = (await repo.enqueue(pool, tenant_id=T, agent="boss", input_text="go"))["run_id"]
    await run_until_idle(dsn, claude)
    run = await Client(pool).get(run_id)
    assert run["status"] == "succeeded", run["error"]
    (result,) = fake.requests[-1].body["messages"][-1]["content"]
    assert json.loads(result["content"]) == GOOD
