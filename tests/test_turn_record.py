"""The per-turn records (store/turn.py): the statements are compiled from them by name,
and what they write lands in the column of the same name, alone or for several runs
at once (CHECKPOINT, CHECKPOINT_MANY, RECORD_TOOL)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import asyncpg
import pytest

from hango_worker.agent.ports import Event, Outcome
from hango_worker.agent.state import State
from hango_worker.provider.types import Message, TextBlock
from hango_worker.run.claim import Claim
from hango_worker.run.io import PgRunIO
from hango_worker.store import sql, sql_checkpoint
from hango_worker.store.turn import (
    MANY_FIELDS,
    TOOL_FIELDS,
    TURN_FIELDS,
    ToolWrite,
    TurnWrite,
    checkpoint_many_args,
    compile_named,
    many_fields,
)
from tests.worker_helpers import enqueue_and_claim

WORKER = "record-worker"
LOST_BEFORE = 2

# -- compile_named ---------------------------------------------------------------------------


def test_placeholders_become_positions_in_field_order() -> None:
    out = compile_named("SELECT :b::int, :a, coalesce(:b, 0) FROM t WHERE x = 'y'", ("a", "b"))
    assert out == "SELECT $2::int, $1, coalesce($2, 0) FROM t WHERE x = 'y'"


def test_a_cast_is_not_a_placeholder() -> None:
    assert (
        compile_named("SELECT :a::jsonb->>'k', x::text", ("a",))
        == "SELECT $1::jsonb->>'k', x::text"
    )


def test_a_placeholder_that_names_no_field_raises() -> None:
    with pytest.raises(ValueError, match=":c names no field"):
        compile_named("SELECT :a, :b, :c", ("a", "b"))


def test_a_field_no_placeholder_uses_raises() -> None:
    with pytest.raises(ValueError, match=r"no placeholder for the field.* c"):
        compile_named("SELECT :a, :b", ("a", "b", "c"))


def test_a_positional_parameter_in_named_sql_raises() -> None:
    with pytest.raises(ValueError, match="positional"):
        compile_named("SELECT :a, $2", ("a",))


def test_a_field_named_twice_raises() -> None:
    with pytest.raises(ValueError, match="twice"):
        compile_named("SELECT :a", ("a", "a"))


# -- the statements against their records ------------------------------------------------------


@dataclasses.dataclass(slots=True, kw_only=True)
class _TurnPlusOne(TurnWrite):
    """TurnWrite with a field added that no statement writes."""

    added: int = 0


def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


@pytest.mark.parametrize(
    ("named", "fields"),
    [
        (sql_checkpoint.CHECKPOINT_NAMED, TURN_FIELDS),
        (sql_checkpoint.CHECKPOINT_MANY_NAMED, MANY_FIELDS),
        (sql_checkpoint.RECORD_TOOL_NAMED, TOOL_FIELDS),
    ],
)
def test_a_field_added_or_dropped_without_the_sql_fails(
    named: str, fields: tuple[str, ...]
) -> None:
    compile_named(named, fields)  # as shipped: every field used, every placeholder a field
    with pytest.raises(ValueError, match=r"no placeholder for the field.* added"):
        compile_named(named, (*fields, "added"))
    with pytest.raises(ValueError, match="names no field"):
        compile_named(named, fields[:-1])


def test_a_field_added_to_the_turn_record_is_missing_from_both_checkpoints() -> None:
    fields = _names(_TurnPlusOne)
    with pytest.raises(ValueError, match="added"):
        compile_named(sql_checkpoint.CHECKPOINT_NAMED, fields)
    with pytest.raises(ValueError, match="added"):
        compile_named(sql_checkpoint.CHECKPOINT_MANY_NAMED, many_fields(fields))


def test_the_shipped_statements_are_the_compiled_records() -> None:
    assert compile_named(sql_checkpoint.CHECKPOINT_NAMED, _names(TurnWrite)) == sql.CHECKPOINT
    assert compile_named(sql_checkpoint.RECORD_TOOL_NAMED, _names(ToolWrite)) == sql.RECORD_TOOL
    assert {TurnWrite: sql.CHECKPOINT, ToolWrite: sql.RECORD_TOOL} == sql.STATEMENT_OF
    assert "$" not in sql_checkpoint.CHECKPOINT_MANY_NAMED


def test_the_arguments_are_the_fields_by_name() -> None:
    rec = _turn("r", 1, status="failed")
    assert rec.args() == tuple(getattr(rec, n) for n in TURN_FIELDS)
    tool = ToolWrite(
        run_id="r",
        owner="w",
        attempt=1,
        lease_s=3.0,
        state_json={},
        tool_use_id="t",
        tool_name="n",
        result={"content": "x"},
        message_seq=4,
        ev_seq=5,
        ev_type="tool_result",
        ev_payload="{}",
    )
    assert tool.args() == tuple(getattr(tool, n) for n in TOOL_FIELDS)
    with pytest.raises(TypeError):
        TurnWrite("r", "w", 1, 3.0)  # type: ignore[misc]  # keywords only


# -- what lands where: one run (CHECKPOINT) and several at once (CHECKPOINT_MANY) ------------------


def _turn(run_id: str, attempt: int, *, status: str | None) -> TurnWrite:
    """A record whose every field holds a value of its own, so that a value written
    into another field's column shows."""
    return TurnWrite(
        run_id=run_id,
        owner=WORKER,
        attempt=attempt,
        lease_s=30.0,
        state_json={"version": 1, "todos": [], "private": {"k": "state"}},
        status=status,
        error={"type": "boom", "message": "the error"} if status == "failed" else None,
        usage={"input_tokens": 11, "output_tokens": 22},
        trace_parent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        limit_reached="max_turns" if status else None,
        waiting={"reason": "approval", "timeout_s": 60.0} if status == "waiting" else None,
        output=json.dumps({"answer": 42}) if status == "succeeded" else None,
        progressed=status in (None, "succeeded", "released"),
        msg_seqs=[1, 2],
        msg_roles=["user", "assistant"],
        msg_contents=[json.dumps([{"type": "text", "text": t}]) for t in ("go", "done")],
        ev_seqs=[1, 2],
        ev_types=["model_message", "tool_result"],
        ev_payloads=[json.dumps({"n": 1}), json.dumps({"n": 2})],
        file_paths=["/a.txt", "/b.txt"],
        file_contents=["alpha", "beta!"],
        file_sizes=[5, 6],
        file_tool_use_ids=["call-a", None],
        state_turns=[1, 2],
        state_jsons=[json.dumps({"turn": 1}), json.dumps({"turn": 2})],
    )


