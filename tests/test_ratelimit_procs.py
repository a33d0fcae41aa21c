"""Four worker processes against the fake Anthropic server with a rate limit: with the
fleet-wide limiter the server sees no 429 and no more than its rate, and every run
finishes; without it, the same load draws 429s (the test prints both counts).

Scaled to stay short: the server allows 480 requests per minute in a 0.5 s bucket (4 at
once, 8 more each second); 20 runs of two calls each. The fleet's bucket is 300 per
minute in a 0.4 s bucket (2 at once, 5 each second): with buckets this small, the
delay between a worker's grant and its request reaching the server (hundreds of ms on a
busy machine) matters, where against a real per-minute limit about 90% is margin
enough (docs/operations.md "Tenants, fairness and limits")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg

from hango_worker.store import ratelimits
from hango_worker.testing.fake_anthropic import FakeAnthropic, FakeRateLimit
from tests.procs import start_worker, stop_worker, wait_all_finished, worker_env
from tests.worker_helpers import enqueue, make_agent

RUNS = 20
CALLS = 2 * RUNS
RPM, WINDOW_S = 480, 0.5
SCRIPT = [
    {"tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}]},
    {"text": "It is 2."},
]


async def _drain(pool: asyncpg.Pool, dsn: str, tmp: Path, limiter: bool) -> FakeRateLimit:
    limit = FakeRateLimit(requests_per_minute=RPM, window_s=WINDOW_S)
    ids = [await enqueue(pool, f"run {i}") for i in range(RUNS)]
    with FakeAnthropic(SCRIPT, rate_limit=limit) as fake:
        env = worker_env(
            dsn,
            tmp / "unused.json",
            HANGO_MODEL_PROVIDER="anthropic",
            ANTHROPIC_API_KEY="test-key",
            ANTHROPIC_BASE_URL=fake.base_url,
            HANGO_WORKER_CONCURRENCY="4",
            HANGO_LEASE_S="30",
            HANGO_MODEL_RETRIES="20",
        )
        if limiter:
            env["HANGO_RATE_LIMIT_KEY"] = "anthropic"
        procs = [await start_worker(env, until_idle=True) for _ in range(4)]
        try:
            rows = await wait_all_finished(pool, ids, timeout=120)
        finally:
            await asyncio.gather(*(stop_worker(p) for p in procs))
    assert {r["status"] for r in rows} == {"succeeded"}
    return limit


async def test_four_workers_stay_under_the_providers_limit_only_with_the_limiter(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    await make_agent(pool, tools=["calculator"])
    await ratelimits.set_rate_limit(pool, "anthropic", requests_per_minute=300, window_s=0.4)
    on = await _drain(pool, dsn, tmp_path, limiter=True)
    off = await _drain(pool, dsn, tmp_path, limiter=False)
    print(
        f"429s with the limiter: {on.refused} (most in 1 s: {on.max_in_window(1.0)}); "
        f"without: {off.refused} (most in 1 s: {off.max_in_window(1.0)})"
    )
    assert on.refused == 0 and len(on.accepted) == CALLS
    # a bucket of 4 refilled at 8/s: never more than 12 in any second
    assert on.max_in_window(1.0) <= 12
    assert off.refused > 0, "without the limiter the same load should draw 429s"
