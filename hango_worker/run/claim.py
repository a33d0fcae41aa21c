"""A claimed run's row, decoded once (Claim.from_record): what the worker knows of a run
attempt before it starts, never raising on a row's content (an undecodable column marks
the claim invalid, and the run fails with a message naming it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from hango_worker.provider.types import Usage
from hango_worker.vocab import ErrorType


def decode_json(raw: str | None, what: str) -> Any:
    """Decode one jsonb column fetched as text. Raises ValueError naming the column
    for anything json.loads can raise (too deep, a number too long, bad text…)."""
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to be read") from None
    except Exception as e:  # ValueError, MemoryError on absurd input, …
        raise ValueError(f"{what} cannot be decoded: {type(e).__name__}: {e}"[:500]) from None


@dataclass(slots=True)
class Claim:
    run_id: str
    tenant_id: str
    session_id: str
    agent_id: str
    input: Any
    state_json: Any
    attempt: int
    trace_parent: str | None
    cancel_requested: bool = False
    queued_s: float = 0.0
    started_s: float = 0.0  # when the run first started (epoch seconds)
    usage: Usage = field(default_factory=Usage)  # used by earlier attempts
    cost_before: float | None = 0.0  # what they cost (None: unknown)
    unpriced_before: str | None = None  # cost None: the units that had no price
    rate_wait_s: float = 0.0  # their time waiting for the rate limit (run/ratelimit.py)
    waiting_for: dict[str, Any] | None = None  # set when resumed after a wait
    depth: int = 0  # 0: enqueued by a producer; a child run is its parent's + 1
    parent_run_id: str | None = None  # a child run (subagent): the run that made it
    # set when the row cannot be decoded: the run is failed with it at once
    invalid: dict[str, str] | None = None
    # what sql.LOAD_RUN reads, when the claim brought it (sql.CLAIM does): run/execute.py
    # `load` then reads nothing more for a new run
    start: Any = None

    @classmethod
    def from_record(cls, r: Any) -> Claim:
        """Never raises on a row's content: what cannot be decoded becomes `invalid`."""
        c = cls(
            run_id=r["id"],
            tenant_id=r["tenant_id"],
            session_id=r["session_id"],
            agent_id=r["agent_id"],
            input=None,
            state_json=None,
            attempt=r["attempt"],
            trace_parent=r["trace_parent"],
            cancel_requested=bool(r["cancel_requested"]),
            queued_s=float(r["queued_s"] or 0.0),
            started_s=float(r["started_s"] or 0.0),
            depth=int(r["depth"] or 0),
            parent_run_id=r["parent_run_id"],
            start=r if "agent_row" in r else None,
        )
        try:
            c.input = decode_json(r["input"], "runs.input")
        except ValueError as e:
            c.invalid = {"type": ErrorType.INVALID_INPUT, "message": str(e)}
        try:
            c.state_json = decode_json(r["state_json"], "runs.state_json")
            c.usage, c.cost_before, c.unpriced_before = _decode_usage(r["usage"])
            c.rate_wait_s = prior_wait(r["usage"])
            c.waiting_for = _decode_waiting(r["waiting_for"])
        except ValueError as e:
            c.invalid = c.invalid or {"type": ErrorType.INVALID_STATE, "message": str(e)}
        return c


def _decode_waiting(raw: str | None) -> dict[str, Any] | None:
    """`runs.waiting_for` of a run resumed after a wait (written by us)."""
    d = decode_json(raw, "runs.waiting_for")
    if d is None:
        return None
    ok = isinstance(d, dict) and isinstance(d.get("not_started", []), list)
    if not ok or not all(isinstance(x, str) for x in d.get("not_started", [])):
        raise ValueError("runs.waiting_for must be an object whose not_started is a list of ids")
    record: dict[str, Any] = d
    return record


def prior_wait(raw: str | None) -> float:
    """`runs.usage.waiting_for_rate_limit` (seconds; 0 when absent or not a number)."""
    if raw is None or "waiting_for_rate_limit" not in raw:
        return 0.0
    v = decode_json(raw, "runs.usage").get("waiting_for_rate_limit")
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _decode_usage(raw: str | None) -> tuple[Usage, float | None, str | None]:
    """`runs.usage` (written by us at every checkpoint): the run's token counts and
    cost so far (cost None: unknown, the model or a unit has no price: `cost_unpriced`
    names the unit)."""
    d = decode_json(raw, "runs.usage")
    if d is None:
        return Usage(), 0.0, None
    if not isinstance(d, dict):
        raise ValueError(f"runs.usage must be a JSON object, got {type(d).__name__}")
    cost = d.get("cost_usd")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float)):
        raise ValueError(f"runs.usage.cost_usd must be a number or null, got {cost!r}"[:300])
    try:
        unpriced = d.get("cost_unpriced") if cost is None else None
        unpriced = unpriced if isinstance(unpriced, str) else None
        return Usage.from_dict(d), None if cost is None else float(cost), unpriced
    except (TypeError, ValueError):
        raise ValueError(f"runs.usage holds a count that is not a number: {d!r}"[:300]) from None
