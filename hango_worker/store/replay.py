"""The reads of `hango-worker replay` (run/replay.py): a recorded run, read only.

One function, `recording`, reads everything a replay needs in one repeatable-read,
read-only transaction: the run and its agent's row, the session's messages up to the
run's last one (a replay starts from those up to its first, its input), the run's
`model_message` events (the model's responses, in order, with what was sent for each),
where it first waited, its recorded tool results and, for a fork, the state it
started from (its source run's at the turn it was forked at). Nothing here writes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from hango_worker.store.repo import NotFound, readable_json

RUN = (
    "SELECT r.id::text, r.session_id::text, r.agent_id::text, r.status, r.depth, "
    "r.input::text AS input, a.name, a.model, a.system, a.tools, a.config "
    "FROM runs r JOIN agents a ON a.id = r.agent_id WHERE r.id = $1 AND r.tenant_id = $2"
)
# the session's history up to the run's last message (the run's own marked `mine`)
HISTORY = (
    "SELECT seq, role, content::text AS content, run_id = $2 AS mine FROM messages "
    "WHERE session_id = $1 AND seq <= (SELECT max(seq) FROM messages WHERE run_id = $2) "
    "ORDER BY seq"
)
MODEL_MESSAGES = (
    "SELECT type, payload::text AS payload FROM run_events "
    "WHERE run_id = $1 AND type IN ('model_message', 'run_waiting') ORDER BY seq"
)
TOOL_RESULTS = "SELECT tool_use_id, result::text AS result FROM tool_calls WHERE run_id = $1"
# a fork's state as it started: its source run's at the turn it was forked at (store/fork.py)
FORK_STATE = (
    "SELECT state_json::text FROM run_states WHERE run_id = $1 AND turn <= $2 "
    "ORDER BY turn DESC LIMIT 1"
)
AGENT = (
    "SELECT id::text, name, model, system, tools, config FROM agents "
    "WHERE tenant_id = $1 AND (name = $2 OR id::text = $2) ORDER BY name = $2 DESC LIMIT 1"
)


@dataclass(frozen=True, slots=True)
class Recording:
    run: dict[str, Any]  # the run's row (input decoded) and its agent's (name … config)
    history: list[dict[str, Any]]  # seq, role, content (decoded), mine: up to the run's end
    model_messages: list[dict[str, Any]]  # the model_message payloads, in order
    tool_results: dict[str, Any]  # tool_use_id → the recorded result (decoded)
    first_wait: int | None = None  # the model calls made before the run first waited
    state: Any = None  # the state it started from: a fork's (None: a fresh run's)

    @property
    def fork(self) -> dict[str, Any] | None:
        """`runs.input.fork` of a forked run: the run and turn it was forked from."""
        found = self.run["input"].get("fork") if isinstance(self.run["input"], dict) else None
        return found if isinstance(found, dict) else None

    @property
    def copied_turns(self) -> int:
        """The model responses in its history before its own (a fork's copied turns)."""
        if self.fork is None:
            return 0
        own = sum(1 for m in self.history if m["mine"] and m["role"] == "assistant")
        return max(0, own - len(self.model_messages))

    @property
    def start(self) -> list[dict[str, Any]]:
        """The messages the run started from: the history up to its first (its input);
        a fork's, everything before its first own model response."""
        mine = [i for i, m in enumerate(self.history) if m["mine"]]
        if not mine:
            return []
        if self.fork is None:
            return self.history[: mine[0] + 1]
        answers = [i for i in mine if self.history[i]["role"] == "assistant"]
        copied = self.copied_turns
        return self.history[: answers[copied]] if copied < len(answers) else self.history


async def recording(db: asyncpg.Pool, tenant_id: str, run_id: str) -> Recording:
    """NotFound: no such run in this tenant."""
    try:
        uuid.UUID(run_id)
    except ValueError:
        raise NotFound(f"{run_id!r} is not a run id (a UUID)") from None
    async with db.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        row = await conn.fetchrow(RUN, run_id, tenant_id)
        if row is None:
            raise NotFound(f"no run {run_id} in this tenant")
        run = dict(row)
        run["input"] = readable_json(run["input"])
        history = await conn.fetch(HISTORY, run["session_id"], run_id)
        events = await conn.fetch(MODEL_MESSAGES, run_id)
        results = await conn.fetch(TOOL_RESULTS, run_id)
        state = await _fork_state(conn, run["input"])
    calls = [readable_json(e["payload"]) for e in events if e["type"] == "model_message"]
    waits = [i for i, e in enumerate(events) if e["type"] == "run_waiting"]
    return Recording(
        run=run,
        history=[{**r, "content": readable_json(r["content"])} for r in history],
        model_messages=calls,
        tool_results={r["tool_use_id"]: readable_json(r["result"]) for r in results},
        first_wait=_calls_before(events, waits[0]) if waits else None,
        state=state,
    )


async def _fork_state(conn: asyncpg.Connection, run_input: Any) -> Any:
    fork = run_input.get("fork") if isinstance(run_input, dict) else None
    if not isinstance(fork, dict) or not isinstance(fork.get("at_turn"), int):
        return None
    found = await conn.fetchval(FORK_STATE, str(fork.get("run_id")), fork["at_turn"])
    return readable_json(found) if found is not None else {}


def _calls_before(events: list[Any], end: int) -> int:
    return sum(1 for e in events[:end] if e["type"] == "model_message")


async def agent_row(db: asyncpg.Pool, tenant_id: str, name_or_id: str) -> dict[str, Any]:
    """An agent of the tenant, by name or id. NotFound: none."""
    row = await db.fetchrow(AGENT, tenant_id, name_or_id)
    if row is None:
        raise NotFound(f"no agent {name_or_id!r} in this tenant")
    return dict(row)
