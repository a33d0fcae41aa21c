"""Cost is exact (provider/prices.py, agent/cost.py): every unit the API reports in
`usage` is priced, through a real worker, the real SDK and the fake server scripting
the usage fields: thinking tokens (billed as output), cache writes at 5 m and 1 h,
cache reads, server-tool units (web search per 1,000, web fetch free) and the service
tier. A unit with no price makes the run's cost unknown (null), never 0; a price for it
in HANGO_MODEL_PRICES makes it known. Usage fields nobody reads are kept as they came."""

from __future__ import annotations

import json
from collections.abc import Iterator
from io import StringIO
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.config import load_settings
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.prices import DEFAULT_PRICES, PriceTable
from hango_worker.provider.types import Usage
from hango_worker.render import Painter, print_run
from hango_worker.run.execute import price_table
from hango_worker.testing.fake_anthropic import FakeAnthropic
from tests.helpers import call, recording_tool
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

MODEL = "claude-test"  # priced only by HANGO_MODEL_PRICES here
TOKENS = {"input": 3.0, "output": 15.0, "cache_write_5m": 3.75, "cache_write_1h": 6.0}
PRICES = {MODEL: {**TOKENS, "cache_read": 0.3}}

# turn 0: thinking, cache writes (a quarter at 1 h), two web searches and a web fetch
FIRST = {
    "input_tokens": 1000,
    "output_tokens": 400,
    "output_tokens_details": {"thinking_tokens": 300},
    "cache_read_input_tokens": 0,
    "cache_creation_input_tokens": 4000,
    "cache_creation": {"ephemeral_5m_input_tokens": 3000, "ephemeral_1h_input_tokens": 1000},
    "server_tool_use": {"web_search_requests": 2, "web_fetch_requests": 1},
}
# turn 1: cache reads, on the batch tier (half the token prices), one more search
SECOND = {
    "input_tokens": 50,
    "output_tokens": 100,
    "cache_read_input_tokens": 4000,
    "cache_creation_input_tokens": 0,
    "service_tier": "batch",
    "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
}
HAND_TOKENS_0 = (1000 * 3 + 400 * 15 + 3000 * 3.75 + 1000 * 6) / 1e6
HAND_TOKENS_1 = (50 * 3 + 100 * 15 + 4000 * 0.3) / 1e6
HAND = HAND_TOKENS_0 + 2 * 0.01 + 0.5 * HAND_TOKENS_1 + 0.01


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def echo_tool() -> Iterator[Any]:
    tool, _ = recording_tool()
    yield tool


async def run_with(
    pool: asyncpg.Pool, dsn: str, script: list[dict[str, Any]], tool: Any, **over: Any
) -> dict[str, Any]:
    await make_agent(pool)
    run_id = await enqueue(pool)
    async with FakeAnthropic(script) as fake:
        provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
        try:
            await run_until_idle(dsn, provider, [tool], **over)
        finally:
            await provider.aclose()
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    return run


def usage_of(run: dict[str, Any]) -> dict[str, Any]:
    u = run["usage"]
    return json.loads(u) if isinstance(u, str) else u


def shown(run: dict[str, Any]) -> str:
    out = StringIO()
    print_run(Painter(out), run)  # what `hango-worker runs show` prints
    return next(ln for ln in out.getvalue().splitlines() if ln.startswith("usage "))


