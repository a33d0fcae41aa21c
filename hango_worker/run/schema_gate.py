"""Claim only while the database's schema serves this code.

A worker knows the schema range it supports (store/migrate.py `schema_problem`: the
database at this code's head, or newer while every revision above still serves it).
Outside that range it stays up and not ready (`/readyz` says why), claims nothing and
runs no sweep, and says so in one log line a minute, instead of failing on every
statement (docs/operations.md, "Upgrades and rollback").

The check is one small query: every `every_s` while the schema serves this code, every
`blocked_every_s` while it does not (so a worker starts within seconds of the migration
it waits for), and at once after a statement failed on an object the schema lacks
(`suspect`, SQLSTATE class 42: an undefined table, column or function).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from hango_worker.store.migrate import read_schema_state, schema_problem
from hango_worker.telemetry import metrics

log = logging.getLogger(__name__)

CHECK_EVERY_S = 60.0
BLOCKED_EVERY_S = 5.0
LOG_EVERY_S = 60.0


def schema_mismatch(e: BaseException) -> bool:
    """A statement failed on a table, column or function the schema lacks (class 42)."""
    state = getattr(e, "sqlstate", None)
    return isinstance(state, str) and state in ("42P01", "42703", "42883", "42704")


class SchemaGate:
    """Whether this worker may claim now; see the module docstring."""

    def __init__(
        self,
        pool: Any,
        *,
        every_s: float = CHECK_EVERY_S,
        blocked_every_s: float = BLOCKED_EVERY_S,
        log_every_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.every_s = every_s
        self.blocked_every_s = blocked_every_s
        self.log_every_s = log_every_s
        self.clock = clock
        self.problem: str | None = None
        self._next = 0.0
        self._logged: float | None = None
        self.checks = 0  # schema checks made (the test suite reads it)
        metrics.SCHEMA_SERVED.set(1)

    def suspect(self) -> None:
        """Check again before the next claim (a statement failed on a missing object)."""
        self._next = 0.0

    async def open(self) -> bool:
        """True while the schema serves this code (checked when due)."""
        now = self.clock()
        if now >= self._next:
            await self._check(now)
        return self.problem is None

    async def _check(self, now: float) -> None:
        self.checks += 1
        try:
            problem = schema_problem(*await read_schema_state(self.pool))
        except Exception as e:  # unreachable: the claim says so; keep what we knew
            log.debug("schema check failed: %s", e)
            self._next = now + self.blocked_every_s
            return
        self._next = now + (self.every_s if problem is None else self.blocked_every_s)
        if problem is None:
            if self.problem is not None:
                log.warning("claiming again: the database schema serves this code")
            self._logged = None
        elif problem != self.problem or self._due(now):
            log.warning("not claiming: %s", problem)
            self._logged = now
        self.problem = problem
        metrics.SCHEMA_SERVED.set(1 if problem is None else 0)

    def _due(self, now: float) -> bool:
        return self._logged is None or now - self._logged >= self.log_every_s
