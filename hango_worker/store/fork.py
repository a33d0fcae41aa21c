"""Fork a run from any turn, and list a run's turns (cold path).

A fork is a new run in a new session whose history is the source session's
messages up to the end of the source run's turn N (its tool results included),
and whose `state_json` is the source run's state at the end of that turn
(`run_states`: the latest snapshot at or before N, kept by the turn's checkpoint
when the state changed). It is queued like any run; the source run, its session
and its rows are only read, never written.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import asyncpg

from hango_worker.store.repo import Conflict, get_run
from hango_worker.store.sql import NOTIFY_CHANNEL

# The tool names come out of SQL, whatever the content holds (nested too deep to decode,
# not an array, a name that is not a string): at most MAX_NAME_CHARS of each, in order.
MAX_NAME_CHARS = 200
_TURNS = f"""
WITH t AS (
    SELECT seq, created_at, content,
        (row_number() OVER (ORDER BY seq))::int AS turn
    FROM messages WHERE run_id = $1 AND role = 'assistant'
)
SELECT t.turn, t.created_at,
    ARRAY(SELECT left(coalesce(b.value->>'name', '?'), {MAX_NAME_CHARS})
          FROM jsonb_array_elements(CASE WHEN jsonb_typeof(t.content) = 'array'
              THEN t.content ELSE '[]'::jsonb END) WITH ORDINALITY b
          WHERE b.value->>'type' = 'tool_use' ORDER BY b.ordinality) AS tool_calls,
    EXISTS (SELECT 1 FROM run_states s WHERE s.run_id = $1 AND s.turn = t.turn) AS state_changed