async def test_every_priced_unit_is_priced_in_usage_span_metrics_and_runs_show(
    pool: asyncpg.Pool, dsn: str, echo_tool: Any, spans: Any
) -> None:
    assert round(HAND, 6) == round(0.02625 + 0.02 + 0.001425 + 0.01, 6)
    script = [
        {"thinking": "search first", "tool_calls": [call("echo", text="a")], "usage": FIRST},
        {"text": "done", "usage": SECOND},
    ]
    before = {
        "cost": sample("hango_model_cost_usd_total", gen_ai_request_model=MODEL),
        "search": sample(
            "hango_model_server_tool_units_total",
            gen_ai_request_model=MODEL,
            unit="web_search_requests",
        ),
        "thinking": sample("hango_model_tokens_total", type="thinking"),
        "batch": sample(
            "hango_model_responses_by_tier_total", gen_ai_request_model=MODEL, service_tier="batch"
        ),
    }
    run = await run_with(pool, dsn, script, echo_tool, model_prices=PRICES)
    usage = usage_of(run)
    assert usage["cost_usd"] == pytest.approx(HAND)
    assert usage["thinking_tokens"] == 300 and usage["output_tokens"] == 500
    assert usage["cache_creation_1h_input_tokens"] == 1000
    assert usage["server_tool_use"] == {"web_search_requests": 3, "web_fetch_requests": 1}
    assert usage["service_tiers"] == {"standard": 1, "batch": 1}
    # the metrics
    assert sample("hango_model_cost_usd_total", gen_ai_request_model=MODEL) - before[
        "cost"
    ] == pytest.approx(HAND)
    search = sample(
        "hango_model_server_tool_units_total",
        gen_ai_request_model=MODEL,
        unit="web_search_requests",
    )
    assert search - before["search"] == 3
    assert sample("hango_model_tokens_total", type="thinking") - before["thinking"] == 300
    batch = sample(
        "hango_model_responses_by_tier_total", gen_ai_request_model=MODEL, service_tier="batch"
    )
    assert batch - before["batch"] == 1
    # the spans: each call's units, the run's totals and cost
    chats = spans.named("chat ")
    assert [c.attributes.get("hango.usage.service_tier") for c in chats] == ["standard", "batch"]
    assert chats[0].attributes["hango.usage.thinking_tokens"] == 300
    assert chats[0].attributes["hango.usage.server_tool_use.web_search_requests"] == 2
    (agent,) = spans.named("invoke_agent")
    assert agent.attributes["hango.run.cost_usd"] == pytest.approx(HAND)
    assert agent.attributes["hango.usage.server_tool_use.web_search_requests"] == 3
    assert agent.attributes["hango.usage.service_tiers.batch"] == 1
    # `runs show`
    assert shown(run) == (
        "usage input 1050 · output 500 (thinking 300) · cache read 4000 · "
        "cache write 4000 (1h 1000) · server tools web_fetch_requests 1, "
        "web_search_requests 3 · tiers batch 1, standard 1 · cost $0.057675"
    )


UNPRICED = [
    ({"service_tier": "priority"}, "service_tier=priority", {"service_tier": {"priority": 1.0}}),
    (
        {"server_tool_use": {"web_search_requests": 1, "code_execution_requests": 2}},
        "server_tool_use.code_execution_requests",
        {"server_tool_use": {"code_execution_requests": 0.002}},
    ),
    ({"speed": "fast"}, "speed=fast", {"speed": {"fast": 6.0}}),
]


@pytest.mark.parametrize(("fields", "unit", "price"), UNPRICED, ids=[u[1] for u in UNPRICED])
async def test_a_unit_without_a_price_makes_the_cost_null_until_it_is_given_one(
    pool: asyncpg.Pool,
    dsn: str,
    echo_tool: Any,
    spans: Any,
    fields: dict[str, Any],
    unit: str,
    price: dict[str, Any],
) -> None:
    usage = {"input_tokens": 100, "output_tokens": 10, **fields}
    script = [{"tool_calls": [call("echo", text="a")]}, {"text": "done", "usage": usage}]
    labels = {"gen_ai_request_model": MODEL, "unit": unit}
    before = sample("hango_model_unpriced_units_total", **labels)
    run = await run_with(pool, dsn, script, echo_tool, model_prices=PRICES)
    assert usage_of(run)["cost_usd"] is None  # never 0, never the priced part alone
    assert usage_of(run)["cost_unpriced"] == unit
    assert sample("hango_model_unpriced_units_total", **labels) - before == 1
    (event,) = spans.events("model.price_unknown")
    assert event.attributes["hango.price.unit"] == unit
    assert shown(run).endswith(f"cost unknown (no price for {unit})")
    (agent,) = spans.named("invoke_agent")
    assert "hango.run.cost_usd" not in agent.attributes
    assert agent.attributes["hango.run.cost_unpriced"] == unit
    # priced in HANGO_MODEL_PRICES: the same response has a cost
    table = price_table(load_settings(model_prices={MODEL: {**PRICES[MODEL], **price}}))
    assert table.cost(MODEL, Usage.from_api(usage)) is not None


