"""`until_cancelled` (agent/calls.py): a call raced against the run's cancel flag.

The run's flag is a `CancelEvent` (agent/control.py), which calls back when set, so the
race needs no task waiting on it."""

from __future__ import annotations

import asyncio

import pytest

from hango_worker.agent.calls import RunCancelled, until_cancelled
from hango_worker.agent.control import CancelEvent, RunControl


def test_a_run_control_cancel_flag_calls_back() -> None:
    control = RunControl()
    assert isinstance(control.cancel, CancelEvent)
    seen: list[int] = []
    control.cancel.callbacks.append(lambda: seen.append(1))
    control.cancel.set()
    assert seen == [1] and control.cancel.is_set()


async def test_the_call_s_result_comes_back_and_nothing_is_left_listening() -> None:
    cancel = CancelEvent()

    async def call() -> str:
        await asyncio.sleep(0)
        return "answer"

    assert await until_cancelled(call(), cancel) == "answer"
    assert cancel.callbacks == []


async def test_a_cancel_during_the_call_stops_it_and_raises_run_cancelled() -> None:
    cancel = CancelEvent()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def call() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "never"

    async def cancel_soon() -> None:
        await started.wait()
        cancel.set()

    setter = asyncio.ensure_future(cancel_soon())
    with pytest.raises(RunCancelled):
        await asyncio.wait_for(until_cancelled(call(), cancel), timeout=10)
    await setter
    assert stopped.is_set()  # the call was cancelled, not left running
    assert cancel.callbacks == []


async def test_a_cancel_set_before_the_call_raises_at_once() -> None:
    cancel = CancelEvent()
    cancel.set()
    ran: list[int] = []

    async def call() -> str:
        await asyncio.sleep(30)
        ran.append(1)
        return "never"

    with pytest.raises(RunCancelled):
        await asyncio.wait_for(until_cancelled(call(), cancel), timeout=10)
    assert ran == [] and cancel.callbacks == []


async def test_cancelling_the_racing_task_stops_the_call_too() -> None:
    cancel = CancelEvent()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def call() -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        finally:
            stopped.set()

    racer = asyncio.ensure_future(until_cancelled(call(), cancel))
    await started.wait()
    racer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await racer
    assert stopped.is_set() and cancel.callbacks == []


async def test_a_call_error_is_raised_as_it_is() -> None:
    async def call() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await until_cancelled(call(), CancelEvent())
