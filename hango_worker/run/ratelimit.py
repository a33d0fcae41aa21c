"""Fleet-wide model rate limits: a token bucket per key in Postgres, before each call.

Every worker takes from the same `rate_limits` row (store/sql.py RATE_TAKE: one
statement, atomic under the row lock): one request and the call's input tokens
(estimated: the run's previous call, else its characters / 4), while the output
bucket is not in debt. Refused, the run sleeps until the bucket would grant it (a cancel
cuts the sleep short), says so (a `hango.rate_limit.wait` span event, the
`waiting_for_rate_limit` seconds in its usage, the hango_rate_limit_wait_seconds
histogram) and asks again. After the call (RATE_SETTLE) the bucket is charged what the
call really used, and follows the provider: never more left than its
`anthropic-ratelimit-*-remaining` headers say, and a 429's `retry-after` pauses every
worker's calls on the key. No row for the key: no limit. The database unreachable:
the call goes ahead (the provider's own limit still holds; the SDK/loop retries 429s).
A row edited by hand into nonsense never holds a run up: a bucket that asks for a wait no
real bucket asks for (a level of -Infinity, a pause until the year 3000) is started again
(RATE_RESET), limits that cannot work as a bucket (a window_s of NaN, Infinity, or too
small to hold one request) are ignored; both are reported (a log line at most once a
minute per key, hango_rate_limit_invalid_total, a `hango.rate_limit.invalid` span event).
See docs/operations.md "Tenants, fairness and limits".
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
from opentelemetry import trace

from hango_worker.agent.middleware import ModelResponse
from hango_worker.provider import media_tokens
from hango_worker.provider.types import Block, ModelError, RawBlock, Request, ToolResultBlock
from hango_worker.store import sql
from hango_worker.telemetry import metrics
from hango_worker.vocab import ErrorType

log = logging.getLogger(__name__)

MAX_SLEEP_S = 5.0  # ask again at least this often (another worker may give back tokens)
# No bucket the workers keep asks a call to wait longer (a 429's retry-after, a debt of a
# few calls' tokens take seconds to minutes): a row that does was edited into nonsense.
MAX_WAIT_S = 3600.0
REPORT_EVERY_S = 60.0  # a broken row is logged at most this often per key and worker
CHARS_PER_TOKEN = 4


def key_for(template: str, model: str) -> str:
    return template.replace("{model}", model)


def estimate_tokens(request: Request) -> int:
    """A rough count of a request's input tokens (characters / 4, images and PDFs as
    the API documents them: provider/media_tokens.py), for the first call."""
    chars, media = sum(len(b.text) for b in request.system), 0
    for m in request.messages:
        for b in m.content:
            chars += len(getattr(b, "text", "") or "") + len(str(getattr(b, "input", "") or ""))
            chars += len(str(getattr(b, "content", "") or ""))
            media += _media_tokens(b)
    return max(1, chars // CHARS_PER_TOKEN + media)


def _media_tokens(b: Block) -> int:
    if type(b) is RawBlock:
        return media_tokens.block_tokens(b.data, b.wire) or 0
    if type(b) is ToolResultBlock and b.blocks:
        sent = b.wire or b.blocks
        return sum(
            media_tokens.block_tokens(part, sent[i] if i < len(sent) else None) or 0
            for i, part in enumerate(b.blocks)
            if isinstance(part, dict)
        )
    return 0


def _header_float(headers: dict[str, str] | None, name: str) -> float | None:
    if not headers or name not in headers:
        return None
    try:
        return float(headers[name])
    except ValueError:
        return None


@dataclass(slots=True)
class RunRateGate:
    """One run's gate (agent/control.py RateGate) on the fleet's buckets; the caller
    (agent/calls.py ModelCaller) does the waiting, cut short by a cancel."""

    pool: asyncpg.Pool
    key_template: str
    last_input: int = 0  # the run's previous call's input tokens (the next estimate)
    estimate: int = 0
    place: str = ""  # "@platform:region" off the Anthropic API: a bucket per platform, region

    def key(self, request: Request) -> str:
        return key_for(self.key_template, request.model) + self.place

    async def take(self, request: Request) -> float:
        """0: go (granted, no limit, or a bucket that cannot work: reported); else
        seconds to sleep before asking again."""
        key = self.key(request)
        self.estimate = self.last_input or estimate_tokens(request)
        row = await self._take(key)
        if row is not None and row["i_cap"] is not None and self.estimate > row["i_cap"]:
            raise _too_small(key, float(row["i_cap"]), self.estimate)
        if row is not None and _absurd_wait(row):  # levels or pause edited into nonsense
            row = await self._reset(key, float(row["wait_s"]))
        if row is None or row["ok"]:
            return 0.0
        return min(max(float(row["wait_s"]), 0.001), MAX_SLEEP_S)

    async def _take(self, key: str) -> asyncpg.Record | None:
        """RATE_TAKE's answer; None: go ahead (no row, the database away, limits that
        cannot work)."""
        try:
            row = await self.pool.fetchrow(sql.RATE_TAKE, key, float(self.estimate))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            log.warning("rate limit check failed for key %r, calling anyway: %s", key, e)
            return None
        if row is not None and (why := _unusable_limits(row)) is not None:
            _report(key, why, "this key's limit is ignored until `ratelimits set` fixes it")
            return None
        return row

    async def _reset(self, key: str, wait_s: float) -> asyncpg.Record | None:
        """Start the key's bucket again (RATE_RESET) and ask again; None: go ahead."""
        why = f"it asks a call to wait {wait_s:.6g} s, more than any bucket the workers keep"
        _report(key, why, "the bucket is reset: empty, refilling from now, not paused")
        try:
            await self.pool.fetchrow(sql.RATE_RESET, key)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            log.warning("rate limit reset failed for key %r, calling anyway: %s", key, e)
            return None
        row = await self._take(key)
        return None if row is not None and _absurd_wait(row) else row

    async def settle(
        self, request: Request, response: ModelResponse | None, error: ModelError | None
    ) -> None:
        key = self.key(request)
        headers: dict[str, str] | None = None
        used_in = used_out = 0
        retry_after = None
        if response is not None:
            u = response.usage
            used_in = u.input_tokens + u.cache_creation_input_tokens
            used_out = u.output_tokens
            self.last_input = used_in
            headers = getattr(response, "rate_limit_headers", None)
        elif error is not None and error.status == 429:
            metrics.RATE_LIMITED_CALLS.labels(key).inc()
            retry_after = error.retry_after_s if error.retry_after_s is not None else 1.0
        else:
            used_in = 0  # nothing consumed: give the estimate back
        args: list[Any] = [key, float(used_in - self.estimate), float(used_out)]
        args += [_header_float(headers, f"anthropic-ratelimit-{n}-remaining") for n in _NAMES]
        if retry_after is not None:
            args[3] = 0.0
        args.append(retry_after)
        try:
            await self.pool.execute(sql.RATE_SETTLE, *args)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            log.warning("rate limit settle failed: %s", e)