async def _written(pool: asyncpg.Pool, run_id: str) -> dict[str, Any]:
    """What one run's write left in each table, without ids and times."""
    run = await pool.fetchrow(
        "SELECT state_json, status, error, usage, trace_parent, limit_reached, output, "
        "waiting_for, lease_owner, (lease_expires_at IS NOT NULL) AS leased, lost_count, "
        "handed_back, "
        "(finished_at IS NOT NULL) AS finished, (waiting_until IS NOT NULL) AS until "
        "FROM runs WHERE id = $1",
        run_id,
    )
    q = {
        "messages": "SELECT seq, role, content FROM messages WHERE run_id = $1 ORDER BY seq",
        "events": "SELECT seq, type, payload, worker_id, attempt FROM run_events "
        "WHERE run_id = $1 ORDER BY seq",
        "files": "SELECT path, content, size, tool_use_id FROM run_files "
        "WHERE run_id = $1 ORDER BY path",
        "states": "SELECT turn, state_json FROM run_states WHERE run_id = $1 ORDER BY turn",
    }
    out = {"run": dict(run)}
    for name, query in q.items():
        out[name] = [tuple(r) for r in await pool.fetch(query, run_id)]
    return out


def _expected(rec: TurnWrite) -> dict[str, Any]:
    """What `rec` should write, read field by field."""
    ended = rec.status is not None
    return {
        "run": {
            "state_json": rec.state_json,
            "status": {None: "running", "released": "queued"}.get(rec.status, rec.status),
            "error": rec.error,
            "usage": rec.usage,
            "trace_parent": rec.trace_parent,
            "limit_reached": rec.limit_reached,
            "output": None if rec.output is None else json.loads(rec.output),
            "waiting_for": rec.waiting,
            # every test run starts with 2 lost leases (LOST_BEFORE): progress resets them
            "lost_count": 0 if rec.progressed else LOST_BEFORE,
            "handed_back": 1 if rec.status == "released" else 0,
            "lease_owner": None if ended else rec.owner,
            "leased": not ended,
            "finished": rec.status in ("succeeded", "failed"),
            "until": rec.status == "waiting",
        },
        "messages": [
            (s, r, json.loads(c))
            for s, r, c in zip(rec.msg_seqs, rec.msg_roles, rec.msg_contents, strict=True)
        ],
        "events": [
            (s, t, json.loads(p), rec.owner, rec.attempt)
            for s, t, p in zip(rec.ev_seqs, rec.ev_types, rec.ev_payloads, strict=True)
        ],
        "files": list(
            zip(
                rec.file_paths,
                rec.file_contents,
                rec.file_sizes,
                rec.file_tool_use_ids,
                strict=True,
            )
        ),
        "states": [
            (t, json.loads(s)) for t, s in zip(rec.state_turns, rec.state_jsons, strict=True)
        ],
    }


