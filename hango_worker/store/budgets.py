"""Spend budgets (the `budgets` and `budget_holds` tables): set, list and remove them,
and the statements the workers run on them (run/budget.py; docs/operations.md "Spend
budgets").

A budget is USD per tenant (every agent of it) or per agent, per UTC calendar day or
month. Before each model call a worker reserves the call's worst-case cost on every
budget of the run's tenant and agent at once (RESERVE: one statement, the budget rows
locked in id order; it grants only when each has room for the whole amount, so
`spent + reserved <= limit` holds after every grant), and settles the hold after the
call with what the call cost (SETTLE). A hold whose attempt no longer runs (the worker
died, the lease was taken over) is released by the sweep (RELEASE_STALE). A window
rolls over lazily: the first statement that touches a row in a new window starts it
again (`spent_usd` 0; holds in flight keep their reservations and are charged to the
window in which they settle).

Lock order, the same in every statement: a hold row before budget rows, budget rows in
id order, so two statements never wait for each other in a cycle.
"""

from __future__ import annotations

import math
from typing import Any

import asyncpg

from hango_worker.store.repo import NotFound

PERIODS = ("day", "month")
ON_EXHAUSTED = ("wait", "fail")
MAX_LIMIT_USD = 1e12  # a sanity bound (any larger is no budget at all)
NIL = "'00000000-0000-0000-0000-000000000000'::uuid"

# The start of a row's current window (UTC calendar day or month).
WINDOW = "(date_trunc({p}, now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')"
_BW = WINDOW.format(p="b.period")
_TW = WINDOW.format(p="t.period")
# What a row spent in its current window (0 once the window rolled over).
_SPENT = f"(CASE WHEN b.window_start < {_BW} THEN 0 ELSE b.spent_usd END)"

# Which tenants and agents have a budget (run/budget.py BudgetDirectory).
SCOPES = "SELECT DISTINCT tenant_id::text AS tenant_id, agent_id::text AS agent_id FROM budgets"

# $1 tenant, $2 agent, $3 amount (USD), $4 run, $5 attempt. Every budget of the tenant
# and agent is locked (id order) and read as it is now; the hold is made on all of them
# or on none. `refused` names the budgets without room.
RESERVE = f"""
WITH b AS MATERIALIZED (
    SELECT id, period, limit_usd, on_exhausted, spent_usd, reserved_usd, window_start
    FROM budgets WHERE tenant_id = $1::uuid AND (agent_id IS NULL OR agent_id = $2::uuid)
    ORDER BY id FOR UPDATE
), s AS MATERIALIZED (
    SELECT b.id, b.period, b.limit_usd, b.on_exhausted, b.reserved_usd, {_SPENT} AS spent,
        {_SPENT} + b.reserved_usd + $3::float8 <= b.limit_usd AS room, {_BW} AS win
    FROM b
), ok AS MATERIALIZED (
    SELECT count(*) AS n, coalesce(bool_and(room), true) AS ok,
        array_agg(id ORDER BY id) AS ids FROM s
), u AS (
    UPDATE budgets t SET reserved_usd = t.reserved_usd + $3::float8,
        spent_usd = CASE WHEN t.window_start < s.win THEN 0 ELSE t.spent_usd END,
        window_start = greatest(t.window_start, s.win)
    FROM s WHERE t.id = s.id AND (SELECT ok FROM ok)
    RETURNING t.id
), h AS (
    INSERT INTO budget_holds (run_id, attempt, budget_ids, amount_usd)
    SELECT $4::uuid, $5::int, ok.ids, $3::float8 FROM ok WHERE ok.ok AND ok.n > 0
    RETURNING id
)
SELECT ok.n AS budgets, ok.ok, ok.ids AS budget_ids, (SELECT id FROM h) AS hold_id,
    (SELECT jsonb_agg(jsonb_build_object('id', s.id, 'period', s.period,
        'limit_usd', s.limit_usd, 'spent_usd', s.spent, 'reserved_usd', s.reserved_usd,
        'on_exhausted', s.on_exhausted) ORDER BY s.id)
     FROM s WHERE NOT s.room)::text AS refused,
    CASE WHEN NOT ok.ok THEN (SELECT name FROM tenants WHERE id = $1::uuid) END AS tenant
FROM ok
"""

