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
See docs/operations.md "Tenants, fairness and limits".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
from opentelemetry import trace

from hango_worker.agent.calls import RunCancelled
from hango_worker.agent.middleware import ModelResponse
from hango_worker.provider.types import ModelError, Request
from hango_worker.store import sql
from hango_worker.telemetry import metrics

log = logging.getLogger(__name__)

MAX_SLEEP_S = 5.0  # ask again at least this often (another worker may give back tokens)
CHARS_PER_TOKEN = 4


def key_for(template: str, model: str) -> str:
    return template.replace("{model}", model)


def estimate_tokens(request: Request) -> int:
    """A rough count of a request's input tokens (characters / 4), for the first call."""
    chars = sum(len(b.text) for b in request.system)
    for m in request.messages:
        for b in m.content:
            chars += len(getattr(b, "text", "") or "") + len(str(getattr(b, "input", "") or ""))
            chars += len(str(getattr(b, "content", "") or ""))
    return max(1, chars // CHARS_PER_TOKEN)


def _header_float(headers: dict[str, str] | None, name: str) -> float | None:
    if not headers or name not in headers:
        return None
    try:
        return float(headers[name])
    except ValueError:
        return None


@dataclass(slots=True)
class RunRateGate:
    """One run's gate (agent/calls.py RateGate) on the fleet's buckets."""

    pool: asyncpg.Pool
    key_template: str
    last_input: int = 0  # the run's previous call's input tokens (the next estimate)
    estimate: int = 0

    async def before(self, request: Request, cancel: asyncio.Event) -> float:
        key = key_for(self.key_template, request.model)
        self.estimate = self.last_input or estimate_tokens(request)
        started: float | None = None
        while (wait := await self._take(key)) > 0:
            started = time.monotonic() if started is None else started
            await self._sleep(min(wait, MAX_SLEEP_S), cancel)
        if started is None:
            return 0.0
        waited = time.monotonic() - started
        metrics.RATE_LIMIT_WAIT.labels(key).observe(waited)
        trace.get_current_span().add_event(
            "hango.rate_limit.wait",
            {"hango.rate_limit.key": key, "hango.rate_limit.wait_s": round(waited, 3)},
        )
        return waited

    async def _take(self, key: str) -> float:
        """0: granted (or no limit); else seconds until it would be."""
        try:
            row = await self.pool.fetchrow(sql.RATE_TAKE, key, float(self.estimate))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            log.warning("rate limit check failed, calling anyway: %s", e)
            return 0.0
        if row is None or row["ok"]:
            return 0.0
        return max(float(row["wait_s"]), 0.001)

    async def _sleep(self, delay: float, cancel: asyncio.Event) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cancel.wait(), timeout=delay)
        if cancel.is_set():
            raise RunCancelled()

    async def after(
        self, request: Request, response: ModelResponse | None, error: ModelError | None
    ) -> None:
        key = key_for(self.key_template, request.model)
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