@pytest.mark.parametrize("status", [None, "succeeded", "failed", "waiting", "released"])
async def test_one_run_and_several_at_once_write_each_field_into_its_column(
    pool: asyncpg.Pool, status: str | None
) -> None:
    one, *many = await enqueue_and_claim(pool, 3, WORKER)
    await pool.execute("UPDATE runs SET lost_count = $1", LOST_BEFORE)
    recs = [_turn(r["id"], r["attempt"], status=status) for r in (one, *many)]
    row = await pool.fetchrow(sql.CHECKPOINT, *recs[0].args())
    assert (row["fenced"], row["cancel"]) == (1, False)
    rows = await pool.fetch(sql.CHECKPOINT_MANY, *checkpoint_many_args(recs[1:]))
    assert sorted((r["id"], r["fenced"]) for r in rows) == sorted((r.run_id, 1) for r in recs[1:])
    for rec in recs:
        assert await _written(pool, rec.run_id) == _expected(rec)


async def test_a_run_fenced_out_of_a_shared_checkpoint_writes_nothing(pool: asyncpg.Pool) -> None:
    a, b = await enqueue_and_claim(pool, 2, WORKER)
    await pool.execute("UPDATE runs SET lost_count = $1", LOST_BEFORE)
    ok = _turn(a["id"], a["attempt"], status=None)
    lost = dataclasses.replace(_turn(b["id"], b["attempt"], status=None), owner="someone else")
    rows = await pool.fetch(sql.CHECKPOINT_MANY, *checkpoint_many_args([ok, lost]))
    assert {r["id"]: r["fenced"] for r in rows} == {ok.run_id: 1, lost.run_id: 0}
    assert await _written(pool, ok.run_id) == _expected(ok)
    nothing = await _written(pool, lost.run_id)
    assert [nothing[k] for k in ("messages", "events", "files", "states")] == [[], [], [], []]


async def test_a_tool_result_writes_each_field_into_its_column(pool: asyncpg.Pool) -> None:
    (r,) = await enqueue_and_claim(pool, 1, WORKER)
    tool = ToolWrite(
        run_id=r["id"],
        owner=WORKER,
        attempt=r["attempt"],
        lease_s=30.0,
        state_json={"version": 1, "todos": [], "private": {"after": "tool"}},
        tool_use_id="call-1",
        tool_name="calculator",
        result={"content": "4", "is_error": False},
        message_seq=7,
        ev_seq=3,
        ev_type="tool_result",
        ev_payload=json.dumps({"tool_use_id": "call-1"}),
        file_paths=["/out.txt"],
        file_contents=["four"],
        file_sizes=[4],
        file_tool_use_ids=["call-1"],
    )
    row = await _record_tool(pool, tool)
    assert (row["fenced"], row["cancel"]) == (1, False)
    call = await pool.fetchrow(
        "SELECT tool_use_id, name, result, attempt, message_seq FROM tool_calls WHERE run_id = $1",
        tool.run_id,
    )
    assert tuple(call) == ("call-1", "calculator", tool.result, tool.attempt, 7)
    written = await _written(pool, tool.run_id)
    assert written["run"]["state_json"] == tool.state_json
    assert written["events"] == [(3, "tool_result", {"tool_use_id": "call-1"}, WORKER, 1)]
    assert written["files"] == [("/out.txt", "four", 4, "call-1")]


