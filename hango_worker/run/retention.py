"""The workers' retention task: a pass of store/retention.py `enforce` every
`HANGO_RETENTION_INTERVAL_S` (jittered), its deletions and the oldest finished run kept
exported as metrics (docs/observability.md). One worker at a time runs a pass (an
advisory lock); the others skip theirs."""

from __future__ import annotations

import asyncio
import logging
import random

import asyncpg

from hango_worker.run.schema_gate import SchemaGate, schema_mismatch
from hango_worker.store.retention import RetentionResult, enforce
from hango_worker.telemetry import metrics

log = logging.getLogger("hango_worker.retention")


def record(result: RetentionResult) -> None:
    """A pass's deletions and the oldest run it left, as metrics."""
    for table, n in result.deleted.items():
        metrics.RETENTION_ROWS_REMOVED.labels(table=table).inc(n)
    if result.ran:
        metrics.RETENTION_OLDEST_RUN.set(result.oldest_run_s or 0.0)


async def retention_loop(pool: asyncpg.Pool, interval_s: float, gate: SchemaGate) -> None:
    """Until cancelled: a retention pass every ~interval_s (never when it is 0)."""
    if interval_s <= 0:
        return
    while True:
        await asyncio.sleep(interval_s * random.uniform(0.5, 1.0))
        if gate.problem is not None:  # not served: the gate logs why
            continue
        try:
            result = await enforce(pool)
        except Exception as e:
            if schema_mismatch(e):
                gate.suspect()
                continue
            log.exception("retention pass failed")
            continue
        record(result)
        if result.deleted:
            log.info("retention pass", extra={"deleted": result.deleted})
