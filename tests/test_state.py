"""Typed run state: private state round trip through runs.state_json, missing and malformed keys."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest
from pydantic import BaseModel, Field

from hango_worker.agent.middlewares.repeat import RepeatState
from hango_worker.agent.state import (
    State,
    StateError,
    Todo,
    dump_state,
    load_private,
    load_state,
    store_private,
)


class Budget(BaseModel):
    spent_tokens: int = 0
    limit: int = 1000


class Notes(BaseModel):
    paths: list[str] = Field(default_factory=list)


IDS = {"run_id": "r", "session_id": "s", "agent_id": "a", "tenant_id": "t"}


async def test_three_middlewares_state_survives_runs_state_json(pool: asyncpg.Pool) -> None:
    st = State(**IDS, todos=[Todo(content="plan", status="in_progress")])
    store_private(st, "repeat_call", RepeatState(recent=[("00ff", 2)]))
    store_private(st, "budget", Budget(spent_tokens=42))
    store_private(st, "notes", Notes(paths=["/a", "/b"]))
    st.scratch["never"] = "persisted"
    run_id = await _a_run(pool)
    await pool.execute("UPDATE runs SET state_json = $2 WHERE id = $1", run_id, dump_state(st))
    raw = await pool.fetchval("SELECT state_json FROM runs WHERE id = $1", run_id)
    assert "scratch" not in raw and "messages" not in raw
    back = load_state(raw, **IDS)
    assert back.todos == st.todos
    assert load_private(back, "repeat_call", RepeatState) == (
        RepeatState(recent=[("00ff", 2)]),
        True,
    )
    assert load_private(back, "budget", Budget) == (Budget(spent_tokens=42), True)
    assert load_private(back, "notes", Notes) == (Notes(paths=["/a", "/b"]), True)
    assert back.scratch == {}


def test_missing_key_gives_the_default_and_records_state_missing(spans: Any) -> None:
    from hango_worker.telemetry.tracing import tracer

    st = State(**IDS)
    with tracer().start_as_current_span("probe"):
        value, found = load_private(st, "budget", Budget)
    assert (value, found) == (Budget(), False)
    (ev,) = spans.events("middleware.state_missing")
    assert ev.attributes["hango.middleware.name"] == "budget"


def test_malformed_private_blob_is_a_clear_error_naming_the_middleware() -> None:
    st = State(**IDS, private={"budget": {"spent_tokens": "lots"}})
    with pytest.raises(
        StateError, match=r"private state of middleware 'budget' is malformed at spent_tokens"
    ):
        load_private(st, "budget", Budget)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "state_json must be a JSON object"),
        ({"todos": "x"}, "state_json.todos must be a list"),
        ({"todos": [{"content": "a", "status": "nope"}]}, "state_json.todos is malformed"),
        ({"private": []}, "state_json.private must be an object"),
        ({"version": 9}, "version 9 is not supported"),
        ({"todo": []}, "unknown keys: ['todo']"),
    ],
)
def test_broken_state_json_is_a_precise_error(raw: Any, message: str) -> None:
    with pytest.raises(StateError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_state(raw, **IDS)


async def _a_run(pool: asyncpg.Pool) -> str:
    from hango_worker.store import repo

    tenant = repo.DEFAULT_TENANT_ID
    await repo.create_agent(
        pool, tenant_id=tenant, name="a", model="m", system=[], tools=[], config={}
    )
    ids = await repo.enqueue(pool, tenant_id=tenant, agent="a", input_text="hi")
    return ids["run_id"]


@pytest.mark.parametrize("raw", [None, {}, {"version": 1}])
def test_a_first_run_has_no_state_json_and_starts_empty(raw: Any) -> None:
    from hango_worker.provider.types import Message, TextBlock

    history = [Message("user", [TextBlock("hi")])]
    st = load_state(raw, **IDS, messages=history)
    assert (st.run_id, st.session_id, st.agent_id, st.tenant_id) == ("r", "s", "a", "t")
    assert (st.todos, st.private, st.scratch) == ([], {}, {})
    assert st.messages == history and st.messages is not history  # the run's own list
    assert dump_state(st) == {"version": 1, "todos": [], "private": {}}


def test_state_json_errors_name_the_exact_problem() -> None:
    cases = {
        "state_json must be a JSON object, got list": [],
        "state_json.todos must be a list": {"todos": "x"},
        "state_json.private must be an object keyed by middleware name": {"private": []},
    }
    for message, raw in cases.items():
        with pytest.raises(StateError) as e:
            load_state(raw, **IDS)
        assert str(e.value) == message
