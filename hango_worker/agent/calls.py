"""Calls that race the run's cancel event: the model call (with its retries) and,
through `until_cancelled`, each tool call.

Kept apart from the loop so that `agent/loop.py` is the turn's control flow only:
a cancel is one event (`RunIO.cancel_event`), raced by one function here, and
the model's retry policy — bounded attempts, exponential jittered backoff or the
server's `retry-after`, a backoff that a cancel cuts short — lives in one class.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from hango_worker.agent.middleware import ModelResponse
from hango_worker.provider.types import ModelError, Provider, Request, TextSink
from hango_worker.telemetry import genai
from hango_worker.tool.types import stop_task

T = TypeVar("T")


class RunCancelled(Exception):
    pass


async def until_cancelled(call: Awaitable[T], cancel: asyncio.Event) -> T:
    """Await `call`, but stop it as soon as `cancel` is set (a short grace to unwind,
    then abandoned: `tool.types.stop_task`) and raise RunCancelled."""
    task = asyncio.ensure_future(call)
    waiter = asyncio.ensure_future(cancel.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        await stop_task(task)
        raise
    finally:
        waiter.cancel()
    if task.done():
        return task.result()
    await stop_task(task)
    raise RunCancelled()


class RateGate(Protocol):
    """Before each model call (retries too): wait for the fleet-wide rate limit
    (run/ratelimit.py); after it: what the call used and what the provider said."""

    async def before(self, request: Request, cancel: asyncio.Event) -> float:
        """Seconds waited (0.0: none). Raises RunCancelled when cancelled meanwhile."""
        ...

    async def after(
        self, request: Request, response: ModelResponse | None, error: ModelError | None
    ) -> None: ...


@dataclass(slots=True)
class ModelCaller:
    """One run's model calls: a `chat` span each, retryable errors retried, every
    call and every backoff interrupted by a cancel (RunCancelled)."""

    provider: Provider
    cancel: asyncio.Event
    retries: int
    retry_base_s: float
    retry_cap_s: float
    provider_name: str
    capture_content: bool
    gate: RateGate | None = None
    waited_s: float = 0.0  # this run's time waiting for the rate limit (all attempts)

    async def call(self, request: Request, on_text: TextSink | None) -> ModelResponse:
        attempt = 0
        while True:
            try:
                return await self._gated(request, on_text)
            except ModelError as e:
                attempt += 1
                if not e.retryable or attempt > self.retries:
                    genai.record_model_failure(e)
                    raise
                delay = self._backoff(e, attempt)
                genai.record_retry(e, attempt, delay)
                await self._sleep(delay)

    def _backoff(self, e: ModelError, attempt: int) -> float:
        if e.retry_after_s is not None:
            return float(e.retry_after_s)
        ceiling = min(self.retry_cap_s, self.retry_base_s * 2.0 ** (attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)

    async def _gated(self, request: Request, on_text: TextSink | None) -> ModelResponse:
        if self.gate is None:
            return await self._once(request, on_text)
        self.waited_s += await self.gate.before(request, self.cancel)
        try:
            resp = await self._once(request, on_text)
        except ModelError as e:
            await self.gate.after(request, None, e)
            raise
        await self.gate.after(request, resp, None)
        return resp

    async def _once(self, request: Request, on_text: TextSink | None) -> ModelResponse:
        with genai.chat_span(request, self.provider_name) as span:
            started = time.perf_counter()
            try:
                resp: ModelResponse = await until_cancelled(
                    self.provider.complete(request, on_text), self.cancel
                )
            except ModelError as e:
                genai.end_chat_span_error(span, request, self.provider_name, e, started)
                raise
            genai.end_chat_span(span, request, resp, self.provider_name, started)
            if self.capture_content:
                genai.capture_chat_content(span, request, resp)
            return resp

    async def _sleep(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.cancel.wait(), timeout=delay)
        if self.cancel.is_set():
            raise RunCancelled()