async def _record_tool(pool: asyncpg.Pool, tool: ToolWrite) -> Any:
    """RECORD_TOOL, found as the record's statement."""
    return await pool.fetchrow(sql.STATEMENT_OF[ToolWrite], *tool.args())


# -- PgRunIO builds the records by name ------------------------------------------------------


def _io(pool: asyncpg.Pool, row: Any) -> PgRunIO:
    return PgRunIO(
        pool,
        Claim.from_record(row),
        worker_id=WORKER,
        lease_s=30.0,
        next_message_seq=1,
        next_event_seq=1,
    )


@pytest.mark.parametrize(
    "outcome",
    [
        Outcome("failed", error={"type": "x", "message": "why"}, limit="max_turns"),
        Outcome("waiting", waiting={"reason": "approval", "timeout_s": 30.0}),
        Outcome("succeeded", output={"n": 1}, has_output=True),
    ],
    ids=["failed", "waiting", "succeeded"],
)
async def test_a_final_checkpoint_stores_the_outcome_by_name(
    pool: asyncpg.Pool, outcome: Outcome
) -> None:
    (r,) = await enqueue_and_claim(pool, 1, WORKER)
    io = _io(pool, r)
    c = io.claim
    state = State(c.run_id, c.session_id, c.agent_id, c.tenant_id)
    msgs = [Message("user", [TextBlock(text="go")]), Message("assistant", [TextBlock("ok")])]
    await io.checkpoint(state, msgs, [Event("run_finished", {"status": outcome.status})], outcome)
    written = await _written(pool, c.run_id)
    assert written["run"]["status"] == outcome.status
    assert written["run"]["error"] == outcome.error
    assert written["run"]["waiting_for"] == outcome.waiting
    assert written["run"]["limit_reached"] == outcome.limit
    assert written["run"]["output"] == (outcome.output if outcome.has_output else None)
    assert written["run"]["usage"] == outcome.usage_dict()
    assert [(s, role) for s, role, _ in written["messages"]] == [(1, "user"), (2, "assistant")]
    assert written["events"] == [(1, "run_finished", {"status": outcome.status}, WORKER, 1)]


async def test_fail_leaves_the_state_and_writes_its_event(pool: asyncpg.Pool) -> None:
    (r,) = await enqueue_and_claim(pool, 1, WORKER)
    io = _io(pool, r)
    before = await pool.fetchval("SELECT state_json FROM runs WHERE id = $1", io.claim.run_id)
    error = {"type": "invalid_agent", "message": "no such agent"}
    await io.fail(error)
    written = await _written(pool, io.claim.run_id)
    assert written["run"]["state_json"] == before
    assert (written["run"]["status"], written["run"]["error"]) == ("failed", error)
    assert written["events"] == [
        (1, "run_finished", {"status": "failed", "error": error}, WORKER, 1)
    ]
    assert [written[k] for k in ("messages", "files", "states")] == [[], [], []]


async def test_only_a_committed_model_turn_resets_the_lost_leases(pool: asyncpg.Pool) -> None:
    """lost_count counts lost leases since the run last made progress: a checkpoint that
    commits an assistant message resets it, one without (a resumed attempt's first
    write, say) leaves it, so a run that crashes its worker before any progress still
    reaches HANGO_MAX_ATTEMPTS."""
    (r,) = await enqueue_and_claim(pool, 1, WORKER)
    await pool.execute("UPDATE runs SET lost_count = $1", LOST_BEFORE)
    io = _io(pool, r)
    c = io.claim
    state = State(c.run_id, c.session_id, c.agent_id, c.tenant_id)

    async def lost() -> int:
        return int(await pool.fetchval("SELECT lost_count FROM runs WHERE id = $1", c.run_id))

    await io.checkpoint(state, [Message("user", [TextBlock(text="go")])], [], None)
    assert await lost() == LOST_BEFORE
    await io.checkpoint(state, [Message("assistant", [TextBlock(text="ok")])], [], None)
    assert await lost() == 0
