"""The reclaim sweep (every worker, about every lease/2): runs whose lease expired go
back to the queue or fail, waits past their approval timeout end, parents whose
children all ended wake, spend budgets give back stale holds and wake their waiting runs
(run/budget.py), and the queue gauges are refreshed.

Each part is its own statement, so a problem with one never stops the others; the
database being away is logged and the sweep tried again next time.
"""

from __future__ import annotations

import logging
from typing import Any

import asyncpg

from hango_worker.run.budget import BudgetDirectory, sweep_budgets
from hango_worker.run.io import CONNECTION_ERRORS
from hango_worker.store import sql
from hango_worker.telemetry import metrics

log = logging.getLogger(__name__)

# hango_queue_claimable counts at most this many queued runs per tenant (store/sql.py
# QUEUE_CLAIMABLE's cost stays bounded; no fleet claims more in one sweep interval).
CLAIMABLE_CAP = 10_000


async def _fetch(pool: asyncpg.Pool, what: str, query: str, *args: Any) -> list[Any]:
    try:
        return list(await pool.fetch(query, *args))
    except (*CONNECTION_ERRORS, asyncpg.PostgresError) as e:
        log.warning("%s failed: %s", what, e)
        return []


async def sweep(
    pool: asyncpg.Pool, worker_id: str, max_attempts: int, budgets: BudgetDirectory | None = None
) -> int:
    """Everything the sweep changed (runs re-queued, failed, woken)."""
    n = await _reclaim(pool, worker_id, max_attempts)
    n += await _expire_waiting(pool, worker_id)
    n += await _wake_parents(pool)
    n += await sweep_budgets(pool, budgets)  # after the reclaim: its holds are stale now
    _gauges(await _fetch(pool, "queue stats", sql.QUEUE_STATS))
    for r in await _fetch(pool, "claimable runs", sql.QUEUE_CLAIMABLE, CLAIMABLE_CAP):
        metrics.QUEUE_CLAIMABLE.set(r["claimable"])
    for r in await _fetch(pool, "tenant stats", sql.TENANT_RUNNING):
        metrics.TENANT_RUNNING.labels(r["tenant"]).set(r["running"])
    return n


async def _reclaim(pool: asyncpg.Pool, worker_id: str, max_attempts: int) -> int:
    """Runs with expired (or no) leases back in the queue; the ones out of attempts or
    with out-of-range counters failed."""
    rows = await _fetch(pool, "reclaim sweep", sql.RECLAIM_EXPIRED, max_attempts, worker_id)
    rows += await _fetch(pool, "reclaim sweep", sql.FAIL_INVALID_ROWS, worker_id)
    requeued = sum(1 for r in rows if r["status"] == "queued")
    for r in rows:
        if r["status"] == "failed":
            metrics.RUNS_FAILED.labels(metrics.error_type_label(r["error_type"])).inc()
            metrics.RUNS_FINISHED.labels("failed").inc()
            log.warning("run failed by the sweep: %s", r["error_type"], extra={"run_id": r["id"]})
    if requeued:
        metrics.LEASE_RECLAIMS.inc(requeued)
        log.info("reclaimed %d runs with expired leases", requeued)
        await _fetch(pool, "reclaim notify", sql.NOTIFY, sql.NOTIFY_CHANNEL, "reclaim")
    return len(rows)


async def _expire_waiting(pool: asyncpg.Pool, worker_id: str) -> int:
    """Waiting runs past their approval timeout: re-queued with the call rejected, or
    failed (the agent's `on_approval_timeout`)."""
    rows = await _fetch(pool, "approval timeout sweep", sql.EXPIRE_WAITING, worker_id)
    for r in rows:
        metrics.APPROVAL_TIMEOUTS.labels(r["status"]).inc()
        if r["status"] == "failed":
            metrics.RUNS_FAILED.labels("approval_timeout").inc()
            metrics.RUNS_FINISHED.labels("failed").inc()
    return len(rows)


async def _wake_parents(pool: asyncpg.Pool) -> int:
    """Parents waiting for child runs none of which still runs: back to the queue (the
    fallback should the wake-up after a child's end be missed)."""
    rows = await _fetch(pool, "waking parents", sql.WAKE_PARENTS)
    return int(rows[0]["woken"]) if rows else 0


def _gauges(rows: list[Any]) -> None:
    if rows:
        stats = rows[0]
        metrics.QUEUE_DEPTH.set(stats["depth"])
        metrics.QUEUE_OLDEST_AGE.set(stats["oldest_age_s"])
        metrics.RUNS_WAITING.set(stats["waiting"])
        metrics.WAITING_OLDEST.set(stats["waiting_oldest_s"])