# $1 hold, $2 its budgets, $3 what the call cost. The hold is deleted first (the sweep
# may have released it already: then only the spend is added), then the budgets are
# locked in id order and charged in their current window.
SETTLE = f"""
WITH h AS (
    DELETE FROM budget_holds WHERE id = $1 RETURNING amount_usd
), l AS MATERIALIZED (
    SELECT id FROM budgets
    WHERE id = ANY($2::bigint[]) AND (SELECT count(*) FROM h) >= 0
    ORDER BY id FOR UPDATE
)
UPDATE budgets t SET
    reserved_usd = greatest(t.reserved_usd - coalesce((SELECT amount_usd FROM h), 0), 0),
    spent_usd = CASE WHEN t.window_start < {_TW} THEN 0 ELSE t.spent_usd END + $3::float8,
    window_start = greatest(t.window_start, {_TW})
FROM l WHERE t.id = l.id
"""

# The sweep: holds whose attempt no longer runs (a worker died between reserve and
# settle, or lost its lease) give their reservations back.
RELEASE_STALE = """
WITH d AS (
    DELETE FROM budget_holds h WHERE NOT EXISTS (
        SELECT 1 FROM runs r
        WHERE r.id = h.run_id AND r.status = 'running' AND r.attempt = h.attempt)
    RETURNING h.budget_ids, h.amount_usd
), per AS MATERIALIZED (
    SELECT x.id, sum(d.amount_usd) AS amount FROM d, unnest(d.budget_ids) AS x(id)
    GROUP BY x.id
), l AS MATERIALIZED (
    SELECT id FROM budgets WHERE id IN (SELECT id FROM per) ORDER BY id FOR UPDATE
), u AS (
    UPDATE budgets t SET reserved_usd = greatest(t.reserved_usd - per.amount, 0)
    FROM per, l WHERE t.id = per.id AND l.id = per.id
    RETURNING 1
)
SELECT (SELECT count(*) FROM d) AS released, (SELECT count(*) FROM u) AS budgets
"""

# Runs waiting for a budget go back to the queue once every budget of their tenant and
# agent has room for what they asked (`waiting_for.need_usd`): the window rolled over,
# the budget was raised or removed, or calls in flight settled below their holds.
WAKE = f"""
WITH w AS (
    UPDATE runs r SET status = 'queued', queued_at = now()
    WHERE r.status = 'waiting' AND r.waiting_for->>'reason' = 'budget'
      AND NOT EXISTS (
        SELECT 1 FROM budgets b
        WHERE b.tenant_id = r.tenant_id AND (b.agent_id IS NULL OR b.agent_id = r.agent_id)
          AND b.limit_usd - b.reserved_usd - {_SPENT} < CASE
              WHEN jsonb_typeof(r.waiting_for->'need_usd') = 'number'
              THEN (r.waiting_for->>'need_usd')::float8 ELSE 0 END)
    RETURNING r.id
), n AS (SELECT pg_notify('hango_runs', w.id::text) FROM w)
SELECT (SELECT count(*) FROM w) AS woken, (SELECT count(*) FROM n) AS notified
"""

_LIST = f"""
SELECT b.id, tn.name AS tenant, b.tenant_id::text AS tenant_id, a.name AS agent,
    b.agent_id::text AS agent_id, b.period, b.limit_usd, b.on_exhausted,
    {_SPENT} AS spent_usd, b.reserved_usd, {_BW} AS window_start,
    {_BW} + ('1 ' || b.period)::interval AS window_end,
    (SELECT count(*) FROM runs r WHERE r.status = 'waiting'
        AND r.waiting_for->>'reason' = 'budget' AND r.tenant_id = b.tenant_id
        AND (b.agent_id IS NULL OR r.agent_id = b.agent_id)) AS waiting
FROM budgets b JOIN tenants tn ON tn.id = b.tenant_id LEFT JOIN agents a ON a.id = b.agent_id
"""

# The sweep's gauges: every budget (labels tenant, agent, period).
GAUGES = _LIST + " ORDER BY b.id"


