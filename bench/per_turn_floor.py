"""The per-turn floor: the raw asyncpg transaction a durable turn needs at minimum.

Per turn, one statement in one transaction (one commit, one WAL flush): append the
turn's message and update the run's state row, on one connection, prepared, no
framework. The clock is read at each turn's start exactly as the hango side reads it
at each model call (bench/per_turn.py's TurnRecorder), so the windows compare.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import asyncpg

from bench.common import live_bytes, relation_bytes
from bench.per_turn import TurnRecorder, run_result, sample_points, turn_call

FLOOR_TABLES = ("floor_messages", "floor_state")

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_messages (
    session_id uuid NOT NULL, seq int NOT NULL, content jsonb NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE TABLE IF NOT EXISTS floor_state (
    id uuid PRIMARY KEY, turn int NOT NULL, state jsonb NOT NULL
);
"""

TURN = """
WITH m AS (INSERT INTO floor_messages (session_id, seq, content) VALUES ($1, $2, $3::jsonb))
UPDATE floor_state SET turn = $2, state = $4::jsonb WHERE id = $1
"""


def message(i: int) -> str:
    """Turn i's assistant message as hango stores it: its text and its tool call."""
    name, args = turn_call(i, False)
    return json.dumps(
        [
            {"type": "text", "text": f"Turn {i}."},
            {"type": "tool_use", "id": f"toolu_{i:08d}", "name": name, "input": args},
        ]
    )


async def floor_run(dsn: str, turns: int) -> dict[str, Any]:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(SCHEMA)
        run_id = uuid.uuid4()
        await conn.execute("INSERT INTO floor_state (id, turn, state) VALUES ($1, 0, '{}')", run_id)
        rec = TurnRecorder(conn, FLOOR_TABLES, frozenset(sample_points(turns)))
        before = await relation_bytes(conn, FLOOR_TABLES)
        live_before = await live_bytes(conn, FLOOR_TABLES)
        stmt = await conn.prepare(TURN)
        started = time.perf_counter()
        for i in range(turns):
            await rec.on_call()
            await stmt.fetch(run_id, i + 1, message(i), json.dumps({"turn": i + 1}))
        await rec.on_call()
        total_s = time.perf_counter() - started
        after = await relation_bytes(conn, FLOOR_TABLES)
        live = await live_bytes(conn, FLOOR_TABLES) - live_before
    finally:
        await conn.close()
    return run_result(rec, turns, total_s, after - before, live)
