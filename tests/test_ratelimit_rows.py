"""A `rate_limits` row edited by hand into nonsense (docs/operations.md, "A rate_limits
row edited by hand") must not hurt: the worker never stalls on it, other keys are
untouched, the operator gets one precise log line, a metric and a span event, and the
run goes on — a bucket whose levels or pause cannot be real is started again, limits
that cannot work as a bucket are ignored until `ratelimits set` fixes them."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import Message, Request, TextBlock
from hango_worker.run import ratelimit
from hango_worker.run.ratelimit import MAX_SLEEP_S, RunRateGate
from hango_worker.store import ratelimits, repo
from tests.worker_helpers import run_until_idle

LOGGER = "hango_worker.run.ratelimit"


def _request(model: str = "m") -> Request:
    return Request(model=model, messages=[Message("user", [TextBlock("hi " * 40)])])


def _invalid(key: str) -> float:
    return REGISTRY.get_sample_value("hango_rate_limit_invalid_total", {"key": key}) or 0.0


@pytest.fixture(autouse=True)
def _fresh_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ratelimit, "_reported", {})


async def _bucket(pool: asyncpg.Pool, key: str, edit: str) -> None:
    """A healthy bucket, then edited with plain SQL as an operator could."""
    await ratelimits.set_rate_limit(
        pool,
        key,
        requests_per_minute=60,
        input_tokens_per_minute=60_000,
        output_tokens_per_minute=60_000,
    )
    await pool.execute(f"UPDATE rate_limits SET {edit} WHERE key = $1", key)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.ERROR
    ]


# -- levels and pauses no bucket can reach: the bucket is started again --------------------

STUCK = {
    "requests -Infinity": "requests = '-Infinity'",
    "input tokens -1e300": "input_tokens = -1e300",
    "output tokens -Infinity": "output_tokens = '-Infinity'",
    "paused forever": "blocked_until = 'infinity'",
    "paused until the year 3000": "blocked_until = '3000-01-01'",
}


@pytest.mark.parametrize("edit", list(STUCK.values()), ids=list(STUCK))
async def test_a_bucket_that_would_wait_forever_is_reset_once_and_said_so(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, edit: str
) -> None:
    await _bucket(pool, "k", edit)
    gate = RunRateGate(pool, "k")
    before = _invalid("k")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        wait = await gate.take(_request())
    assert 0.0 < wait <= MAX_SLEEP_S  # a real wait again: the empty bucket refills
    row = await pool.fetchrow("SELECT * FROM rate_limits WHERE key = 'k'")
    assert row["blocked_until"] is None and row["requests"] < 1
    assert row["requests_per_minute"] == 60  # the limits stay as set
    assert _invalid("k") - before == 1
    [line] = _errors(caplog)
    assert "rate_limits row 'k' cannot be used" in line and "asks a call to wait" in line
    assert "reset" in line
    for _ in range(3):  # and it is a working bucket from now on: no more reports
        await gate.take(_request())
    assert _invalid("k") - before == 1 and len(_errors(caplog)) == 1


# -- values the bucket's own arithmetic heals: nothing to report ---------------------------

HEALED = {
    "requests NaN": "requests = 'NaN'",
    "requests +Infinity": "requests = 'Infinity'",
    "input tokens 1e300": "input_tokens = 1e300",
    "refilled in the far future": "refilled_at = '3000-01-01'",
    "refilled at +infinity": "refilled_at = 'infinity'",
    "refilled at -infinity": "refilled_at = '-infinity'",
    "paused since -infinity": "blocked_until = '-infinity'",
}


@pytest.mark.parametrize("edit", list(HEALED.values()), ids=list(HEALED))
async def test_levels_above_the_bucket_and_odd_times_heal_at_the_next_take(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, edit: str
) -> None:
    await _bucket(pool, "k", edit)
    before = _invalid("k")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        assert await RunRateGate(pool, "k").take(_request()) == 0.0
    row = await pool.fetchrow("SELECT * FROM rate_limits WHERE key = 'k'")
    assert 0 <= row["requests"] <= 60 and 0 <= row["input_tokens"] <= 60_000  # cut to size
    assert _invalid("k") == before and _errors(caplog) == []


# -- limits that cannot work as a bucket: ignored (the call goes ahead), reported ---------

UNUSABLE = {
    "window NaN": ("window_s = 'NaN'", "window_s is nan"),
    "window Infinity": ("window_s = 'Infinity'", "window_s is inf"),
    "window 1e-300": ("window_s = 1e-300", "never holds a request"),
}


@pytest.mark.parametrize("edit,why", list(UNUSABLE.values()), ids=list(UNUSABLE))
async def test_limits_that_cannot_work_are_ignored_and_reported_once_a_minute(
    pool: asyncpg.Pool, caplog: pytest.LogCaptureFixture, edit: str, why: str
) -> None:
    await _bucket(pool, "k", edit)
    gate = RunRateGate(pool, "k")
    before = _invalid("k")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for _ in range(3):
            assert await gate.take(_request()) == 0.0  # no wait: the key has no limit now
    assert _invalid("k") - before == 3  # counted every call
    [line] = _errors(caplog)  # logged once a minute per key
    assert "rate_limits row 'k' cannot be used" in line and why in line
    assert "ratelimits set" in line


async def test_a_bucket_that_could_never_grant_is_refused_by_ratelimits_set(
    pool: asyncpg.Pool,
) -> None:
    with pytest.raises(
        ValueError,
        match="holds less than one request and would never grant a call: give window_s of at least 1 s",
    ):
        await ratelimits.set_rate_limit(pool, "k", requests_per_minute=60, window_s=0.5)
    assert await ratelimits.list_rate_limits(pool) == []


async def test_null_where_the_bucket_needs_a_value_is_refused_by_the_table(
    pool: asyncpg.Pool,
) -> None:
    await _bucket(pool, "k", "requests = requests")
    for column in ("refilled_at", "requests", "input_tokens", "output_tokens", "window_s"):
        with pytest.raises(asyncpg.NotNullViolationError):
            await pool.execute(f"UPDATE rate_limits SET {column} = NULL WHERE key = 'k'")


# -- end to end: the worker, two keys, one of them broken ----------------------------------


async def _agent(pool: asyncpg.Pool, name: str, model: str) -> None:
    await repo.create_agent(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        name=name,
        model=model,
        system=[],
        tools=[],
        config={},
    )


async def _run(pool: asyncpg.Pool, agent: str) -> str:
    ids = await repo.enqueue(pool, tenant_id=repo.DEFAULT_TENANT_ID, agent=agent, input_text="go")
    return str(ids["run_id"])


@pytest.mark.parametrize("edit", ["blocked_until = 'infinity'", "window_s = 1e-300"])
async def test_the_worker_runs_through_a_broken_row_and_other_keys_keep_their_limit(
    pool: asyncpg.Pool, dsn: str, caplog: pytest.LogCaptureFixture, spans: Any, edit: str
) -> None:
    await _bucket(pool, "k:broken-model", edit)
    await ratelimits.set_rate_limit(pool, "k:good-model", requests_per_minute=1)  # holds 1
    await _agent(pool, "broken", "broken-model")
    await _agent(pool, "good", "good-model")
    runs = [await _run(pool, "broken"), await _run(pool, "good")]
    provider = ScriptedProvider([{"text": "done"}])
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        stats = await asyncio.wait_for(  # the worker does not stall on the broken key
            run_until_idle(dsn, provider, rate_limit_key="k:{model}"), timeout=60
        )
    rows = await pool.fetch(
        "SELECT id::text, status, usage FROM runs WHERE id = ANY($1::uuid[])", runs
    )
    assert {r["id"]: r["status"] for r in rows} == dict.fromkeys(runs, "succeeded")
    assert stats.finished == {"succeeded": 2}
    good = await pool.fetchrow("SELECT * FROM rate_limits WHERE key = 'k:good-model'")
    assert good["requests"] < 1 and good["blocked_until"] is None  # charged its one call
    lines = _errors(caplog)
    assert lines and all("'k:broken-model'" in line for line in lines)
    events = spans.events("hango.rate_limit.invalid")  # on the run's turn span
    assert events and {e.attributes["hango.rate_limit.key"] for e in events} == {"k:broken-model"}
    assert "cannot" not in events[0].attributes["hango.rate_limit.problem"]  # the reason itself