_NAMES = ("requests", "input-tokens", "output-tokens")


def _too_small(key: str, cap: float, need: int) -> ModelError:
    """The run's calls need more input tokens than the key's whole bucket holds: no wait
    would ever grant one within the limit (and a provider limit that small refuses it)."""
    metrics.RATE_LIMIT_TOO_SMALL.labels(key).inc()
    return ModelError(
        ErrorType.RATE_LIMIT_TOO_SMALL,
        f"rate limit {key!r} holds at most {cap:.0f} input tokens (input_tokens_per_minute "
        f"x window_s / 60) and this call needs about {need}: raise --input-tpm (or "
        "--window-s) with `ratelimits set`, then `runs resume` the run",
        retryable=False,
    )


def _absurd_wait(row: asyncpg.Record) -> bool:
    wait = float(row["wait_s"])
    return not row["ok"] and not (math.isfinite(wait) and wait <= MAX_WAIT_S)


def _unusable_limits(row: asyncpg.Record) -> str | None:
    """What makes a key's limits unable to work as a bucket (a hand-edited row), or None."""
    window, rpm = float(row["window_s"]), row["rpm"]
    if not math.isfinite(window):
        return f"window_s is {window} (the bucket would have no size)"
    if rpm is not None and rpm * window / 60.0 < 1:
        return (
            f"requests_per_minute x window_s / 60 = {rpm} x {window:g} / 60 is below 1: "
            "the bucket never holds a request"
        )
    return None


_reported: dict[str, float] = {}  # key -> when its broken row was last logged (monotonic)


def _report(key: str, why: str, then: str) -> None:
    """A broken `rate_limits` row: counted each time, logged at most once a minute per key."""
    metrics.RATE_LIMIT_INVALID.labels(key).inc()
    trace.get_current_span().add_event(
        "hango.rate_limit.invalid", {"hango.rate_limit.key": key, "hango.rate_limit.problem": why}
    )
    now = time.monotonic()
    if now - _reported.get(key, -REPORT_EVERY_S) >= REPORT_EVERY_S:
        _reported[key] = now
        log.error("rate_limits row %r cannot be used: %s; %s", key, why, then)
