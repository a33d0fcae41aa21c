"""JSON nesting and agent names at the producer surfaces: the SQL API (migration 0013),
the Python `Client` and the console's edited arguments share one depth (64 levels,
store/json_limits.py). A refusal is one error, and nothing is queued."""

from __future__ import annotations

import json
from typing import Any

import asyncpg
import pytest

from hango_worker.client import Client
from hango_worker.console.app import edited_input
from hango_worker.console.auth import Refused
from hango_worker.store import json_limits, repo
from tests.tenant_helpers import tenant_with_agent

OK = '{"text": "hi"}'


def lists(depth: int, leaf: str = "1") -> str:
    """JSON text whose innermost item is at `depth` (the root is at 1)."""
    return "[" * (depth - 1) + leaf + "]" * (depth - 1)


def nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth - 1):
        value = {"a": value}
    assert isinstance(value, dict)
    return value


def with_limits(raw: str) -> str:
    return '{"limits": {"tool_call_limits": ' + raw + "}}"


async def queued(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM runs"))


@pytest.mark.parametrize(
    ("input_", "config", "says"),
    [
        (OK, with_limits(lists(63)), "config is nested more than 64"),
        ('{"text": ' + lists(64) + "}", None, "input is nested more than 64 levels deep"),
    ],
)
async def test_the_sql_api_refuses_nesting_past_64_levels_and_queues_nothing(
    pool: asyncpg.Pool, input_: str, config: str | None, says: str
) -> None:
    """Proves: hango_api.enqueue refuses input or config nested past 64 levels with one
    QH003 error (before: a config.limits value as deep as Postgres parses was queued and
    failed at load), and the same depth minus one level is accepted."""
    await tenant_with_agent(pool, "default")
    call = "SELECT hango_api.enqueue('agent', $1::text::jsonb, config => $2::text::jsonb)"
    with pytest.raises(asyncpg.PostgresError, match=says) as e:
        await pool.fetchval(call, input_, config)
    assert e.value.sqlstate == "QH003"
    assert await queued(pool) == 0
    fits = with_limits(lists(62, "[]"))
    assert await pool.fetchval(call, OK, fits) is not None


async def test_deeper_than_postgres_parses_is_one_error_before_the_call(pool: asyncpg.Pool) -> None:
    """Proves: JSON nested deeper than Postgres's own parser takes is refused by
    Postgres (54001) when the argument is read: one error, nothing queued."""
    await tenant_with_agent(pool, "default")
    with pytest.raises(asyncpg.PostgresError) as e:
        await pool.fetchval(
            "SELECT hango_api.enqueue('agent', $1::text::jsonb, config => $2::text::jsonb)",
            OK,
            with_limits(lists(50_000)),
        )
    assert e.value.sqlstate == "54001"
    assert await queued(pool) == 0


async def test_the_client_refuses_deep_json_with_the_clis_rule(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Proves: the Client's JSON arguments (config, limits, approve input) follow the
    CLI's rule, one ValueError naming the argument (before: a config nested 5,000 deep
    was a RecursionError; 100 deep was stored); nothing is created or queued."""
    async with Client.connect(dsn) as client:
        await client.create_agent("agent", "m")
        with pytest.raises(ValueError, match=r"^config: nested more than 64 levels deep$"):
            await client.create_agent("deep", "m", config={"metadata": nested(5_000)})
        with pytest.raises(ValueError, match=r"^config: nested more than 64"):
            await client.create_agent("deep", "m", config={"metadata": nested(64)})
        with pytest.raises(ValueError, match=r"^limits: nested more than 64 levels deep$"):
            await client.enqueue("agent", "hi", limits={"tool_call_limits": nested(100)})
        with pytest.raises(ValueError, match=r"^input: holds a NUL character"):
            await client.approve("00000000-0000-4000-8000-000000000001", input={"k": "a\x00"})
        loop: dict[str, Any] = {}
        loop["self"] = loop  # contains itself: nested without end
        with pytest.raises(ValueError, match=r"^input: nested more than 64"):
            await client.approve("00000000-0000-4000-8000-000000000001", input=loop)
    assert await pool.fetchval("SELECT count(*) FROM agents WHERE name = 'deep'") == 0
    assert await queued(pool) == 0


def test_the_console_refuses_deep_edited_arguments_in_one_line() -> None:
    """Proves: the console's edited arguments go through the same rule (before: a
    RecursionError, a 500)."""
    with pytest.raises(Refused) as e:
        edited_input("[" * 20_000 + "]" * 20_000)
    assert "the edited arguments: nested more than 64 levels deep" in str(e.value)
    assert edited_input(json.dumps(nested(64))) == nested(64)


def test_one_depth_rule_for_text_and_values() -> None:
    """The CLI's and the Client's checks are one rule: 64 levels pass, 65 do not."""
    for depth in (64, 65):
        raw = lists(depth)
        checks = [
            lambda r=raw: json_limits.loads_json(r, "x"),
            lambda r=raw: json_limits.check_json(json.loads(r), "x"),
        ]
        for check in checks:
            if depth <= json_limits.MAX_JSON_DEPTH:
                check()
            else:
                with pytest.raises(ValueError, match=r"^x: nested more than 64 levels deep$"):
                    check()
    with pytest.raises(ValueError, match=r"^x: Expecting value: .* \(not valid JSON\)$"):
        json_limits.loads_json("[1,", "x")


async def test_an_agent_argument_shaped_like_a_uuid_is_an_id_only(pool: asyncpg.Pool) -> None:
    """Proves: hango_api.enqueue reads a UUID-shaped agent as an id only (before: a name
    was tried first, so an agent named like another agent's id took its enqueues), and
    a name as a name only."""
    await tenant_with_agent(pool, "default")
    victim = await pool.fetchval("SELECT id::text FROM agents WHERE name = 'agent'")
    await pool.execute("ALTER TABLE agents DROP CONSTRAINT agents_name_not_uuid")
    await repo.create_agent(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        name="impostor",
        model="m",
        system=[],
        tools=[],
        config={},
    )
    await pool.execute("UPDATE agents SET name = $1 WHERE name = 'impostor'", victim.upper())
    run = await pool.fetchval("SELECT hango_api.enqueue($1, $2::text::jsonb)", victim.upper(), OK)
    owner = await pool.fetchval("SELECT agent_id::text FROM runs WHERE id = $1", run)
    assert owner == victim, "the impostor took the enqueue"
    with pytest.raises(asyncpg.PostgresError, match="no agent") as e:
        await pool.fetchval("SELECT hango_api.enqueue($1, $2::text::jsonb)", "agent2", OK)
    assert e.value.sqlstate == "QH002"
    run = await pool.fetchval("SELECT hango_api.enqueue('agent', $1::text::jsonb)", OK)
    assert await pool.fetchval("SELECT agent_id::text FROM runs WHERE id = $1", run) == victim
