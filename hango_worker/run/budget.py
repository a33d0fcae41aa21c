"""Spend budgets before each model call: reserve the call's worst case, settle its cost.

Every worker shares the budgets in Postgres (store/budgets.py). Before a model call
(each retry too) the run reserves, in one statement on every budget of its tenant and
agent, the call's worst-case cost: its input estimated at 3 UTF-8 bytes per token (the
JSON of system, messages and tools), all of it priced at the dearest input rate (a 1 h
cache write), plus `max_tokens` of output (provider/prices.py). A grant holds that
amount (`budgets.reserved_usd`, one `budget_holds` row); after the call the hold is
settled with what the call cost (nothing for a failed call, the whole hold for one cut
short by a cancel or a shutdown). So `spent + reserved <= limit` after every grant, and
a budget is overspent only by calls whose cost exceeded their hold.

Refused: the run waits (`waiting`, reason `budget`, no lease, no slot: the checkpoint
of agent/batch.py's Waiting, as an approval wait) and the sweep queues it again once
the budget has room for what it asked (store/budgets.py WAKE: the window rolled over,
the limit was raised or the budget removed); or, with the budget's `on_exhausted:
fail`, the run fails with `budget_exhausted`. A model without a price cannot be
budgeted: the run fails with `budget_unpriced`.

Idle cost: which tenants and agents have budgets is one set per worker
(BudgetDirectory), loaded at start and refreshed by every sweep; a run of neither
makes no query, and a budget set takes effect at the next sweep of every worker.
A crash between reserve and settle leaks nothing for good: a hold names its run and
attempt, and the sweep gives it back once that attempt no longer runs.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from typing import Any, NoReturn

import asyncpg

from hango_worker.agent.batch import Waiting
from hango_worker.agent.control import RunControl, RunFailed
from hango_worker.provider.prices import PriceTable
from hango_worker.provider.types import Request, Response, Usage, compact_json
from hango_worker.run.io import CONNECTION_ERRORS
from hango_worker.store import budgets as sql
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import current_turn_span
from hango_worker.vocab import ErrorType

log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 3  # fewer bytes per token than any text the tokenizer sees in practice
RESERVE_TRIES = 5  # the database away: ask again after 0.5, 1, 2, 4 s, then give up
EXHAUSTED = "hango.budget.exhausted"
UNPRICED = "hango.budget.unpriced"


@dataclass(slots=True)
class BudgetDirectory:
    """Which tenants (tenant-wide budgets) and agents have a budget, per worker."""

    tenants: frozenset[str] = frozenset()
    agents: frozenset[str] = frozenset()
    loaded: bool = False

    def applies(self, tenant_id: str, agent_id: str) -> bool:
        return tenant_id in self.tenants or agent_id in self.agents

    async def refresh(self, pool: asyncpg.Pool) -> None:
        """Read the scopes again; the database away leaves the last ones."""
        try:
            rows = await pool.fetch(sql.SCOPES)
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as e:
            log.warning("reading the budgets failed: %s", e)
            return
        self.tenants = frozenset(r["tenant_id"] for r in rows if r["agent_id"] is None)
        self.agents = frozenset(r["agent_id"] for r in rows if r["agent_id"] is not None)
        self.loaded = True


def input_tokens_bound(request: Request) -> int:
    """The request's input tokens, estimated high: its JSON's UTF-8 bytes / 3."""
    parts: list[Any] = [b.to_dict() for b in request.system]
    parts += [m.to_dict() for m in request.messages]
    parts += [t.to_dict() for t in request.tools]
    parts += request.server_tools or []
    return math.ceil(len(compact_json(parts).encode()) / BYTES_PER_TOKEN)


def worst_case_usd(prices: PriceTable, request: Request) -> float | None:
    """The most the call can cost (None: its model has no price)."""
    n, out = input_tokens_bound(request), request.max_tokens
    ways = (  # every input token plain, as a 5 m cache write, as a 1 h cache write
        Usage(input_tokens=n, output_tokens=out),
        Usage(output_tokens=out, cache_creation_input_tokens=n),
        Usage(output_tokens=out, cache_creation_input_tokens=n, cache_creation_1h_input_tokens=n),
    )
    costs = [prices.cost(request.model, u) for u in ways]
    return None if any(c is None for c in costs) else max(c for c in costs if c is not None)


@dataclass(slots=True)
class Hold:
    id: int
    budget_ids: list[int]
    amount_usd: float


@dataclass(slots=True)
class RunBudgetGate:
    """One run attempt's gate on the fleet's budgets (agent/control.py BudgetGate)."""

    pool: asyncpg.Pool
    directory: BudgetDirectory
    prices: PriceTable
    control: RunControl
    run_id: str
    attempt: int
    tenant_id: str
    agent_id: str

    async def reserve(self, request: Request) -> Hold | None:
        if not self.directory.loaded:
            await self.directory.refresh(self.pool)
        if not self.directory.applies(self.tenant_id, self.agent_id):
            return None
        amount = worst_case_usd(self.prices, request)
        if amount is None:
            _unpriced(request.model)
        row = await self._reserve(amount)
        if not row["budgets"]:  # removed since the directory was read
            return None
        if not row["ok"]:
            self._refused(row, amount)
        return Hold(int(row["hold_id"]), list(row["budget_ids"]), amount)

    async def _reserve(self, amount: float) -> asyncpg.Record:
        args = (self.tenant_id, self.agent_id, amount, self.run_id, self.attempt)
        for i in range(RESERVE_TRIES):
            try:
                row = await self.pool.fetchrow(sql.RESERVE, *args)
                assert row is not None
                return row
            except (*CONNECTION_ERRORS, asyncpg.DeadlockDetectedError) as e:
                if i == RESERVE_TRIES - 1:
                    raise
                log.warning("budget reserve failed, trying again: %s", e)
                await self.control.sleep(0.5 * 2**i)
        raise AssertionError("unreachable")

    def _refused(self, row: asyncpg.Record, amount: float) -> NoReturn:
        refused: list[dict[str, Any]] = json.loads(row["refused"] or "[]")
        fail = any(b.get("on_exhausted") == "fail" for b in refused)
        action = "fail" if fail else "wait"
        tenant = str(row["tenant"] or self.tenant_id)
        metrics.BUDGET_EXHAUSTED.labels(tenant, action).inc()
        first = refused[0] if refused else {}
        current_turn_span().add_event(
            EXHAUSTED,
            {
                "hango.budget.period": str(first.get("period", "")),
                "hango.budget.limit_usd": float(first.get("limit_usd", 0.0)),
                "hango.budget.spent_usd": float(first.get("spent_usd", 0.0)),
                "hango.budget.reserved_usd": float(first.get("reserved_usd", 0.0)),
                "hango.budget.need_usd": amount,
                "hango.budget.action": action,
            },
        )
        if fail:
            raise RunFailed(
                {
                    "type": ErrorType.BUDGET_EXHAUSTED,
                    "message": f"a spend budget is spent: {_describe(refused)}; the next model "
                    f"call needs up to ${amount:.6f} (`hango-worker budgets show`)",
                }
            )
        metrics.RUNS_SUSPENDED.labels("budget").inc()
        raise Waiting(
            {"reason": "budget", "not_started": [], "need_usd": amount, "budgets": refused}
        )

    async def settle(
        self,
        hold: object,
        request: Request,
        response: Response | None,
        interrupted: bool = False,
    ) -> None:
        assert isinstance(hold, Hold)
        if response is not None:
            cost = self.prices.cost(request.model, response.usage)
            if cost is None:  # a unit without a price (a priority tier, …): the worst case
                cost = hold.amount_usd  # is charged, never 0 (docs/operations.md)
        else:
            cost = hold.amount_usd if interrupted else 0.0
        try:
            await self.pool.execute(sql.SETTLE, hold.id, hold.budget_ids, float(cost))
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as e:
            # the hold stays: the sweep gives it back once this attempt ends
            log.warning("budget settle failed: %s", e)


def _unpriced(model: str) -> NoReturn:
    current_turn_span().add_event(UNPRICED, {"gen_ai.request.model": model})
    raise RunFailed(
        {
            "type": ErrorType.BUDGET_UNPRICED,
            "message": f"model {model!r} has no price, and a spend budget needs one for "
            "every call (add it to HANGO_MODEL_PRICES)",
        }
    )


def _describe(refused: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{b.get('period')} budget ${float(b.get('limit_usd', 0)):.2f} "
        f"(spent ${float(b.get('spent_usd', 0)):.2f}, "
        f"held ${float(b.get('reserved_usd', 0)):.2f})"
        for b in refused
    )


async def sweep_budgets(pool: asyncpg.Pool, directory: BudgetDirectory | None) -> int:
    """The sweep's part: stale holds given back, waiting runs with room queued again,
    the directory and the gauges refreshed. Runs woken."""
    try:
        released = await pool.fetchrow(sql.RELEASE_STALE)
        if released is not None and released["released"]:
            metrics.BUDGET_HOLDS_RELEASED.inc(released["released"])
            log.info("gave back %d budget holds of attempts that ended", released["released"])
        woken = await pool.fetchrow(sql.WAKE)
        rows = await pool.fetch(sql.GAUGES)
    except (*CONNECTION_ERRORS, asyncpg.PostgresError) as e:
        log.warning("budget sweep failed: %s", e)
        return 0
    if directory is not None:
        directory.tenants = frozenset(r["tenant_id"] for r in rows if r["agent_id"] is None)
        directory.agents = frozenset(r["agent_id"] for r in rows if r["agent_id"] is not None)
        directory.loaded = True
    _gauges(rows)
    return int(woken["woken"]) if woken is not None else 0


def _gauges(rows: list[asyncpg.Record]) -> None:
    for g in (
        metrics.BUDGET_LIMIT,
        metrics.BUDGET_SPENT,
        metrics.BUDGET_RESERVED,
        metrics.BUDGET_WAITING,
    ):
        g.clear()  # a removed budget's series goes
    for r in rows:
        labels = (r["tenant"], r["agent"] or "", r["period"])
        metrics.BUDGET_LIMIT.labels(*labels).set(r["limit_usd"])
        metrics.BUDGET_SPENT.labels(*labels).set(r["spent_usd"])
        metrics.BUDGET_RESERVED.labels(*labels).set(r["reserved_usd"])
        metrics.BUDGET_WAITING.labels(*labels).set(r["waiting"])
