"""A person's decision about a waiting run: approve, reject, answer (cold path).

One transaction: the run is locked, its waiting record checked, the decision
recorded (`run_decisions`, once per call: a second decision is a Conflict), the
run re-queued and the workers woken — so any worker resumes it through the
ordinary claim (docs/design.md §12, one way to wait). Nothing changes when the
decision is refused.
"""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from hango_worker.store.repo import Conflict, NotFound, get_run
from hango_worker.store.sql import NOTIFY_CHANNEL
from hango_worker.vocab import Decision

MAX_TEXT = 100_000  # a reason or an answer, in characters

_LOCK = (
    "SELECT status, waiting_for::text AS waiting_for FROM runs "
    "WHERE id = $1 AND tenant_id = $2 FOR UPDATE"
)
_PENDING_SEQ = "SELECT max(seq) FROM messages WHERE run_id = $1 AND role = 'assistant'"
_RECORD = """
INSERT INTO run_decisions (run_id, message_seq, tool_use_id, decision, input, text, decided_by)
VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7)
ON CONFLICT DO NOTHING RETURNING 1
"""
_REQUEUE = (
    "UPDATE runs SET status = 'queued', queued_at = now(), waiting_until = NULL WHERE id = $1"
)
_EVENT = """
INSERT INTO run_events (run_id, seq, type, payload, worker_id)
SELECT $1, coalesce(max(seq), 0) + 1, 'decision', $2::text::jsonb, $3
FROM run_events WHERE run_id = $1
"""


def _check(decision: Decision, reason: str, edited: Any, text: str | None) -> None:
    if reason == "children":
        raise Conflict("the run waits for its subagent runs, not for a person")
    if decision == Decision.ANSWER and reason != "question":
        raise Conflict("the run waits for an approval, not an answer: approve or reject it")
    if decision == Decision.APPROVE and reason != "approval":
        raise Conflict("the run asks a question: answer it (or reject it with a reason)")
    if edited is not None and (decision != Decision.APPROVE or not isinstance(edited, dict)):
        raise ValueError("edited arguments go with an approval and must be a JSON object")
    if decision in (Decision.ANSWER, Decision.REJECT) and not (text and text.strip()):
        raise ValueError(f"{decision} needs a text (the answer, or the reason for rejecting)")
    if text is not None and len(text) > MAX_TEXT:
        raise ValueError(f"the text is {len(text)} characters; at most {MAX_TEXT}")


async def decide(
    pool: asyncpg.Pool,
    tenant_id: str,
    run_id: str,
    decision: Decision,
    *,
    call_id: str | None = None,
    edited: Any = None,
    text: str | None = None,
    decided_by: str | None = None,
) -> dict[str, Any]:
    """Record `decision` for the call run `run_id` waits on and re-queue it.
    NotFound: no such run, or it does not wait on `call_id`. Conflict: the run is
    not waiting, or the decision does not fit what it waits for (or was made)."""
    await get_run(pool, tenant_id, run_id)  # NotFound, tenant-scoped
    async with pool.acquire() as conn, conn.transaction():
        row = await conn.fetchrow(_LOCK, run_id, tenant_id)
        if row is None or row["status"] != "waiting":
            status = row["status"] if row is not None else "gone"
            raise Conflict(f"run {run_id} is {status}, not waiting for a decision")
        waiting = json.loads(row["waiting_for"] or "null")
        if isinstance(waiting, dict) and waiting.get("reason") == "children":
            raise Conflict(f"run {run_id} waits for its subagent runs, not for a person")
        if isinstance(waiting, dict) and waiting.get("reason") == "budget":
            raise Conflict(f"run {run_id} waits for a spend budget, not for a person")
        call = waiting.get("call") if isinstance(waiting, dict) else None
        if not isinstance(call, dict) or not isinstance(call.get("tool_use_id"), str):
            raise Conflict(f"run {run_id}: its waiting record cannot be read; cancel it")
        pending = call["tool_use_id"]
        if call_id is not None and call_id != pending:
            raise NotFound(
                f"run {run_id} does not wait on call {call_id!r}; "
                f"it waits on {pending!r} ({call.get('name')})"
            )
        _check(decision, str(waiting.get("reason")), edited, text)
        seq = await conn.fetchval(_PENDING_SEQ, run_id)
        edited_json = json.dumps(edited) if edited is not None else None
        args = (run_id, seq, pending, str(decision), edited_json, text, decided_by)
        if await conn.fetchval(_RECORD, *args) is None:
            raise Conflict(f"call {pending!r} of run {run_id} was already decided")
        await conn.execute(_REQUEUE, run_id)
        payload = {"decision": str(decision), "tool_use_id": pending, "by": decided_by}
        await conn.execute(_EVENT, run_id, json.dumps(payload), decided_by)
        await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, run_id)
    return {"run_id": run_id, "tool_use_id": pending, "decision": str(decision)}
