"""Calls that obey the run's control (agent/control.py): the model call, with its
retries and its wait for the rate limit, and, through `until_cancelled`, each tool
call.

Kept apart from the loop so that `agent/loop.py` is the turn's control flow only:
a cancel is one event (`RunControl.cancel`), raced by one function here, and a model
call's whole policy — wait until the rate limit grants it, reserve its worst case on
the spend budgets (run/budget.py; settled after the call), call, settle the bucket,
retry a retryable error after a backoff (bounded attempts, exponential jittered or
the server's `retry-after`), every wait cut short by a cancel — lives in one class.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from hango_worker.agent.control import (
    CancelEvent,
    RateGate,
    RunCancelled,
    RunControl,
    RunReleased,
)
from hango_worker.agent.middleware import ModelResponse
from hango_worker.provider.types import ModelError, Provider, Request, TextSink
from hango_worker.telemetry import genai
from hango_worker.tool.types import stop_task

T = TypeVar("T")

__all__ = ["ModelCaller", "RunCancelled", "RunReleased", "until_cancelled"]


async def until_cancelled(call: Awaitable[T], cancel: CancelEvent) -> T:
    """Await `call`, but stop it as soon as `cancel` is set (a short grace to unwind,
    then abandoned: `tool.types.stop_task`) and raise RunCancelled."""
    task = asyncio.ensure_future(call)
    # one future woken by whichever comes first: no task waiting on the event, no
    # asyncio.wait (a model call is raced on every turn)
    woken = asyncio.get_running_loop().create_future()

    def wake(*_: object) -> None:
        if not woken.done():
            woken.set_result(None)

    task.add_done_callback(wake)
    cancel.callbacks.append(wake)
    if cancel.is_set():
        wake()
    try:
        await woken
    except asyncio.CancelledError:
        await stop_task(task)
        raise
    finally:
        cancel.callbacks.remove(wake)
        task.remove_done_callback(wake)
    if task.done():
        return task.result()
    await stop_task(task)
    raise RunCancelled()


@dataclass(slots=True)
class ModelCaller:
    """One run's model calls: each waits for the rate limit, runs under a `chat` span
    and settles the bucket; retryable errors are retried; every call and every wait
    is interrupted by a cancel (RunCancelled)."""

    provider: Provider
    control: RunControl
    provider_name: str
    capture_content: bool

    async def call(self, request: Request, on_text: TextSink | None) -> ModelResponse:
        control = self.control
        attempt = 0
        while True:
            try:
                return await self._gated(request, on_text)
            except ModelError as e:
                attempt += 1
                if not e.retryable or attempt > control.retries:
                    genai.record_model_failure(e)
                    raise
                delay = control.backoff(e, attempt)
                genai.record_retry(e, attempt, delay)
                await control.sleep(delay)

    async def _gated(self, request: Request, on_text: TextSink | None) -> ModelResponse:
        gate = self.control.rate_gate
        if gate is None:
            return await self._budgeted(request, on_text)
        await self._wait_for_rate(gate, request)
        try:
            resp = await self._budgeted(request, on_text)
        except ModelError as e:
            await gate.settle(request, None, e)
            raise
        await gate.settle(request, resp, None)
        return resp

    async def _budgeted(self, request: Request, on_text: TextSink | None) -> ModelResponse:
        """The call under the spend budgets: its worst case held from right before the
        call until it is settled with the cost (run/budget.py)."""
        budget = self.control.budget_gate
        if budget is None:
            return await self._once(request, on_text)
        hold = await budget.reserve(request)  # a spent budget raises (wait or fail)
        if hold is None:
            return await self._once(request, on_text)
        try:
            resp = await self._once(request, on_text)
        except ModelError:
            await budget.settle(hold, request, None)
            raise
        except BaseException:  # cut short (cancel, shutdown, lost lease): the whole hold
            await budget.settle(hold, request, None, interrupted=True)
            raise
        await budget.settle(hold, request, resp)
        return resp

    async def _wait_for_rate(self, gate: RateGate, request: Request) -> None:
        """Ask the gate until it grants the call, sleeping as it says in between; the
        time waited joins the run's and is reported (span event, histogram)."""
        started: float | None = None
        while (wait := await gate.take(request)) > 0:
            started = time.monotonic() if started is None else started
            await self.control.sleep(wait)
        if started is not None:
            waited = time.monotonic() - started
            self.control.rate_wait_s += waited
            genai.record_rate_wait(gate.key(request), waited)

    async def _once(self, request: Request, on_text: TextSink | None) -> ModelResponse:
        with genai.chat_span(request, self.provider_name) as span:
            started = time.perf_counter()
            try:
                resp: ModelResponse = await until_cancelled(
                    self.provider.complete(request, on_text), self.control.cancel
                )
            except ModelError as e:
                genai.end_chat_span_error(span, request, self.provider_name, e, started)
                raise
            genai.end_chat_span(span, request, resp, self.provider_name, started)
            if self.capture_content:
                genai.capture_chat_content(span, request, resp)
            return resp
