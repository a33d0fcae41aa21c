"""A run attempt's control state, in one object: what may stop it, and the bounds its
calls keep.

The worker makes one `RunControl` per claimed run and keeps it; the run's `RunIO`
carries it (`RunIO.control`), so the worker, the fenced writes and the loop all see
the same flags: the worker sets `cancel` (a `runs cancel`, seen by LISTEN or the
heartbeat), `shutdown` (SIGTERM) and `lost` (the heartbeat found the lease taken
over); a fenced write sets `lost` or `cancel` when its statement says so. The loop
reads them at every turn boundary, races tool and model calls against `cancel`
(agent/calls.py), runs at most `max_parallel_tools` calls at once, and retries and
rate-limits model calls by the rest (agent/calls.py: ModelCaller).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from hango_worker.provider.types import ModelError, Request, Response

DEFAULT_MAX_PARALLEL_TOOLS = 8


class RunCancelled(Exception):
    pass


class RunReleased(Exception):
    """A wait before a model call (a retry's backoff, the fleet rate limit) was cut
    short by a shutdown: the run is handed back (`released`) at once, before the call;
    nothing it did is lost (docs/system-architecture.md, "Graceful shutdown")."""


class RunFailed(Exception):
    """A gate before a model call ends the run as failed with `error` ({type, message}),
    e.g. a spent budget whose `on_exhausted` is fail (run/budget.py)."""

    def __init__(self, error: dict[str, str]) -> None:
        super().__init__(error.get("message"))
        self.error = error


class BudgetGate(Protocol):
    """The fleet's spend budgets (run/budget.py): `reserve` before each model call (None:
    no budget applies; it may raise `agent.batch.Waiting` or RunFailed when a budget is
    spent), `settle` after it with what the call cost."""

    async def reserve(self, request: Request) -> object | None: ...

    async def settle(
        self,
        hold: object,
        request: Request,
        response: Response | None,
        interrupted: bool = False,
    ) -> None:
        """Charge the call: its response's cost, nothing for a failed call, the whole
        hold for one cut short (`interrupted`: what it used is unknown)."""
        ...


class RateGate(Protocol):
    """The fleet-wide model rate limit (run/ratelimit.py): asked before each model call
    (retries too) until it grants the call, told after it what the call used."""

    def key(self, request: Request) -> str: ...

    async def take(self, request: Request) -> float:
        """0.0: go (granted, or no limit); else seconds to wait before asking again."""
        ...

    async def settle(
        self, request: Request, response: Response | None, error: ModelError | None
    ) -> None: ...


class CancelEvent(asyncio.Event):
    """A run's cancel flag: an `asyncio.Event` that also calls back when it is set, so a
    call raced against it (agent/calls.py: until_cancelled) needs no task waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.callbacks: list[Callable[[], None]] = []

    def set(self) -> None:
        super().set()
        for cb in list(self.callbacks):
            cb()


@dataclass(slots=True)
class RunControl:
    cancel: CancelEvent = field(default_factory=CancelEvent)
    # set by a shutdown (`shutdown = True`): hand the run back at its next turn boundary,
    # or at once from a wait before a model call (`sleep`)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    lost: bool = False  # another worker holds the lease: write nothing more
    max_parallel_tools: int = DEFAULT_MAX_PARALLEL_TOOLS  # calls of one response at once
    retries: int = 4  # of a retryable model error
    retry_base_s: float = 0.5
    retry_cap_s: float = 20.0
    rate_gate: RateGate | None = None
    rate_wait_s: float = 0.0  # time the run waited for the rate limit (all attempts)
    budget_gate: BudgetGate | None = None  # spend budgets (run/budget.py)

    @property
    def shutdown(self) -> bool:
        return self.stopping.is_set()

    @shutdown.setter
    def shutdown(self, value: bool) -> None:
        if value:
            self.stopping.set()
        else:
            self.stopping.clear()

    def stop_requested(self) -> Literal["cancel", "shutdown"] | None:
        if self.cancel.is_set():
            return "cancel"
        return "shutdown" if self.shutdown else None

    def backoff(self, e: ModelError, attempt: int) -> float:
        """The wait before retry `attempt`: the server's `retry-after`, else exponential
        jittered backoff."""
        if e.retry_after_s is not None:
            return float(e.retry_after_s)
        ceiling = min(self.retry_cap_s, self.retry_base_s * 2.0 ** (attempt - 1))
        return ceiling * random.uniform(0.5, 1.0)

    async def sleep(self, delay: float) -> None:
        """Sleep before a model call, cut short by a cancel (then RunCancelled) or a
        shutdown (then RunReleased: a run waiting out a backoff or the rate limit is
        handed back now, not at the end of the grace)."""
        if not self.cancel.is_set() and not self.stopping.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (self.cancel, self.stopping)]
            try:
                await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        if self.cancel.is_set():
            raise RunCancelled()
        if self.stopping.is_set():
            raise RunReleased()

    def rate_wait(self) -> float | None:
        """The run's rate-limit wait for its usage record (None: no limit, none waited)."""
        return self.rate_wait_s if self.rate_gate is not None or self.rate_wait_s else None
