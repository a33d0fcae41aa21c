"""A rate limit too small for one request: refused when set where that is decidable (a
bucket holding less than one token), else the run fails at once with a named error
(`rate_limit_too_small`) instead of waiting on a bucket that can never grant the call
(run/ratelimit.py, store/ratelimits.py)."""

from __future__ import annotations

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.store import ratelimits
from tests.helpers import scripted
from tests.test_cli import cli
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle


async def test_a_token_bucket_smaller_than_one_token_is_refused_when_set(
    pool: asyncpg.Pool,
) -> None:
    """Proves: like --rpm, a tokens-per-minute bucket that holds less than one token is
    refused in one line naming the limit, and nothing is written."""
    for kw in ({"input_tokens_per_minute": 10}, {"output_tokens_per_minute": 10}):
        with pytest.raises(ValueError, match="holds less than one token") as e:
            await ratelimits.set_rate_limit(pool, "k", window_s=1.0, **kw)  # type: ignore[arg-type]
        assert "\n" not in str(e.value) and next(iter(kw)) in str(e.value)
    assert await pool.fetchval("SELECT count(*) FROM rate_limits") == 0


def test_the_cli_refuses_it_in_one_line(dsn: str) -> None:
    p = cli(dsn, "ratelimits", "set", "k", "--input-tpm", "10", "--window-s", "1", ok=False)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "holds less than one token" in line


async def test_a_call_bigger_than_the_whole_bucket_fails_the_run_at_once(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Proves: an input bucket of 100 tokens and a first message of about 1,000 tokens:
    the run fails with `rate_limit_too_small` naming the key, before any model call,
    without waiting (before: it took the whole bucket once a window and under-charged,
    or, with a provider limit that small, 429s for ever); the bucket keeps its tokens."""
    await make_agent(pool, tools=[])
    run_id = await enqueue(pool, "word " * 800)
    await ratelimits.set_rate_limit(pool, "anthropic", input_tokens_per_minute=100)
    before = REGISTRY.get_sample_value(
        "hango_rate_limit_too_small_total", {"key": "anthropic"}
    ) or 0.0  # fmt: skip
    provider = scripted({"text": "never"})
    stats = await run_until_idle(dsn, provider, rate_limit_key="anthropic")
    assert stats.finished == {"failed": 1}
    run = await details(pool, run_id)
    assert run["error"]["type"] == "rate_limit_too_small"
    message = run["error"]["message"]
    assert "'anthropic' holds at most 100 input tokens" in message and "\n" not in message
    assert provider.calls == 0
    assert float(run["usage"].get("waiting_for_rate_limit", 0)) < 1.0
    level = await pool.fetchval("SELECT input_tokens FROM rate_limits WHERE key = 'anthropic'")
    assert level == pytest.approx(100, abs=5)  # nothing taken
    after = REGISTRY.get_sample_value("hango_rate_limit_too_small_total", {"key": "anthropic"})
    assert after == before + 1
