"""Forking a run from any turn (store/fork.py): the state at every turn boundary is
kept when it changed, a fork reproduces the source's turns and state up to the cut,
and the source run is never modified."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from hango_worker.client import Client
from hango_worker.store import fork, repo
from hango_worker.testing.inmem import run_agent
from tests.helpers import agent, call, scripted
from tests.test_cli import cli
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

T = repo.DEFAULT_TENANT_ID


def todos(*items: str) -> dict[str, Any]:
    return call("write_todos", todos=[{"content": i, "status": "pending"} for i in items])


# six tool turns (the plan changes in turns 1, 3 and 5), then the answer
SCRIPT = [
    {"text": "Plan.", "tool_calls": [todos("a")]},
    {"text": "Add.", "tool_calls": [call("calculator", expression="1+1")]},
    {"text": "Replan.", "tool_calls": [todos("a", "b")]},
    {"text": "Add.", "tool_calls": [call("calculator", expression="2+2")]},
    {"text": "Replan.", "tool_calls": [todos("a", "b", "c")]},
    {"text": "Add.", "tool_calls": [call("calculator", expression="3+3")]},
    {"text": "Done."},
]


async def snapshot(pool: asyncpg.Pool, run_id: str) -> str:
    """Everything stored for a run, as text: to prove a fork never writes to it."""
    parts = []
    for q in (
        "SELECT row_to_json(r)::text FROM runs r WHERE id = $1",
        "SELECT json_agg(m ORDER BY seq)::text FROM messages m WHERE run_id = $1",
        "SELECT json_agg(s ORDER BY turn)::text FROM run_states s WHERE run_id = $1",
        "SELECT json_agg(e ORDER BY seq)::text FROM run_events e WHERE run_id = $1",
        "SELECT json_agg(t ORDER BY tool_use_id)::text FROM tool_calls t WHERE run_id = $1",
    ):
        parts.append(str(await pool.fetchval(q, run_id)))
    return "\n".join(parts)


async def finished_source(pool: asyncpg.Pool, dsn: str) -> str:
    await make_agent(pool, tools=["write_todos", "calculator"])
    run_id = await enqueue(pool, "do the plan")
    await run_until_idle(dsn, scripted(*SCRIPT))
    assert (await details(pool, run_id))["status"] == "succeeded"
    return run_id


async def test_the_state_is_kept_per_turn_only_when_it_changed(
    pool: asyncpg.Pool, dsn: str
) -> None:
    run_id = await finished_source(pool, dsn)
    rows = await pool.fetch("SELECT turn, state_json FROM run_states WHERE run_id = $1", run_id)
    kept = {r["turn"]: [t["content"] for t in r["state_json"]["todos"]] for r in rows}
    # every turn changes the state here (the plan, the repeat-call counts, the size
    # estimate the summarization middleware keeps); the start (turn 0) is not kept
    assert kept == {
        1: ["a"],
        2: ["a"],
        3: ["a", "b"],
        4: ["a", "b"],
        5: ["a", "b", "c"],
        6: ["a", "b", "c"],
        7: ["a", "b", "c"],
    }
    turns = await fork.history(pool, T, run_id)
    assert [(t["turn"], t["tool_calls"], t["state_changed"]) for t in turns] == [
        (1, ["write_todos"], True),
        (2, ["calculator"], True),
        (3, ["write_todos"], True),
        (4, ["calculator"], True),
        (5, ["write_todos"], True),
        (6, ["calculator"], True),
        (7, [], True),
    ]
    shown = cli(dsn, "runs", "history", run_id).stdout.splitlines()
    assert len(shown) == 7 and shown[0].endswith("write_todos  state changed")


async def test_a_fork_at_turn_3_reproduces_it_then_diverges_and_the_source_is_untouched(
    pool: asyncpg.Pool, dsn: str
) -> None:
    source = await finished_source(pool, dsn)
    before = await snapshot(pool, source)
    src = await details(pool, source)
    ids = await Client(pool).fork(source, 3, "Also do d.")
    forked = await details(pool, ids["run_id"])
    assert forked["status"] == "queued" and forked["session_id"] != src["session_id"]
    assert forked["state_json"]["todos"] == [
        {"content": c, "status": "pending"} for c in ("a", "b")
    ]
    want = [(m["role"], m["content"]) for m in src["transcript"][:7]]  # input, 3 turns
    got = [(m["role"], m["content"]) for m in forked["transcript"]]
    assert got[:6] == want[:6]
    assert got[6][1] == [*want[6][1], {"type": "text", "text": "Also do d."}]
    await run_until_idle(dsn, scripted(*SCRIPT))
    done = await details(pool, ids["run_id"])
    assert done["status"] == "succeeded"
    assert len(done["transcript"]) == len(src["transcript"])  # turns 4-7 again, its own
    assert await snapshot(pool, source) == before  # byte for byte


async def test_fork_errors_are_clear_and_change_nothing(pool: asyncpg.Pool, dsn: str) -> None:
    source = await finished_source(pool, dsn)
    runs = await pool.fetchval("SELECT count(*) FROM runs")
    with pytest.raises(ValueError, match="has 7 turns; there is no turn 9"):
        await fork.fork(pool, T, source, 9)
    with pytest.raises(repo.Conflict, match="ends with the model's final answer; give --input"):
        await fork.fork(pool, T, source, 7)
    p = cli(dsn, "runs", "fork", source, "--at-turn", "9", ok=False)
    assert p.returncode == 2 and "there is no turn 9" in p.stderr
    p = cli(dsn, "runs", "fork", source, "--at-turn", "7", ok=False)
    assert p.returncode == 4
    assert await pool.fetchval("SELECT count(*) FROM runs") == runs
    new = json.loads(
        cli(dsn, "runs", "fork", source, "--at-turn", "7", "--input", "More?", "--json").stdout
    )
    assert (await details(pool, new["run_id"]))["transcript"][-1]["content"] == [
        {"type": "text", "text": "More?"}
    ]
    plain = await fork.fork(pool, T, source, 0)  # before turn 1: only the input
    first = await details(pool, plain["run_id"])
    assert [m["role"] for m in first["transcript"]] == ["user"] and first["state_json"] == {}


async def test_the_in_memory_harness_keeps_states_the_same_way() -> None:
    _, _, io = await run_agent(agent(tools=["write_todos", "calculator"]), scripted(*SCRIPT))
    kept = [(turn, [t["content"] for t in json.loads(s)["todos"]]) for turn, s in io.states]
    assert kept == [
        (1, ["a"]),
        (2, ["a"]),
        (3, ["a", "b"]),
        (4, ["a", "b"]),
        (5, ["a", "b", "c"]),
        (6, ["a", "b", "c"]),
        (7, ["a", "b", "c"]),
    ]


async def test_a_state_that_never_changes_keeps_no_rows() -> None:
    adds = [{"tool_calls": [call("calculator", expression=f"{i}+1")]} for i in range(3)]
    _, _, io = await run_agent(
        agent(tools=["calculator"]), scripted(*adds, {"text": "ok"}), stack=[]
    )
    assert io.states == [] and len(io.checkpoints) == 4
