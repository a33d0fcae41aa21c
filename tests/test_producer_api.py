"""The producer SQL API (docs/producers.md): psql, a trigger and plain asyncpg enqueue
through hango_api.enqueue; errors with their SQLSTATEs change nothing; the producer role
sees only the API; hango_done announces finished runs; the signatures are pinned.

The SQL in these tests talks to Postgres with raw asyncpg or psql, never through our
package: what a producer in another language does. Examples come out of the doc itself."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import asyncpg
import pytest

from hango_worker.store import sql
from tests.helpers import scripted
from tests.worker_helpers import make_agent, run_until_idle

DOC = Path(__file__).resolve().parent.parent / "docs" / "producers.md"


def example(name: str) -> str:
    """The fenced block right after `<!-- example: name -->` in docs/producers.md."""
    m = re.search(rf"<!-- example: {re.escape(name)} -->\n```\w*\n(.*?)```", DOC.read_text(), re.S)
    assert m, f"docs/producers.md has no example {name!r}"
    return m.group(1)


def psql(dsn: str, script: str, **variables: str) -> str:
    args = ["psql", dsn, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-f", "-"]
    for k, v in variables.items():
        args += ["-v", f"{k}={v}"]
    p = subprocess.run(args, input=script, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


async def test_psql_enqueues_a_run_a_worker_finishes_and_the_view_shows_its_answer(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="support", tools=[])
    enqueue = example("psql-enqueue") + "\\echo :run_id\n"
    run_id = await asyncio.to_thread(psql, dsn, enqueue)
    assert re.fullmatch(r"[0-9a-f-]{36}", run_id)
    assert await asyncio.to_thread(psql, dsn, enqueue) == run_id  # its idempotency key
    row = await pool.fetchrow("SELECT input, idempotency_key, status FROM runs")
    assert dict(row) == {
        "input": {"text": "Where is my order 1234?"},
        "idempotency_key": "order-1234-question",
        "status": "queued",
    }
    result = example("psql-result")
    assert await asyncio.to_thread(psql, dsn, result, run_id=run_id) == "queued|"
    await run_until_idle(dsn, scripted({"text": "Order 1234 ships today."}))
    out = await asyncio.to_thread(psql, dsn, result, run_id=run_id)
    assert out == "succeeded|Order 1234 ships today."


async def test_a_trigger_enqueues_with_the_business_write_and_a_rollback_queues_nothing(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="support", tools=[])
    conn = await asyncpg.connect(dsn)
    woken: list[str] = []
    await conn.add_listener("hango_runs", lambda c, p, ch, payload: woken.append(payload))
    try:
        await conn.execute(example("trigger"))
        # the business write as an application with the producer role and its own table
        await conn.execute("GRANT SELECT, INSERT ON orders TO hango_producer")
        await conn.execute("SET ROLE hango_producer")
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO orders VALUES (1, 'ada', 'two lamps')")
                assert await conn.fetchval("SELECT count(*) FROM hango_api.runs") == 1
                raise RuntimeError("the business write failed")
        assert await pool.fetchval("SELECT count(*) FROM runs") == 0
        assert await pool.fetchval("SELECT count(*) FROM sessions") == 0
        await conn.execute("INSERT INTO orders VALUES (2, 'bob', 'a chair')")
        row = await conn.fetchrow("SELECT run_id::text, input_text, status FROM hango_api.runs")
        assert row["input_text"] == "Review order 2 from bob: a chair"
        assert row["status"] == "queued"
        async with asyncio.timeout(20):
            while not woken:
                await asyncio.sleep(0.02)
        assert woken == [row["run_id"]]  # the worker's wake-up, for the committed one only
    finally:
        await conn.close()


async def _producer_finishes(
    pool: asyncpg.Pool, dsn: str, *cmd: str, env: dict[str, str] | None = None
) -> None:
    """Run a producer example (it enqueues, then waits for the answer): a worker
    finishes its run, and the example prints the run id, the status and the answer."""
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        env={**os.environ, "DATABASE_URL": dsn, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(60):
            while not await pool.fetchval("SELECT count(*) FROM runs"):
                await asyncio.sleep(0.05)
        await run_until_idle(dsn, scripted({"text": "It ships today."}))
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 10)
    assert proc.returncode == 0, err.decode()
    run_id = await pool.fetchval("SELECT id::text FROM runs WHERE idempotency_key = 'ticket-42'")
    assert out.decode().strip() == f"{run_id} succeeded It ships today."


async def test_python_without_our_package_enqueues_waits_and_reads_the_answer(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    await make_agent(pool, name="support", tools=[])
    script = example("python-asyncpg")
    assert "hango_worker" not in script
    check = "\nimport sys\nassert not [m for m in sys.modules if m.startswith('hango_worker')]\n"
    (tmp_path / "producer.py").write_text(script + check)
    await _producer_finishes(pool, dsn, sys.executable, "-I", str(tmp_path / "producer.py"))


def _node_pg() -> Path | None:
    """A folder with the `pg` package installed (npm, cached between runs), or None
    when Node, npm or the npm registry is not at hand."""
    if not (shutil.which("node") and shutil.which("npm")):
        return None
    where = Path(tempfile.gettempdir()) / "hango-test-node-pg"
    if not (where / "node_modules" / "pg").is_dir():
        where.mkdir(exist_ok=True)
        p = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(where), "pg@8"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        if p.returncode != 0:
            return None
    return where


async def test_node_pg_example_enqueues_waits_and_reads_the_answer(
    pool: asyncpg.Pool, dsn: str, tmp_path: Path
) -> None:
    where = await asyncio.to_thread(_node_pg)
    if where is None:
        pytest.skip("the Node example needs node, npm and the npm registry (pg)")
    await make_agent(pool, name="support", tools=[])
    (tmp_path / "producer.js").write_text(example("node-pg"))
    node_path = {"NODE_PATH": str(where / "node_modules")}
    await _producer_finishes(pool, dsn, "node", str(tmp_path / "producer.js"), env=node_path)


ENQUEUE = "SELECT hango_api.enqueue($1, $2::jsonb, idempotency_key => $3, config => $4::jsonb)"

BAD: list[tuple[str, str, str, str | None, str | None, str]] = [
    # (agent, input, key, config, tenant, expected SQLSTATE : message fragment)
    ("ghost", '{"text": "x"}', "k1", None, None, "QH002:no agent 'ghost' in this tenant"),
    ("support", '{"text": "x"}', "k1", None, "other", "QH002:no agent 'support'"),
    ("support", '{"text": "x"}', "k1", None, "nobody", "QH001:no tenant 'nobody'"),
    ("support", '"x"', "k1", None, None, "QH003:input must be a JSON object"),
    ("support", "null", "k1", None, None, "QH003:input must be a JSON object"),
    ("support", "{}", "k1", None, None, "QH003:input.text must be a non-empty string"),
    ("support", '{"text": ""}', "k1", None, None, "QH003:input.text must be a non-empty"),
    ("support", '{"text": 7}', "k1", None, None, "QH003:input.text must be a non-empty"),
    ("support", '{"text": "x", "limits": {}}', "k1", None, None, "QH003:unknown key 'limits'"),
    ("support", '{"text": "x"}', "k1", "[]", None, "QH003:config must be a JSON object"),
    ("support", '{"text": "x"}', "k1", '{"model": "m"}', None, "QH003:unknown key 'model'"),
    ("support", '{"text": "x"}', "k1", '{"limits": 5}', None, "QH003:config.limits must be"),
    ("support", '{"text": "x"}', "k1", '{"limits": {"turns": 5}}', None, "QH003:'turns'"),
    ("support", '{"text": "x"}', "k1", '{"memory_key": " "}', None, "QH003:config.memory_key"),
    ("support", '{"text": "x"}', "k1", '{"memory_key": "a\\u0007"}', None, "QH003:memory_key"),
    ("support", '{"text": "x"}', "k" * 201, None, None, "QH003:must be 1 to 200 characters"),
    ("support", '{"text": "x"}', "", None, None, "QH003:must be 1 to 200 characters, got 0"),
]


async def test_idempotency_and_every_bad_argument_is_a_clear_error_that_writes_nothing(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="support", tools=[])
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO tenants (id, name) VALUES ('00000000-0000-0000-0000-0000000000aa', "
            "'other')"
        )
        first = await conn.fetchval(ENQUEUE, "support", '{"text": "a"}', "same", None)
        again = await conn.fetchval(ENQUEUE, "support", '{"text": "b"}', "same", None)
        assert first == again
        assert await conn.fetchval("SELECT count(*) FROM runs") == 1
        for agent, input_, key, config, tenant, expected in BAD:
            code, message = expected.split(":", 1)
            with pytest.raises(asyncpg.PostgresError) as e:
                await conn.fetchval(
                    "SELECT hango_api.enqueue($1, $2::jsonb, idempotency_key => $3, "
                    "config => $4::jsonb, tenant => $5)",
                    agent,
                    input_,
                    key,
                    config,
                    tenant,
                )
            assert (e.value.sqlstate, message in str(e.value)) == (code, True), str(e.value)
        with pytest.raises(asyncpg.PostgresError) as e:  # a session of no agent
            await conn.fetchval(
                "SELECT hango_api.enqueue('support', '{\"text\": \"x\"}', "
                "session => gen_random_uuid())"
            )
        assert e.value.sqlstate == "QH004" and "no session" in str(e.value)
        assert await conn.fetchval("SELECT count(*) FROM runs") == 1
        assert await conn.fetchval("SELECT count(*) FROM sessions") == 1
    finally:
        await conn.close()


async def test_config_carries_limits_and_memory_key_into_the_run_and_a_session_continues(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="support", tools=[])
    conn = await asyncpg.connect(dsn)
    try:
        config = '{"limits": {"max_turns": 5}, "memory_key": "customer-17"}'
        first = await conn.fetchval(ENQUEUE, "support", '{"text": "hi"}', None, config)
        session = await conn.fetchval(
            "SELECT session_id FROM hango_api.runs WHERE run_id = $1", first
        )
        second = await conn.fetchval(
            "SELECT hango_api.enqueue('support', '{\"text\": \"more\"}', session => $1, "
            "tenant => 'default')",
            session,
        )
        rows = await pool.fetch("SELECT id, session_id, input FROM runs ORDER BY created_at")
    finally:
        await conn.close()
    assert [(str(r["id"]), str(r["session_id"])) for r in rows] == [
        (str(first), str(session)),
        (str(second), str(session)),
    ]
    assert rows[0]["input"] == {
        "text": "hi",
        "limits": {"max_turns": 5},
        "memory_key": "customer-17",
    }
    assert rows[1]["input"] == {"text": "more"}


async def test_priority_through_the_api_orders_the_claim_and_a_bad_one_writes_nothing(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="support", tools=[])
    conn = await asyncpg.connect(dsn)
    try:
        low = await conn.fetchval(ENQUEUE, "support", '{"text": "a"}', None, None)
        high = await conn.fetchval(
            "SELECT hango_api.enqueue('support', '{\"text\": \"b\"}', priority => 7)"
        )
        for bad in (-1, 1001, None):
            with pytest.raises(asyncpg.PostgresError) as e:
                await conn.fetchval(
                    "SELECT hango_api.enqueue('support', '{\"text\": \"c\"}', priority => $1)",
                    bad,
                )
            assert e.value.sqlstate == "QH003" and "priority must be 0 to 1000" in str(e.value)
        rows = await conn.fetch("SELECT id, priority FROM runs ORDER BY created_at")
    finally:
        await conn.close()
    assert [(r["id"], r["priority"]) for r in rows] == [(low, 0), (high, 7)]
    async with pool.acquire() as c:
        claimed = await c.fetch(sql.CLAIM, "w", 1, 30)
    assert [r["id"] for r in claimed] == [str(high)]  # the later run, by its priority


def test_the_doc_states_the_error_codes_the_tests_check() -> None:
    doc = DOC.read_text()
    for code in {e.split(":", 1)[0] for *_, e in BAD} | {"QH004", "QH005", "QH006"}:
        assert f"| `{code}` |" in doc


# Version 1 of the API, as producers call it (docs/producers.md). A later migration may
# add (a function, a defaulted argument at the end, a view column at the end) but never
# change or remove any of this: that needs a new API version beside this one.
V1_FUNCTIONS = {
    "enqueue": (
        [
            "agent text",
            "input jsonb",
            "session uuid DEFAULT NULL::uuid",
            "idempotency_key text DEFAULT NULL::text",
            "tenant text DEFAULT NULL::text",
            "config jsonb DEFAULT NULL::jsonb",
        ],
        "uuid",
    ),
    "cancel": (["run_id uuid", "tenant text DEFAULT NULL::text"], "text"),
    "resume": (["run_id uuid", "tenant text DEFAULT NULL::text"], "void"),
}
V1_RUNS_VIEW = [
    ("run_id", "uuid"),
    ("tenant", "text"),
    ("tenant_id", "uuid"),
    ("agent", "text"),
    ("agent_id", "uuid"),
    ("session_id", "uuid"),
    ("status", "text"),
    ("idempotency_key", "text"),
    ("input_text", "text"),
    ("created_at", "timestamp with time zone"),
    ("started_at", "timestamp with time zone"),
    ("finished_at", "timestamp with time zone"),
    ("attempt", "integer"),
    ("error_type", "text"),
    ("error_message", "text"),
    ("limit_reached", "text"),
    ("input_tokens", "numeric"),
    ("output_tokens", "numeric"),
    ("cost_usd", "numeric"),
    ("usage", "jsonb"),
    ("result_text", "text"),
    ("parent_run_id", "uuid"),
    ("output", "jsonb"),  # 0017_run_output: the structured answer
]


def compatibility_problems(
    functions: dict[str, list[tuple[list[str], str]]], view: list[tuple[str, str]]
) -> list[str]:
    """What in the database (each function's overloads, the view's columns) breaks a
    version 1 producer."""
    problems = []
    for name, (args, result) in V1_FUNCTIONS.items():
        found = functions.get(name, [])
        if len(found) != 1:
            problems.append(f"hango_api.{name}: {len(found)} functions (want exactly one)")
            continue
        have, have_result = found[0]
        if have[: len(args)] != args or have_result != result:
            problems.append(f"hango_api.{name}({', '.join(have)}) -> {have_result} changed")
        elif any(" DEFAULT " not in a for a in have[len(args) :]):
            problems.append(f"hango_api.{name}: an added argument has no default")
    if view[: len(V1_RUNS_VIEW)] != V1_RUNS_VIEW:
        problems.append(f"hango_api.runs columns changed: {view}")
    return problems


async def _api_shape(
    conn: asyncpg.Connection,
) -> tuple[dict[str, list[tuple[list[str], str]]], list[tuple[str, str]]]:
    functions: dict[str, list[tuple[list[str], str]]] = {}
    for f in await conn.fetch(
        "SELECT p.proname, pg_get_function_arguments(p.oid) AS args, "
        "pg_get_function_result(p.oid) AS result FROM pg_proc p "
        "WHERE p.pronamespace = 'hango_api'::regnamespace"
    ):
        args = [a.strip() for a in f["args"].split(",")] if f["args"] else []
        functions.setdefault(f["proname"], []).append((args, f["result"]))
    cols = await conn.fetch(
        "SELECT column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'hango_api' AND table_name = 'runs' ORDER BY ordinal_position"
    )
    return functions, [(c["column_name"], c["data_type"]) for c in cols]


async def test_the_api_signatures_and_view_columns_are_pinned(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn:
        functions, view = await _api_shape(conn)
        assert compatibility_problems(functions, view) == []
        # what the pin lets through (a defaulted argument at the end, as 0010_tenants'
        # priority was) and what it stops, on the API changed inside a transaction
        # rolled back after
        await conn.execute("BEGIN")
        try:
            await conn.execute(
                "DROP FUNCTION hango_api.enqueue(text, jsonb, uuid, text, text, jsonb, int)"
            )
            await conn.execute(
                "CREATE FUNCTION hango_api.enqueue(agent text, input jsonb, session uuid "
                "DEFAULT NULL, idempotency_key text DEFAULT NULL, tenant text DEFAULT NULL, "
                "config jsonb DEFAULT NULL, priority int DEFAULT 0, note text DEFAULT NULL) "
                "RETURNS uuid LANGUAGE sql AS 'SELECT NULL::uuid'"
            )
            assert compatibility_problems(*await _api_shape(conn)) == []
            await conn.execute("ALTER FUNCTION hango_api.cancel(uuid, text) RENAME TO stop")
            problems = compatibility_problems(*await _api_shape(conn))
            assert problems == ["hango_api.cancel: 0 functions (want exactly one)"]
        finally:
            await conn.execute("ROLLBACK")
    broken_view = [*V1_RUNS_VIEW[:3], ("agent_name", "text"), *V1_RUNS_VIEW[4:]]
    assert compatibility_problems(functions, broken_view) == [
        f"hango_api.runs columns changed: {broken_view}"
    ]
    no_default = {**functions, "resume": [([*V1_FUNCTIONS["resume"][0], "force boolean"], "void")]}
    assert compatibility_problems(no_default, view) == [
        "hango_api.resume: an added argument has no default"
    ]
    two = {**functions, "cancel": functions["cancel"] * 2}
    assert compatibility_problems(two, view) == ["hango_api.cancel: 2 functions (want exactly one)"]


async def test_the_producer_role_uses_the_api_and_cannot_touch_the_tables(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="support", tools=[])
    conn = await asyncpg.connect(dsn)
    try:
        role = await conn.fetchrow(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolbypassrls FROM pg_roles "
            "WHERE rolname = 'hango_producer'"
        )
        assert tuple(role) == (False, False, False, False)
        await conn.execute("SET ROLE hango_producer")
        run_id = await conn.fetchval("SELECT hango_api.enqueue('support', '{\"text\": \"hi\"}')")
        assert (
            await conn.fetchval("SELECT status FROM hango_api.runs WHERE run_id = $1", run_id)
            == "queued"
        )
        assert await conn.fetchval("SELECT hango_api.cancel($1)", run_id) == "cancelled"
        await conn.execute("SELECT hango_api.resume($1)", run_id)
        denied = [
            "SELECT * FROM runs",
            "SELECT * FROM agents",
            "SELECT * FROM messages",
            "SELECT * FROM tenants",
            f"UPDATE runs SET status = 'cancelled' WHERE id = '{run_id}'",
            "DELETE FROM runs",
            "INSERT INTO sessions (id, tenant_id, agent_id) VALUES (gen_random_uuid(), "
            "gen_random_uuid(), gen_random_uuid())",
            "SELECT * FROM hango_enqueue_run(NULL, 'support', '{\"text\": \"x\"}', NULL, NULL, "
            "NULL)",
            "SELECT hango_tenant_id(NULL)",
            "CREATE TABLE hango_api.mine (x int)",
        ]
        for sql in denied:
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await conn.execute(sql)
        for what in ("INSERT", "UPDATE", "DELETE"):  # the view: read-only for producers
            assert not await conn.fetchval(
                "SELECT has_table_privilege('hango_producer', 'hango_api.runs', $1)", what
            )
    finally:
        await conn.close()
    assert await pool.fetchval("SELECT count(*) FROM runs WHERE status = 'queued'") == 1


async def test_hango_done_announces_each_run_that_ends_and_cancel_resume_follow_the_api(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, name="support", tools=[])
    conn = await asyncpg.connect(dsn)
    done: list[str] = []
    await conn.add_listener("hango_done", lambda c, p, ch, payload: done.append(payload))
    try:
        await conn.execute(  # another tenant sees none of these runs
            "INSERT INTO tenants (id, name) VALUES (gen_random_uuid(), 'other')"
        )
        ok = await conn.fetchval("SELECT hango_api.enqueue('support', '{\"text\": \"a\"}')")
        stop = await conn.fetchval("SELECT hango_api.enqueue('support', '{\"text\": \"b\"}')")
        assert await conn.fetchval("SELECT hango_api.cancel($1)", stop) == "cancelled"
        for sql, arg, code, message in [
            ("SELECT hango_api.cancel($1)", stop, "QH006", "has already finished; nothing to"),
            ("SELECT hango_api.resume($1)", ok, "QH006", "is not cancelled or failed"),
            ("SELECT hango_api.cancel($1)", uuid.uuid4(), "QH005", "in this tenant"),
            ("SELECT hango_api.resume($1)", uuid.uuid4(), "QH005", "in this tenant"),
            ("SELECT hango_api.cancel($1, 'nobody')", ok, "QH001", "no tenant 'nobody'"),
            ("SELECT hango_api.cancel($1, 'other')", ok, "QH005", "in this tenant"),
            ("SELECT hango_api.resume($1, 'other')", stop, "QH005", "in this tenant"),
        ]:
            with pytest.raises(asyncpg.PostgresError) as e:
                await conn.fetchval(sql, arg)
            assert e.value.sqlstate == code and message in str(e.value), str(e.value)
        await run_until_idle(dsn, scripted({"text": "answer a"}))
        async with asyncio.timeout(20):
            while len(done) < 2:
                await asyncio.sleep(0.02)
        assert sorted(done) == sorted([str(ok), str(stop)])
        rows = await conn.fetch("SELECT run_id, status, result_text FROM hango_api.runs")
        assert {(r["run_id"], r["status"], r["result_text"]) for r in rows} == {
            (ok, "succeeded", "answer a"),
            (stop, "cancelled", None),
        }
        await conn.execute("SELECT hango_api.resume($1)", stop)
        await run_until_idle(dsn, scripted({"text": "answer b"}))
        async with asyncio.timeout(20):
            while len(done) < 3:
                await asyncio.sleep(0.02)
        assert done[2] == str(stop)
        assert (
            await conn.fetchval("SELECT result_text FROM hango_api.runs WHERE run_id = $1", stop)
            == "answer b"
        )
    finally:
        await conn.close()


async def test_the_python_client_and_cli_enqueue_through_the_same_function(
    pool: asyncpg.Pool, dsn: str
) -> None:
    from hango_worker.client import Client
    from hango_worker.store import repo

    await make_agent(pool, name="support", tools=[])
    client = Client(pool, tenant_id="nobody")  # only the SQL function knows this message
    with pytest.raises(repo.NotFound, match="no tenant 'nobody'"):
        await client.enqueue("support", "x")
    await pool.execute(
        "ALTER FUNCTION hango_enqueue_run(text, text, jsonb, uuid, text, jsonb, int) RENAME TO gone"
    )
    with pytest.raises(asyncpg.UndefinedFunctionError):
        await Client(pool).enqueue("support", "x")
    p = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "hango_worker.cli", "enqueue", "--agent", "support", "--input", "x"],
        env={**os.environ, "HANGO_DATABASE_URL": dsn},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode != 0 and "hango_enqueue_run" in p.stderr, p.stderr
    with pytest.raises(asyncpg.UndefinedFunctionError):
        await pool.fetchval("SELECT hango_api.enqueue('support', '{\"text\": \"x\"}')")
    assert await pool.fetchval("SELECT count(*) FROM runs") == 0
