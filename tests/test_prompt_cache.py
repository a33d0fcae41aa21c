"""PromptCache and per-run cost, on the wire: the real `anthropic` SDK against
FakeAnthropic, whose prompt cache reads and writes are computed from the breakpoints
it receives (hango_worker/testing/fake_anthropic/cache.py).

Breakpoints are asserted BY INDEX in the request bodies the server recorded."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from io import StringIO
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY
from pydantic import ValidationError

from hango_worker.agent.middleware import Middleware, ModelHandler, ModelRequest, ModelResponse
from hango_worker.agent.middlewares.prompt_cache import EVENT, PromptCache
from hango_worker.agent.ports import Outcome
from hango_worker.agent.spec import AgentConfig, AgentSpec
from hango_worker.agent.state import State
from hango_worker.config import ConfigError, load_settings
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.prices import DEFAULT_PRICES, PRICE_FIELDS, PriceTable
from hango_worker.provider.types import Message, TextBlock, Usage
from hango_worker.render import Painter, print_run, usage_line
from hango_worker.run.execute import price_table
from hango_worker.store import repo
from hango_worker.testing import FakeAnthropic
from hango_worker.testing.cache_run import (
    MODEL,
    SYSTEM,
    cache_agent,
    cache_script,
    cache_stack,
    cache_tools,
    run_on_wire,
    shares,
)
from hango_worker.testing.fake_anthropic import ApiError, validate_request
from hango_worker.testing.inmem import MemoryRunIO, run_agent
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.helpers import call, scripted
from tests.worker_helpers import details, enqueue, run_until_idle

tools, spec, turns, stack_for = cache_tools, cache_agent, cache_script, cache_stack


async def run_ok(
    fake: FakeAnthropic, a: AgentSpec, stack: Sequence[Middleware | None]
) -> tuple[Outcome, MemoryRunIO]:
    outcome, io = await run_on_wire(fake, a, stack)
    assert outcome.status == "succeeded", outcome.error
    return outcome, io


def marks(body: dict[str, Any]) -> dict[str, list[Any]]:
    """Indexes of the blocks carrying cache_control, per part of the request."""
    msgs = [
        (i, j)
        for i, m in enumerate(body["messages"])
        for j, b in enumerate(m["content"] if isinstance(m["content"], list) else [])
        if "cache_control" in b
    ]
    return {
        "tools": [i for i, t in enumerate(body.get("tools", [])) if "cache_control" in t],
        "system": [i for i, b in enumerate(body.get("system", [])) if "cache_control" in b],
        "messages": msgs,
    }


def count(m: dict[str, list[Any]]) -> int:
    return sum(len(v) for v in m.values())


# -- the hit rate --------------------------------------------------------------------------


async def test_fifty_turns_read_the_prefix_from_turn_two_and_nothing_without_the_slot() -> None:
    a = spec()
    async with FakeAnthropic(turns(50)) as fake:
        _, with_cache = await run_ok(fake, a, stack_for(a))
        fake.load(turns(50))
        _, without = await run_ok(fake, a, stack_for(a, cache=False))
    cached, plain = shares(with_cache), shares(without)
    assert len(cached) == len(plain) == 50
    print(
        f"\ncache-read share of input tokens, turns 2-50: min {min(cached[1:]):.4f}, "
        f"mean {sum(cached[1:]) / 49:.4f} with PromptCache; max {max(plain):.4f} without"
    )
    assert cached[0] == 0.0  # turn 1 writes the prefix
    assert min(cached[1:]) >= 0.95
    assert plain == [0.0] * 50


# -- placement by index ----------------------------------------------------------------------


@dataclass
class Blocks:
    """A prompt contributor with fixed blocks (optionally already marked)."""

    name: str
    texts: list[str]
    cache_control: dict[str, str] | None = None

    def system_blocks(self, state: State) -> list[TextBlock]:
        return [TextBlock(t, self.cache_control) for t in self.texts]


@dataclass
class Compactor:
    """Outer to PromptCache (the Summarization slot): once the history reaches `at`
    messages, every later request sends a summary plus what came after that point."""

    at: int
    name: str = "compactor"
    cut: int | None = None
    first: int = -1  # the index of the first compacted request
    sent: list[int] = field(default_factory=list)

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        msgs = req.request.messages
        if self.cut is None and len(msgs) >= self.at:
            self.cut = len(msgs) - 2  # keep the last tool_use / tool_result pair
            self.first = len(self.sent)
        if self.cut is not None:
            summary = Message("user", [TextBlock("Summary of the work so far: " + "s" * 400)])
            msgs = [summary, *msgs[self.cut :]]
            req = req.with_request(messages=msgs)
        self.sent.append(len(msgs))
        return await next(req)


async def test_breakpoints_by_index_tools_system_before_memory_and_newest_message(
    spans: Any,
) -> None:
    a = spec(system=(SYSTEM, "Second agent block."))
    stack = stack_for(a)
    stack[0] = Blocks("early", ["EARLY contributor block."])  # before PromptCache
    stack[8] = Blocks("memory_like", ["MEMORY: edited every turn."])  # the Memory slot
    script = [
        {"tool_calls": [call("write_todos", todos=[{"content": "a", "status": "pending"}])]},
        {"tool_calls": [call("tool_1", text="x")]},
        {"text": "done"},
    ]
    async with FakeAnthropic(script) as fake:
        await run_ok(fake, a, stack)
        bodies = [r.body for r in fake.requests]
    assert len(bodies) == 3
    for body in bodies:
        m = marks(body)
        assert count(m) <= 4
        assert m["tools"] == [len(body["tools"]) - 1]  # the last tool the provider received
        newest = len(body["messages"]) - 1
        assert m["messages"] == [(newest, len(body["messages"][newest]["content"]) - 1)]
        texts = [b["text"] for b in body["system"]]
        assert texts[-1] == "MEMORY: edited every turn."
        assert "cache_control" not in body["system"][-1]  # memory lands after the breakpoint
    # turn 1: agent blocks 0-1, EARLY at 2, memory at 3 → breakpoint at index 2
    assert marks(bodies[0])["system"] == [2]
    # turns 2-3: the plan (Todo, before PromptCache) at 3 moves it to 3, memory at 4
    assert [b["text"][:5] for b in bodies[1]["system"]][2:] == ["EARLY", "Curre", "MEMOR"]
    assert marks(bodies[1])["system"] == marks(bodies[2])["system"] == [3]
    events = spans.events(EVENT)
    assert [e.attributes["hango.cache.system_index"] for e in events] == [2, 3, 3]
    assert [e.attributes["hango.cache.message_index"] for e in events] == [0, 2, 4]
    assert [e.attributes["hango.cache.tools_index"] for e in events] == [10, 10, 10]


async def test_never_more_than_four_breakpoints_with_foreign_ones() -> None:
    a = spec()
    stack = stack_for(a)
    # two foreign markers after PromptCache's system breakpoint
    stack[8] = Blocks("marked", ["one", "two"], {"type": "ephemeral"})
    async with FakeAnthropic(turns(3)) as fake:
        await run_ok(fake, a, stack)  # the fake answers 400 above 4
        for r in fake.requests:
            m = marks(r.body)
            assert count(m) == 4
            assert m["tools"] == []  # least valuable: dropped
            assert m["system"] == [0, 1, 2]  # the agent's block, then the two foreign ones
            assert len(m["messages"]) == 1  # the moving breakpoint is kept


async def test_one_hour_ttl_on_the_prefix_comes_before_the_five_minute_message_breakpoint() -> None:
    a = spec(cache_ttl="1h")
    async with FakeAnthropic(turns(3)) as fake:
        outcome, _ = await run_ok(fake, a, stack_for(a))
        bodies = [r.body for r in fake.requests]
    for body in bodies:
        assert body["tools"][-1]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
        assert body["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}
        assert body["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    # the writes up to the 1 h breakpoints are reported (and priced) as 1 h writes
    assert (
        0
        < outcome.usage.cache_creation_1h_input_tokens
        < (outcome.usage.cache_creation_input_tokens)
    )
    p = DEFAULT_PRICES[MODEL]
    assert outcome.cost_usd == pytest.approx(p.cost(outcome.usage))


def test_the_fake_refuses_a_one_hour_breakpoint_after_a_five_minute_one() -> None:
    five, hour = {"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}
    body = {
        "model": MODEL,
        "max_tokens": 10,
        "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": five}],
        "system": [{"type": "text", "text": "s", "cache_control": hour}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    with pytest.raises(ApiError, match=r"system\.0\.cache_control\.ttl: a ttl='1h'"):
        validate_request(body, {"anthropic-version": "2023-06-01"})
    body["tools"][0]["cache_control"] = hour
    validate_request(body, {"anthropic-version": "2023-06-01"})


async def test_a_compaction_resets_the_message_prefix_once_then_caching_resumes() -> None:
    a = spec()
    stack = stack_for(a)
    compactor = Compactor(at=21)
    stack[3] = compactor  # the Summarization slot, outer to PromptCache
    async with FakeAnthropic(turns(20)) as fake:
        _, io = await run_ok(fake, a, stack)
        last = fake.requests[-1].body
    s = shares(io)
    k = compactor.first
    assert k == 10 and compactor.sent[k] == 3  # turn 11: summary + the last pair
    assert min(s[1:k]) >= 0.95
    assert 0.5 < s[k] < min(s[1:k])  # tools + system still read, the old history is gone
    assert min(s[k + 1 :]) >= 0.95  # caching resumes on the compacted history
    newest = len(last["messages"]) - 1
    assert marks(last)["messages"] == [(newest, 0)]  # on the rewritten list's newest message


# -- stored history and the run record ----------------------------------------------------------


async def _cost_agent(pool: asyncpg.Pool, model: str = MODEL) -> None:
    await repo.create_agent(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        name="agent",
        model=model,
        system=[SYSTEM],
        tools=[f"tool_{i}" for i in range(10)],
        config={},
    )


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_stored_history_never_holds_cache_control_and_the_run_records_its_cost(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await _cost_agent(pool)
    run_id = await enqueue(pool)
    before = sample("hango_model_cost_usd_total", gen_ai_request_model=MODEL)
    async with FakeAnthropic(turns(4)) as fake:
        provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
        try:
            await run_until_idle(dsn, provider, tools=tools())
        finally:
            await provider.aclose()
        assert all(count(marks(r.body)) == 3 for r in fake.requests)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    stored = await pool.fetch("SELECT content::text AS c FROM messages")
    assert len(stored) == 8 and not any("cache_control" in r["c"] for r in stored)
    usage = run["usage"]
    usage = json.loads(usage) if isinstance(usage, str) else usage
    assert usage["cache_read_input_tokens"] > usage["cache_creation_input_tokens"] > 0
    # the newest message's breakpoint leaves nothing uncached: plain input may be 0
    assert usage["input_tokens"] >= 0 and usage["output_tokens"] > 0
    assert usage["cost_usd"] == pytest.approx(DEFAULT_PRICES[MODEL].cost(Usage.from_dict(usage)))
    after = sample("hango_model_cost_usd_total", gen_ai_request_model=MODEL)
    assert after - before == pytest.approx(usage["cost_usd"])
    out = StringIO()
    print_run(Painter(out), run)  # what `hango-worker runs show` prints
    shown = next(ln for ln in out.getvalue().splitlines() if ln.startswith("usage "))
    assert shown == (
        f"usage input {usage['input_tokens']} · output {usage['output_tokens']} · "
        f"cache read {usage['cache_read_input_tokens']} · "
        f"cache write {usage['cache_creation_input_tokens']} (1h 0) · "
        f"cost ${usage['cost_usd']:.6f}"
    )


# -- the cost model -----------------------------------------------------------------------------

USAGE = [
    {  # all four kinds, a quarter of the writes at 1 h
        "input_tokens": 1000,
        "output_tokens": 200,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 4000,
        "cache_creation_1h_input_tokens": 1000,
    },
    {"input_tokens": 50, "output_tokens": 100, "cache_read_input_tokens": 4000},
]
# claude-sonnet-4-6: input 3, output 15, 5 m write 3.75, 1 h write 6, read 0.30 USD/MTok
HAND = (1000 * 3 + 200 * 15 + 3000 * 3.75 + 1000 * 6 + 50 * 3 + 100 * 15 + 4000 * 0.30) / 1e6


async def test_cost_is_the_sum_over_responses_of_tokens_times_prices(spans: Any) -> None:
    assert round(HAND, 6) == 0.0261
    script = [{"tool_calls": [call("tool_0", text="a")], "usage": USAGE[0]}]
    script.append({"text": "done", "usage": USAGE[1]})
    before = sample("hango_model_cost_usd_total", gen_ai_request_model=MODEL)
    outcome, _, _ = await run_agent(spec(), scripted(*script), tools=tools())
    assert outcome.cost_usd == pytest.approx(HAND)
    assert outcome.usage_dict()["cost_usd"] == pytest.approx(HAND)
    after = sample("hango_model_cost_usd_total", gen_ai_request_model=MODEL)
    assert after - before == pytest.approx(HAND)
    (agent_span,) = spans.named("invoke_agent")
    assert agent_span.attributes["hango.run.cost_usd"] == pytest.approx(HAND)


async def test_an_unknown_model_has_an_unknown_cost_counted_once(spans: Any) -> None:
    a = spec().model_copy(update={"model": "claude-unpriced-9"})
    before = sample("hango_model_price_unknown_total", gen_ai_request_model="claude-unpriced-9")
    script = [{"tool_calls": [call("tool_0", text="a")]}, {"text": "done"}]
    outcome, _, _ = await run_agent(a, scripted(*script), tools=tools())
    assert outcome.status == "succeeded"
    assert outcome.cost_usd is None and outcome.usage_dict()["cost_usd"] is None
    after = sample("hango_model_price_unknown_total", gen_ai_request_model="claude-unpriced-9")
    assert after - before == 1  # two responses, counted once
    assert sample("hango_model_cost_usd_total", gen_ai_request_model="claude-unpriced-9") == 0
    assert len(spans.events("model.price_unknown")) == 1
    assert usage_line(outcome.usage_dict()).endswith("cost unknown (no price for the model)")
    (agent_span,) = spans.named("invoke_agent")
    assert "hango.run.cost_usd" not in agent_span.attributes


def test_price_lookup_snapshots_and_overrides() -> None:
    table = PriceTable({"claude-test": dict.fromkeys(PRICE_FIELDS, 1.0)})
    assert table.lookup("claude-sonnet-4-5-20250929") is DEFAULT_PRICES["claude-sonnet-4-5"]
    assert table.lookup("claude-test") is not None
    assert table.lookup("gpt-4") is None
    p = DEFAULT_PRICES["claude-opus-4-6"]
    assert (p.input, p.output, p.cache_write_5m, p.cache_write_1h, p.cache_read) == (
        5.0,
        25.0,
        6.25,
        10.0,
        0.5,
    )


def test_prompt_cache_refuses_an_unknown_ttl() -> None:
    with pytest.raises(ValueError, match="'5m' or '1h'"):
        PromptCache("24h")  # type: ignore[arg-type]


def test_bad_cache_ttl_and_bad_prices_are_refused_with_the_setting_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValidationError, match="cache_ttl"):
        AgentConfig.model_validate({"cache_ttl": "24h"})
    monkeypatch.setenv("HANGO_MODEL_PRICES", "{not json")
    with pytest.raises(ConfigError, match="HANGO_MODEL_PRICES is not valid JSON"):
        load_settings()
    monkeypatch.setenv("HANGO_MODEL_PRICES", '{"m": {"input": -1}}')
    with pytest.raises(ConfigError, match=r"HANGO_MODEL_PRICES \[m\.input\]=-1 is not valid"):
        load_settings()
    prices = dict.fromkeys(PRICE_FIELDS, 2.0)
    monkeypatch.setenv("HANGO_MODEL_PRICES", json.dumps({"claude-test": prices}))
    table = price_table(load_settings())
    assert table.cost("claude-test", Usage(input_tokens=1_000_000)) == 2.0
    assert table.lookup(MODEL) is DEFAULT_PRICES[MODEL]  # the defaults stay


async def test_usage_and_cost_of_a_run_add_up_over_its_attempts(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Cancelled after turn 1, resumed, finished in turn 2: the run record holds both."""

    async def cancel_me(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, ctx.run_id)
        return ToolResult("ok")

    stopper = Tool("tool_0", "Cancels its own run.", {"type": "object"}, cancel_me)
    await _cost_agent(pool)
    run_id = await enqueue(pool)
    script = [{"tool_calls": [call("tool_0")], "usage": USAGE[0]}]
    script.append({"text": "done", "usage": USAGE[1]})
    await run_until_idle(dsn, scripted(*script), [stopper])
    first = await details(pool, run_id)
    assert first["status"] == "cancelled"
    assert first["usage"]["cost_usd"] == pytest.approx(
        DEFAULT_PRICES[MODEL].cost(Usage.from_dict(USAGE[0]))
    )
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, run_id)
    await run_until_idle(dsn, scripted(*script), [stopper])
    run = await details(pool, run_id)
    assert run["status"] == "succeeded" and run["attempt"] == 2
    total = Usage.from_dict(USAGE[0])
    total.add(Usage.from_dict(USAGE[1]))
    assert {k: run["usage"][k] for k in total.to_dict()} == total.to_dict()
    assert run["usage"]["cost_usd"] == pytest.approx(HAND)


async def test_an_unreadable_run_usage_fails_the_resumed_run_clearly(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await _cost_agent(pool)
    run_id = await enqueue(pool)
    await pool.execute('UPDATE runs SET usage = \'{"input_tokens": "many"}\' WHERE id = $1', run_id)
    await run_until_idle(dsn, scripted({"text": "done"}), tools())
    run = await details(pool, run_id)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "invalid_state"
    assert "runs.usage holds a count that is not a number" in run["error"]["message"]
