"""The SQL of `runs export` and `runs import` (run/export.py).

Export reads what `store/replay.py:recording` does not: the run's outcome (status,
error, usage, final state), all its events, and the stored blocks (`blobs`) its
history and tool results refer to, so a file carries their bytes. Import writes an
exported run into this database in one transaction: its agent (`<name>-imported`,
created or reused), a new session, the history before the run as a run of its own
(finished, so the run starts where it started), the run as a finished run, its
messages, events, tool results and blobs.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg

from hango_worker.store.repo import readable_json

OUTCOME = (
    "SELECT status, error::text AS error, usage::text AS usage, state_json::text AS state, "
    "limit_reached FROM runs WHERE id = $1 AND tenant_id = $2"
)
EVENTS = (
    "SELECT seq, type, payload::text AS payload, attempt FROM run_events "
    "WHERE run_id = $1 ORDER BY seq"
)
# the stored blocks the session's history (up to the run's end) and the run's tool
# results refer to
BLOBS = """
SELECT encode(b.sha256, 'hex') AS sha256, b.media_type, b.data FROM blobs b
WHERE b.tenant_id = $1 AND b.sha256 IN (
    SELECT decode(ref #>> '{}', 'hex')
    FROM messages m, jsonb_path_query(m.content, 'lax $.**.hango_blob') ref
    WHERE m.session_id = $2 AND jsonb_typeof(ref) = 'string'
      AND m.seq <= (SELECT max(seq) FROM messages WHERE run_id = $3)
    UNION
    SELECT decode(ref #>> '{}', 'hex')
    FROM tool_calls t, jsonb_path_query(t.result, 'lax $.**.hango_blob') ref
    WHERE t.run_id = $3 AND jsonb_typeof(ref) = 'string'
)
ORDER BY 1
"""

FIND_AGENT = "SELECT id::text FROM agents WHERE tenant_id = $1 AND name = $2"
NEW_AGENT = """
INSERT INTO agents (id, tenant_id, name, model, system, tools, config)
VALUES ($1, $2, $3, $4, $5::text::jsonb, $6, $7::text::jsonb)
"""
NEW_SESSION = "INSERT INTO sessions (id, tenant_id, agent_id) VALUES ($1, $2, $3)"
NEW_RUN = """
INSERT INTO runs (id, tenant_id, session_id, agent_id, status, input, state_json, error,
                  usage, limit_reached, depth, started_at, finished_at)
VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7::text::jsonb, $8::text::jsonb,
        $9::text::jsonb, $10, $11, now(), now())
"""
NEW_MESSAGES = """
INSERT INTO messages (session_id, seq, run_id, role, content)
SELECT $1, x.seq, x.run_id::uuid, x.role, x.content::jsonb
FROM unnest($2::int[], $3::text[], $4::text[], $5::text[]) AS x(seq, run_id, role, content)
"""
NEW_EVENTS = """
INSERT INTO run_events (run_id, seq, type, payload, attempt)
SELECT $1, x.seq, x.type, x.payload::jsonb, x.attempt
FROM unnest($2::int[], $3::text[], $4::text[], $5::int[]) AS x(seq, type, payload, attempt)
"""
NEW_TOOL_CALLS = """
INSERT INTO tool_calls (run_id, tool_use_id, name, result, attempt)
SELECT $1, x.id, x.name, x.result::jsonb, 1
FROM unnest($2::text[], $3::text[], $4::text[]) AS x(id, name, result)
"""
# the blobs first: a run's input may refer to them (the trigger runs_ref_blobs refers the
# run to them: migration 0016_content_blobs)
NEW_BLOBS = """
INSERT INTO blobs (tenant_id, sha256, media_type, size, data)
SELECT $1::uuid, decode(x.s, 'hex'), x.m, octet_length(x.d), x.d
FROM unnest($2::text[], $3::text[], $4::bytea[]) AS x(s, m, d)
ON CONFLICT DO NOTHING
"""
NEW_BLOB_REFS = """
INSERT INTO run_blobs (run_id, sha256, tenant_id)
SELECT DISTINCT r, decode(s, 'hex'), $1::uuid FROM unnest($2::uuid[]) AS r, unnest($3::text[]) AS s
ON CONFLICT DO NOTHING
"""


@dataclass(frozen=True, slots=True)
class Extras:
    """What an export reads beside the run's recording."""

    outcome: dict[str, Any]  # status, error, usage, state, limit_reached
    events: list[dict[str, Any]]  # seq, type, payload (decoded), attempt
    blobs: list[dict[str, Any]]  # sha256 (hex), media_type, data (bytes)


async def extras(db: asyncpg.Pool, tenant_id: str, run_id: str, session_id: str) -> Extras:
    async with db.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        row = await conn.fetchrow(OUTCOME, run_id, tenant_id)
        events = await conn.fetch(EVENTS, run_id)
        blobs = await conn.fetch(BLOBS, tenant_id, session_id, run_id)
    outcome = dict(row) if row is not None else {}
    for k in ("error", "usage", "state"):
        outcome[k] = readable_json(outcome.get(k))
    return Extras(
        outcome=outcome,
        events=[{**dict(e), "payload": readable_json(e["payload"])} for e in events],
        blobs=[{**dict(b), "data": bytes(b["data"])} for b in blobs],
    )


@dataclass(frozen=True, slots=True)
class Imported:
    """What an import wrote: a run to be written into a database."""

    agent: dict[str, Any]  # name, model, system, tools, config
    run: dict[str, Any]  # status, input, state, error, usage, limit_reached, depth
    messages: list[dict[str, Any]]  # seq, role, content, mine
    events: list[dict[str, Any]]  # seq, type, payload, attempt
    tool_results: dict[str, tuple[str, Any]]  # tool_use_id → (tool name, result)
    blobs: list[dict[str, Any]]  # sha256 (hex), media_type, data (bytes)


def _j(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


async def write_import(db: asyncpg.Pool, tenant_id: str, imp: Imported) -> dict[str, str]:
    """Write `imp` in one transaction: {run_id, session_id, agent_id, agent}."""
    run_id, session_id = str(uuid.uuid4()), str(uuid.uuid4())
    name = f"{imp.agent['name']}-imported"
    async with db.acquire() as conn, conn.transaction():
        agent_id = await conn.fetchval(FIND_AGENT, tenant_id, name)
        if agent_id is None:
            agent_id = str(uuid.uuid4())
            a = imp.agent
            await conn.execute(
                NEW_AGENT, agent_id, tenant_id, name, a["model"], _j(a["system"]),
                list(a["tools"]), _j(a["config"]),
            )  # fmt: skip
        await conn.execute(NEW_SESSION, session_id, tenant_id, agent_id)
        bs = imp.blobs
        await conn.execute(
            NEW_BLOBS, tenant_id, [b["sha256"] for b in bs], [b["media_type"] for b in bs],
            [b["data"] for b in bs],
        )  # fmt: skip
        before = [m for m in imp.messages if not m["mine"]]
        prior = str(uuid.uuid4()) if before else None
        if prior is not None:  # the history before the run: a finished run of its own
            prior_input = {"text": "(imported: the history before the run)"}
            await conn.execute(
                NEW_RUN, prior, tenant_id, session_id, agent_id, "succeeded",
                _j(prior_input), "{}", None, None, None, 0,
            )  # fmt: skip
        r = imp.run
        await conn.execute(
            NEW_RUN, run_id, tenant_id, session_id, agent_id, r["status"], _j(r["input"]),
            _j(r.get("state") or {}), _j(r.get("error")), _j(r.get("usage")),
            r.get("limit_reached"), int(r.get("depth") or 0),
        )  # fmt: skip
        ms = imp.messages
        owners = [run_id if m["mine"] else prior for m in ms]
        await conn.execute(
            NEW_MESSAGES, session_id, [m["seq"] for m in ms], owners,
            [m["role"] for m in ms], [json.dumps(m["content"]) for m in ms],
        )  # fmt: skip
        ev = imp.events
        await conn.execute(
            NEW_EVENTS, run_id, [e["seq"] for e in ev], [e["type"] for e in ev],
            [json.dumps(e["payload"]) for e in ev], [e.get("attempt") for e in ev],
        )  # fmt: skip
        ids = list(imp.tool_results)
        await conn.execute(
            NEW_TOOL_CALLS, run_id, ids, [imp.tool_results[i][0] for i in ids],
            [json.dumps(imp.tool_results[i][1]) for i in ids],
        )  # fmt: skip
        if imp.blobs:
            owners = [run_id, *([prior] if prior else [])]
            await conn.execute(NEW_BLOB_REFS, tenant_id, owners, [b["sha256"] for b in imp.blobs])
    return {"run_id": run_id, "session_id": session_id, "agent_id": agent_id, "agent": name}