def check_budget(period: str, limit_usd: float, on_exhausted: str) -> None:
    if period not in PERIODS:
        raise ValueError(f"a budget's period must be day or month, got {period!r}")
    if on_exhausted not in ON_EXHAUSTED:
        raise ValueError(f"on_exhausted must be wait or fail, got {on_exhausted!r}")
    if (
        isinstance(limit_usd, bool)
        or not isinstance(limit_usd, int | float)
        or not math.isfinite(limit_usd)
        or not 0 <= limit_usd <= MAX_LIMIT_USD
    ):
        raise ValueError(
            f"a budget's limit must be a number of USD 0 to {MAX_LIMIT_USD:g} "
            f"(0 stops every call), got {limit_usd!r}"
        )


async def _agent_id(db: asyncpg.Pool | asyncpg.Connection, tenant_id: str, agent: str) -> str:
    aid = await db.fetchval(
        "SELECT id::text FROM agents WHERE tenant_id = $1 AND (name = $2 OR id::text = $2)",
        tenant_id,
        agent,
    )
    if aid is None:
        raise NotFound(f"no agent {agent!r} in this tenant")
    return str(aid)


async def set_budget(
    db: asyncpg.Pool | asyncpg.Connection,
    tenant_id: str,
    agent: str | None,
    period: str,
    limit_usd: float,
    on_exhausted: str = "wait",
) -> dict[str, Any]:
    """Create or change the tenant's (None) or an agent's budget for `period`; what it
    spent in the current window is kept. Runs waiting for a budget that now has room
    are queued again at once."""
    check_budget(period, limit_usd, on_exhausted)
    agent_id = None if agent is None else await _agent_id(db, tenant_id, agent)
    window = WINDOW.format(p="$3::text")
    bid = await db.fetchval(
        f"""
        INSERT INTO budgets AS b (tenant_id, agent_id, period, limit_usd, on_exhausted,
            window_start)
        VALUES ($1::uuid, $2::uuid, $3::text, $4::float8, $5::text, {window})
        ON CONFLICT (tenant_id, coalesce(agent_id, {NIL}), period) DO UPDATE
        SET limit_usd = $4::float8, on_exhausted = $5::text, updated_at = now()
        RETURNING id
        """,
        tenant_id,
        agent_id,
        period,
        float(limit_usd),
        on_exhausted,
    )
    await db.fetchrow(WAKE)
    rows = await db.fetch(_LIST + " WHERE b.id = $1", bid)
    return _row(rows[0])


async def list_budgets(
    db: asyncpg.Pool | asyncpg.Connection, tenant_id: str | None = None
) -> list[dict[str, Any]]:
    """Every budget (of one tenant, or of all), with what it spent in its current window,
    what calls in flight hold, and how many runs wait for it."""
    if tenant_id is None:
        rows = await db.fetch(_LIST + " ORDER BY tn.name, a.name NULLS FIRST, b.period")
    else:
        rows = await db.fetch(
            _LIST + " WHERE b.tenant_id = $1 ORDER BY a.name NULLS FIRST, b.period", tenant_id
        )
    return [_row(r) for r in rows]


async def remove_budget(
    db: asyncpg.Pool | asyncpg.Connection,
    tenant_id: str,
    agent: str | None,
    period: str | None = None,
) -> int:
    """Remove the tenant's (None) or an agent's budget for `period` (None: both periods);
    how many were removed. Runs waiting for it are queued again at once."""
    if period is not None and period not in PERIODS:
        raise ValueError(f"a budget's period must be day or month, got {period!r}")
    agent_id = None if agent is None else await _agent_id(db, tenant_id, agent)
    n = await db.fetchval(
        "WITH l AS MATERIALIZED (SELECT id FROM budgets WHERE tenant_id = $1::uuid "
        "AND agent_id IS NOT DISTINCT FROM $2::uuid AND ($3::text IS NULL OR period = $3) "
        "ORDER BY id FOR UPDATE), "  # locked in id order, as every statement does
        "d AS (DELETE FROM budgets WHERE id IN (SELECT id FROM l) RETURNING 1) "
        "SELECT count(*) FROM d",
        tenant_id,
        agent_id,
        period,
    )
    if not n:
        whose = "the tenant" if agent is None else f"agent {agent!r}"
        raise NotFound(
            f"no {period or ''}{' ' if period else ''}budget for {whose} "
            "(`hango-worker budgets show` lists them)"
        )
    await db.fetchrow(WAKE)
    return int(n)


def _row(r: asyncpg.Record) -> dict[str, Any]:
    d = dict(r)
    d["remaining_usd"] = max(d["limit_usd"] - d["spent_usd"] - d["reserved_usd"], 0.0)
    return d
