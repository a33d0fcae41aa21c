"""Fleet-wide model rate limits: the Postgres token bucket, the gate before each model
call (wait → span event, usage, metric), following the provider's headers and 429s."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.calls import ModelCaller, RunCancelled
from hango_worker.agent.control import RunControl
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import (
    Message,
    ModelError,
    Request,
    Response,
    StopReason,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from hango_worker.run.ratelimit import MAX_SLEEP_S, RunRateGate
from hango_worker.service import serve
from hango_worker.store import db, ratelimits, sql
from hango_worker.testing import OTLPReceiver
from hango_worker.testing.fake_anthropic import FakeAnthropic, FakeRateLimit
from hango_worker.tool.registry import Registry
from tests.worker_helpers import enqueue, make_agent, settings


def _request() -> Request:
    return Request(model="claude-test", messages=[Message("user", [TextBlock("hi " * 40)])])


async def _take(pool: asyncpg.Pool, key: str, tokens: float = 1.0) -> tuple[bool, float]:
    row = await pool.fetchrow(sql.RATE_TAKE, key, tokens)
    assert row is not None
    return bool(row["ok"]), float(row["wait_s"])


async def test_the_bucket_grants_its_size_then_says_how_long_to_wait(pool: asyncpg.Pool) -> None:
    await ratelimits.set_rate_limit(pool, "k", requests_per_minute=60, window_s=2.0)
    assert (await _take(pool, "k"))[0] and (await _take(pool, "k"))[0]  # holds 2
    ok, wait = await _take(pool, "k")
    assert not ok and 0.5 < wait <= 1.0  # refills one request per second
    assert await pool.fetchrow(sql.RATE_TAKE, "no-such-key", 1.0) is None  # no limit
    await ratelimits.set_rate_limit(pool, "t", input_tokens_per_minute=600, window_s=1.0)
    assert (await _take(pool, "t", 8))[0]  # 10 tokens, 8 taken
    ok, wait = await _take(pool, "t", 8)
    assert not ok and wait == pytest.approx(0.6, abs=0.1)  # 6 missing at 10/s


async def test_bad_rate_limits_are_refused_with_a_clear_error(pool: asyncpg.Pool) -> None:
    with pytest.raises(ValueError, match="requests_per_minute must be a whole number 1"):
        await ratelimits.set_rate_limit(pool, "k", requests_per_minute=-5)
    with pytest.raises(ValueError, match="give at least one limit"):
        await ratelimits.set_rate_limit(pool, "k")
    with pytest.raises(ValueError, match="window_s must be"):
        await ratelimits.set_rate_limit(pool, "k", requests_per_minute=5, window_s=0)
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute("INSERT INTO rate_limits (key, requests_per_minute) VALUES ('x', 0)")
    assert await ratelimits.list_rate_limits(pool) == []


async def test_a_429_pauses_every_caller_and_headers_cap_the_bucket(pool: asyncpg.Pool) -> None:
    await ratelimits.set_rate_limit(pool, "anthropic", requests_per_minute=6000)
    gate = RunRateGate(pool, "anthropic")
    before = REGISTRY.get_sample_value("hango_rate_limited_calls_total", {"key": "anthropic"})
    assert await gate.take(_request()) == 0.0
    err = ModelError("rate_limit_error", "slow down", retryable=True, status=429, retry_after_s=30)
    await gate.settle(_request(), None, err)
    after = REGISTRY.get_sample_value("hango_rate_limited_calls_total", {"key": "anthropic"})
    assert (after or 0) - (before or 0) == 1
    ok, wait = await _take(pool, "anthropic")
    assert not ok and 29 < wait <= 30  # the retry-after, for every worker
    assert await gate.take(_request()) == MAX_SLEEP_S  # asked again at least this often
    control = RunControl(rate_gate=gate)
    control.cancel.set()
    caller = ModelCaller(ScriptedProvider([{"text": "never"}]), control, "scripted", False)
    with pytest.raises(RunCancelled):  # a cancel cuts the wait short
        await caller.call(_request(), None)
    # the provider says fewer requests are left than the bucket holds: it follows
    await ratelimits.set_rate_limit(pool, "h", requests_per_minute=6000)
    resp = Response(Message("assistant", [TextBlock("ok")]), StopReason.END_TURN, Usage(10, 5))
    resp.rate_limit_headers = {"anthropic-ratelimit-requests-remaining": "0"}
    await RunRateGate(pool, "h").settle(_request(), resp, None)
    level = await pool.fetchval("SELECT requests FROM rate_limits WHERE key = 'h'")
    assert level == 0


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_run_that_waits_for_the_limit_says_so(
    pool: asyncpg.Pool, dsn: str, monkeypatch: Any
) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    await make_agent(pool, tools=[])
    ids = [await enqueue(pool, f"run {i}") for i in range(4)]
    # the fake allows 2.5 requests/s (1.25 at once); the fleet's bucket 2/s (1 at once)
    await ratelimits.set_rate_limit(pool, "anthropic", requests_per_minute=120, window_s=0.5)
    limit = FakeRateLimit(requests_per_minute=150, window_s=0.5)
    waits = _sample("hango_rate_limit_wait_seconds_count", key="anthropic")
    with OTLPReceiver() as rx, FakeAnthropic([{"text": "done"}], rate_limit=limit) as fake:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint)
        provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
        started = time.monotonic()
        await serve(
            settings(dsn, rate_limit_key="anthropic"),
            dsn,
            until_idle=True,
            provider=provider,
            registry=Registry([]),
            logs=False,
        )
        elapsed = time.monotonic() - started
        rx.wait_for("invoke_agent agent", timeout=10)
        events = []
        for _ in range(100):
            events = [e for s in rx.spans() for e in s.events if e.name == "hango.rate_limit.wait"]
            if len(events) >= 3:
                break
            await asyncio.sleep(0.1)
    rows = await pool.fetch("SELECT status, usage FROM runs WHERE id = ANY($1::uuid[])", ids)
    assert {r["status"] for r in rows} == {"succeeded"}
    assert limit.refused == 0 and len(limit.accepted) == 4, "the fake saw no 429"
    waited = sorted(float(r["usage"]["waiting_for_rate_limit"]) for r in rows)
    assert waited[0] == 0.0 and waited[-1] >= 1.0, waited  # the 4th waited ~1.5 s
    assert waited[-1] < elapsed  # a wait within the drain, not a clock reading
    assert elapsed >= 1.4
    assert _sample("hango_rate_limit_wait_seconds_count", key="anthropic") - waits >= 3
    assert events and events[0].attributes["hango.rate_limit.key"] == "anthropic"
    assert 1.0 <= max(e.attributes["hango.rate_limit.wait_s"] for e in events) < elapsed


async def _levels(pool: asyncpg.Pool, key: str) -> tuple[float, float, float]:
    row = await pool.fetchrow(
        "SELECT requests, input_tokens, output_tokens FROM rate_limits WHERE key = $1", key
    )
    return float(row["requests"]), float(row["input_tokens"]), float(row["output_tokens"])


def _approx(*levels: float) -> Any:
    return pytest.approx(levels, abs=2)  # the buckets refill 1 a second meanwhile


async def test_the_gate_takes_an_estimate_then_charges_what_the_call_used(
    pool: asyncpg.Pool,
) -> None:
    """Buckets of 3600 refilling 1 a second, one per model (`{model}` in the key): the
    first call takes the request's characters / 4 (system, text, tool arguments and
    results), the next one the previous call's input tokens; afterwards the bucket is
    charged what the call used (cache writes count as input), and a failed call gives
    its estimate back."""
    key = "anthropic:claude-test"
    await ratelimits.set_rate_limit(
        pool,
        key,
        requests_per_minute=60,
        input_tokens_per_minute=60,
        output_tokens_per_minute=60,
        window_s=3600,
    )
    await ratelimits.set_rate_limit(pool, "anthropic:other", requests_per_minute=60)
    gate = RunRateGate(pool, "anthropic:{model}")
    request = Request(
        model="claude-test",
        system=[TextBlock("s" * 40)],
        messages=[
            Message("user", [TextBlock("u" * 80)]),
            Message("assistant", [ToolUseBlock("toolu_1", "look", {"q": "abc"})]),  # 12
            Message("user", [ToolResultBlock("toolu_1", "r" * 30)]),
        ],
    )
    assert await gate.take(request) == 0.0
    assert await _levels(pool, key) == _approx(3599, 3600 - 40, 3600)  # 162 characters
    usage = Usage(input_tokens=100, output_tokens=20, cache_creation_input_tokens=5)
    await gate.settle(request, Response(request.messages[0], StopReason.END_TURN, usage), None)
    assert await _levels(pool, key) == _approx(3599, 3600 - 105, 3600 - 20)
    await gate.take(request)  # the estimate: the last call's 105
    assert await _levels(pool, key) == _approx(3598, 3600 - 210, 3580)
    failed = ModelError("api_error", "overloaded", retryable=True, status=529)
    await gate.settle(request, None, failed)  # nothing used: the 105 come back
    assert await _levels(pool, key) == _approx(3598, 3600 - 105, 3580)
    level = await pool.fetchval("SELECT requests FROM rate_limits WHERE key = 'anthropic:other'")
    assert level == 60.0  # another model's bucket untouched (full: a minute of 60)


async def test_a_429_without_retry_after_pauses_a_second_and_bad_headers_are_ignored(
    pool: asyncpg.Pool,
) -> None:
    await ratelimits.set_rate_limit(
        pool, "k", requests_per_minute=60, output_tokens_per_minute=60, window_s=3600
    )
    gate = RunRateGate(pool, "k")
    resp = Response(Message("assistant", [TextBlock("ok")]), StopReason.END_TURN, Usage(10, 5))
    resp.rate_limit_headers = {
        "anthropic-ratelimit-requests-remaining": "many",
        "anthropic-ratelimit-output-tokens-remaining": "7",
    }
    await gate.settle(_request(), resp, None)
    requests, _, output = await _levels(pool, "k")
    assert (requests, output) == _approx(3600, 7)  # "many" is no number: not followed
    err = ModelError("rate_limit_error", "slow down", retryable=True, status=429)
    await gate.settle(_request(), None, err)
    requests, _, _ = await _levels(pool, "k")
    assert requests == 0  # a 429: none left, whatever the bucket thought
    await ratelimits.set_rate_limit(pool, "k", requests_per_minute=6000)  # room again
    ok, wait = await _take(pool, "k")
    assert not ok and 0.5 < wait <= 1.0  # the default pause of one second


async def test_the_call_goes_ahead_when_the_database_is_unreachable(
    pool: asyncpg.Pool, dsn: str
) -> None:
    # an empty bucket: reachable, it would refuse the call
    await ratelimits.set_rate_limit(pool, "k", requests_per_minute=60, window_s=3600)
    await pool.execute("UPDATE rate_limits SET requests = 0 WHERE key = 'k'")
    assert not (await _take(pool, "k"))[0]
    closed = await db.create_pool(dsn, min_size=1, max_size=1)
    await closed.close()
    gate = RunRateGate(closed, "k")
    assert await gate.take(_request()) == 0.0  # not refused, no wait
    await gate.settle(_request(), None, None)  # nothing raised