FROM t ORDER BY t.seq
"""
_STATE_AT = (
    "SELECT state_json::text FROM run_states WHERE run_id = $1 AND turn <= $2 "
    "ORDER BY turn DESC LIMIT 1"
)
_NEW_SESSION = "INSERT INTO sessions (id, tenant_id, agent_id) VALUES ($1, $2, $3)"
_NEW_RUN = """
INSERT INTO runs (id, tenant_id, session_id, agent_id, input, state_json)
VALUES ($1, $2, $3, $4, $5::text::jsonb, $6::text::jsonb)
"""
# the source session's messages before the cut, renumbered 1.. in the new session
_COPY = """
INSERT INTO messages (session_id, seq, run_id, role, content)
SELECT $1, row_number() OVER (ORDER BY seq), $2, role, content
FROM messages WHERE session_id = $3 AND seq < $4
RETURNING seq, role, content::text AS content
"""
# the stored content blocks the copied history refers to: the new run refers to them
# too (references, never the bytes: docs/inputs-and-outputs.md)
_COPY_BLOB_REFS = """
INSERT INTO run_blobs (run_id, sha256, tenant_id)
SELECT DISTINCT $2::uuid, decode(ref #>> '{}', 'hex'), $3::uuid
FROM messages m, jsonb_path_query(m.content, 'lax $.**.hango_blob') ref
WHERE m.session_id = $1 AND jsonb_typeof(ref) = 'string'
ON CONFLICT DO NOTHING
"""
_APPEND_TO_LAST = (
    "UPDATE messages SET content = content || $3::text::jsonb WHERE session_id = $1 AND seq = $2"
)
_APPEND_NEW = (
    "INSERT INTO messages (session_id, seq, run_id, role, content) "
    "VALUES ($1, $2, $3, 'user', $4::text::jsonb)"
)


def _tool_names(content: str) -> list[str]:
    try:
        blocks = json.loads(content)
    except (ValueError, RecursionError):  # RecursionError: nested too deep to decode
        return []
    if not isinstance(blocks, list):
        return []
    return [
        str(b.get("name")) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"
    ]


async def history(pool: asyncpg.Pool, tenant_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's turns: index (1..), when the model answered, the tools it called, and
    whether the state at the turn's end was kept (it changed)."""
    await get_run(pool, tenant_id, run_id)
    rows = await pool.fetch(_TURNS, run_id)
    return [
        {
            "turn": r["turn"],
            "at": r["created_at"],
            "tool_calls": list(r["tool_calls"]),
            "state_changed": bool(r["state_changed"]),
        }
        for r in rows
    ]


async def fork(
    pool: asyncpg.Pool, tenant_id: str, run_id: str, at_turn: int, input_text: str | None = None
) -> dict[str, str]:
    """Queue a new run from the end of `run_id`'s turn `at_turn` (0: before its first
    turn); `input_text` is added as the user's next message. NotFound: no such run;
    ValueError: no such turn, or nothing for the model to answer."""
    src = await get_run(pool, tenant_id, run_id)
    if at_turn < 0:
        raise ValueError(f"--at-turn must be 0 or more, got {at_turn}")
    if input_text is not None and not input_text.strip():
        raise ValueError("the fork's input must not be empty")
    async with pool.acquire() as conn, conn.transaction():
        turns = [
            r["seq"]
            for r in await conn.fetch(
                "SELECT seq FROM messages WHERE run_id = $1 AND role = 'assistant' ORDER BY seq",
                run_id,
            )
        ]
        if at_turn > len(turns):
            raise ValueError(f"run {run_id} has {len(turns)} turns; there is no turn {at_turn}")
        cut = await _cut(conn, run_id, src["session_id"], turns, at_turn)
        state = await conn.fetchval(_STATE_AT, run_id, at_turn) or "{}"
        new_run, new_session = str(uuid.uuid4()), str(uuid.uuid4())
        await conn.execute(_NEW_SESSION, new_session, tenant_id, src["agent_id"])
        run_input = {"text": input_text or "", "fork": {"run_id": run_id, "at_turn": at_turn}}
        src_input = src.get("input")
        if isinstance(src_input, dict) and src_input.get("params") is not None:
            run_input["params"] = src_input["params"]  # the run's own API parameters go on
        await conn.execute(
            _NEW_RUN, new_run, tenant_id, new_session, src["agent_id"], json.dumps(run_input), state
        )
        copied = await conn.fetch(_COPY, new_session, new_run, src["session_id"], cut)
        await conn.execute(_COPY_BLOB_REFS, new_session, new_run, tenant_id)
        await _add_input(conn, new_session, new_run, copied, input_text)
        await conn.execute("SELECT pg_notify($1, $2)", NOTIFY_CHANNEL, new_run)
    return {"run_id": new_run, "session_id": new_session}


async def _cut(
    conn: asyncpg.Connection, run_id: str, session_id: str, turns: list[int], at_turn: int
) -> int:
    """The first message seq the fork leaves out: the source run's next assistant
    message, or (forking at its last turn) everything after the run's last message."""
    if at_turn < len(turns):
        return turns[at_turn]
    last = await conn.fetchval("SELECT max(seq) FROM messages WHERE run_id = $1", run_id)
    if last is None:  # the run never wrote a message: its input becomes the fork's
        raise ValueError(f"run {run_id} has no history yet; enqueue a new run instead")
    return int(last) + 1


async def _add_input(
    conn: asyncpg.Connection,
    session: str,
    run_id: str,
    copied: list[Any],
    text: str | None,
) -> None:
    """The user's new message: after the tool results of the last turn (in the same
    user message, results first), else a message of its own. Without one, the history
    must end where the model has something to answer."""
    last = max(copied, key=lambda r: r["seq"]) if copied else None
    if text is None:
        if last is None or (last["role"] == "assistant" and not _tool_names(last["content"])):
            raise Conflict("the history ends with the model's final answer; give --input")
        return
    block = json.dumps([{"type": "text", "text": text}])
    if last is not None and last["role"] == "user":
        await conn.execute(_APPEND_TO_LAST, session, last["seq"], block)
    else:
        seq = (last["seq"] if last is not None else 0) + 1
        await conn.execute(_APPEND_NEW, session, seq, run_id, block)


_TREE = """
WITH RECURSIVE tree AS (
    SELECT r.id, r.parent_run_id, r.parent_tool_use_id, 0 AS level FROM runs r
    WHERE r.id = $1 AND r.tenant_id = $2
    UNION ALL
    SELECT c.id, c.parent_run_id, c.parent_tool_use_id, t.level + 1 FROM runs c
    JOIN tree t ON c.parent_run_id = t.id WHERE t.level < 20
) CYCLE id SET in_cycle USING path  -- a parent cycle (only SQL can make one) ends here
SELECT t.id::text AS id, t.parent_run_id::text AS parent, t.level, t.parent_tool_use_id,
    r.status, a.name AS agent, r.created_at,
    CASE WHEN jsonb_typeof(r.usage->'cost_usd') = 'number'
         THEN (r.usage->>'cost_usd')::float8 END AS cost_usd
FROM tree t JOIN runs r ON r.id = t.id LEFT JOIN agents a ON a.id = r.agent_id
WHERE NOT t.in_cycle
ORDER BY t.level, r.created_at
"""


async def tree(pool: asyncpg.Pool, tenant_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run and its child runs (subagents), all the way down: level, status, agent,
    and the `task` call that made each."""
    await get_run(pool, tenant_id, run_id)
    rows = [dict(r) for r in await pool.fetch(_TREE, run_id, tenant_id)]
    kids: dict[str, list[dict[str, Any]]] = {}
    for r in rows[1:]:
        kids.setdefault(r["parent"], []).append(r)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    stack = rows[:1]
    while stack:  # depth first: each run, then its children in the order they were made
        r = stack.pop()
        if r["id"] in seen:  # reached twice (a cycle made by hand): listed once
            continue
        seen.add(r["id"])
        out.append(r)
        stack.extend(reversed(kids.get(r["id"], [])))
    return out