async def test_usage_fields_nobody_reads_are_kept_as_they_came(
    pool: asyncpg.Pool, dsn: str, echo_tool: Any
) -> None:
    future = {
        "inference_geo": "us",
        "iterations": [{"type": "message", "input_tokens": 100, "output_tokens": 10}],
        "future_counter": {"widgets": 3, "nested": [1, None, "x"]},
    }
    usage = {"input_tokens": 100, "output_tokens": 10, **future}
    script = [{"tool_calls": [call("echo", text="a")]}, {"text": "done", "usage": usage}]
    run = await run_with(pool, dsn, script, echo_tool, model_prices=PRICES)
    rows = await pool.fetch(
        "SELECT payload::text AS p FROM run_events WHERE run_id = $1 AND type = 'model_message' "
        "ORDER BY seq",
        run["id"],
    )
    stored = json.loads(rows[-1]["p"])["usage"]
    assert {k: stored[k] for k in future} == future
    # inference_geo "us" is priced (1.1 x the tokens); the others are no units
    expected = 1.1 * (100 * 3 + 10 * 15) / 1e6
    first = json.loads(rows[0]["p"])["usage"]
    first_cost = PriceTable(PRICES).cost(MODEL, Usage.from_dict(first))
    assert usage_of(run)["cost_usd"] == pytest.approx(expected + (first_cost or 0.0))


def test_the_price_table_prices_each_unit_and_keeps_its_lookup_api() -> None:
    p = DEFAULT_PRICES["claude-sonnet-4-6"]
    u = Usage(input_tokens=1_000_000, thinking_tokens=5, output_tokens=10)
    assert p.cost(u) == pytest.approx(3.0 + 10 * 15 / 1e6)  # thinking is in output
    assert p.cost(Usage(input_tokens=1_000_000, service_tier="batch")) == pytest.approx(1.5)
    assert p.cost(Usage(input_tokens=1_000_000, inference_geo="us")) == pytest.approx(3.3)
    searches = Usage(server_tool_use={"web_search_requests": 1000, "web_fetch_requests": 7})
    assert p.cost(searches) == pytest.approx(10.0)
    assert p.cost(Usage(service_tier="priority")) is None
    assert p.unpriced(Usage(service_tier="priority")) == "service_tier=priority"
    assert p.unpriced(Usage(server_tool_use={"x": 0})) is None  # a zero count costs nothing
    table = PriceTable({"m": {**PRICES[MODEL], "service_tier": {"priority": 2.0}}})
    m = table.lookup("m")
    assert m is not None and m.service_tier["batch"] == 0.5  # laid over the defaults
    assert table.cost("m", Usage(input_tokens=1_000_000, service_tier="priority")) == 6.0
    assert table.cost("unknown-model", Usage()) is None


def test_bad_unit_prices_are_refused_with_the_setting_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from hango_worker.config import ConfigError

    bad = {MODEL: {**PRICES[MODEL], "service_tier": {"priority": -1}}}
    monkeypatch.setenv("HANGO_MODEL_PRICES", json.dumps(bad))
    with pytest.raises(ConfigError, match=r"HANGO_MODEL_PRICES \[claude-test\.service_tier"):
        load_settings()


def test_a_summary_call_is_priced_at_its_own_model() -> None:
    from hango_worker.agent.cost import RunCost

    cost = RunCost(PriceTable(PRICES), MODEL)
    cost.add(Usage(input_tokens=1_000_000))  # the agent's model: $3
    cost.add(Usage(input_tokens=1_000_000), "claude-haiku-4-5")  # its summary model: $1
    assert cost.usd == pytest.approx(4.0)
    cost.add(Usage(input_tokens=10), "claude-unpriced-summariser")
    assert cost.usd is None and cost.unpriced == "model=claude-unpriced-summariser"


async def test_an_unknown_cost_stays_unknown_and_named_across_attempts(
    pool: asyncpg.Pool, dsn: str
) -> None:
    from hango_worker.store import decisions, repo
    from hango_worker.vocab import Decision

    await make_agent(pool, tools=["echo", "ask_user"])
    run_id = await enqueue(pool)
    priority = {"input_tokens": 10, "output_tokens": 5, "service_tier": "priority"}
    script = [
        {"tool_calls": [call("ask_user", question="ok?")], "usage": priority},
        {"text": "done"},  # the next attempt: standard tier, priced
    ]
    echo, _ = recording_tool()
    async with FakeAnthropic(script) as fake:
        provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
        try:
            await run_until_idle(dsn, provider, [echo], model_prices=PRICES)
            await decisions.decide(pool, repo.DEFAULT_TENANT_ID, run_id, Decision.ANSWER, text="y")
            await run_until_idle(dsn, provider, [echo], model_prices=PRICES)
        finally:
            await provider.aclose()
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    assert usage_of(run)["cost_usd"] is None
    assert usage_of(run)["cost_unpriced"] == "service_tier=priority"
