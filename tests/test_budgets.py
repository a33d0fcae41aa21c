"""Spend budgets: the reservation before each call, its settling, holds of attempts that
ended, runs that wait for a budget (no slot) or fail, the fleet-wide race, the idle path."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.batch import Waiting
from hango_worker.agent.control import RunControl
from hango_worker.provider.prices import PriceTable
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import Message, Request, Response, StopReason, TextBlock, Usage
from hango_worker.render import Painter, print_run
from hango_worker.run.budget import (
    BudgetDirectory,
    Hold,
    RunBudgetGate,
    input_tokens_bound,
    worst_case_usd,
)
from hango_worker.run.execute import RunDeps
from hango_worker.run.worker import Worker
from hango_worker.store import budgets, db, repo
from hango_worker.tool.registry import Registry
from tests.conftest import SpanReader
from tests.test_cli import cli
from tests.worker_helpers import enqueue, enqueue_and_claim, make_agent, run_until_idle, settings

T = repo.DEFAULT_TENANT_ID
# claude-test at $1 in, $10 out per million tokens (cache writes 1.25x / 2x)
PRICES = {
    "claude-test": {
        "input": 1.0,
        "output": 10.0,
        "cache_write_5m": 1.25,
        "cache_write_1h": 2.0,
        "cache_read": 0.1,
    }
}
TABLE = PriceTable(PRICES)
USAGE = {"input_tokens": 100, "output_tokens": 20}  # what each scripted call uses
ACTUAL = (100 * 1.0 + 20 * 10.0) / 1e6  # its cost: $0.0003


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _request(text: str = "hello " * 30, max_tokens: int = 100) -> Request:
    return Request("claude-test", [Message("user", [TextBlock(text)])], max_tokens=max_tokens)


async def _agent_id(pool: asyncpg.Pool, name: str = "agent") -> str:
    return str(await pool.fetchval("SELECT id::text FROM agents WHERE name = $1", name))


def _gate(pool: asyncpg.Pool, agent_id: str, run_id: str, attempt: int = 1) -> RunBudgetGate:
    return RunBudgetGate(pool, BudgetDirectory(), TABLE, RunControl(), run_id, attempt, T, agent_id)


async def _levels(pool: asyncpg.Pool) -> list[tuple[float, float]]:
    rows = await pool.fetch("SELECT spent_usd, reserved_usd FROM budgets ORDER BY id")
    return [(r["spent_usd"], r["reserved_usd"]) for r in rows]


def test_the_worst_case_is_every_input_token_at_the_dearest_rate_plus_max_tokens() -> None:
    req = _request()
    n = input_tokens_bound(req)
    assert n * 3 >= len(Message("user", [TextBlock("hello " * 30)]).to_dict()["content"][0]["text"])
    assert worst_case_usd(TABLE, req) == pytest.approx((n * 2.0 + 100 * 10.0) / 1e6)
    assert worst_case_usd(TABLE, Request("no-price", req.messages)) is None


async def test_a_grant_holds_the_worst_case_on_every_budget_and_settling_charges_the_cost(
    pool: asyncpg.Pool,
) -> None:
    await make_agent(pool)
    aid = await _agent_id(pool)
    worst = worst_case_usd(TABLE, _request())
    assert worst is not None
    # the tenant's day budget fits 3 calls in flight, the agent's month budget 2
    await budgets.set_budget(pool, T, None, "day", 3.5 * worst)
    await budgets.set_budget(pool, T, "agent", "month", 2.5 * worst, "wait")
    gate = _gate(pool, aid, "00000000-0000-4000-8000-000000000001")
    h1 = await gate.reserve(_request())
    h2 = await gate.reserve(_request())
    assert isinstance(h1, Hold) and isinstance(h2, Hold) and len(h1.budget_ids) == 2
    assert await _levels(pool) == [(0, pytest.approx(2 * worst))] * 2
    with pytest.raises(Waiting) as w:  # the agent's budget has no room for a third
        await gate.reserve(_request())
    record = w.value.record
    assert record["reason"] == "budget" and record["not_started"] == []
    assert record["need_usd"] == pytest.approx(worst)
    assert [b["period"] for b in record["budgets"]] == ["month"]  # only the one without room
    assert await _levels(pool) == [(0, pytest.approx(2 * worst))] * 2  # nothing held for it
    resp = Response(Message("assistant", [TextBlock("x")]), StopReason.END_TURN, Usage(**USAGE))
    await gate.settle(h1, _request(), resp)  # the call's cost replaces its hold
    await gate.settle(h2, _request(), None)  # a failed call: nothing charged
    assert await _levels(pool) == [(pytest.approx(ACTUAL), pytest.approx(0, abs=1e-12))] * 2
    assert await pool.fetchval("SELECT count(*) FROM budget_holds") == 0
    h3 = await gate.reserve(_request())
    assert h3 is not None
    await gate.settle(h3, _request(), None, interrupted=True)  # cut short: the whole hold
    assert await _levels(pool) == [(pytest.approx(ACTUAL + worst), pytest.approx(0, abs=1e-12))] * 2


async def test_a_response_with_an_unpriced_unit_is_charged_its_hold_never_zero(
    pool: asyncpg.Pool,
) -> None:
    await make_agent(pool)
    aid = await _agent_id(pool)
    worst = worst_case_usd(TABLE, _request())
    assert worst is not None
    await budgets.set_budget(pool, T, None, "day", 10 * worst)
    gate = _gate(pool, aid, "00000000-0000-4000-8000-000000000002")
    hold = await gate.reserve(_request())
    assert isinstance(hold, Hold)
    usage = Usage(**USAGE, service_tier="priority")  # no default price: the cost is unknown
    assert TABLE.cost("claude-test", usage) is None
    resp = Response(Message("assistant", [TextBlock("x")]), StopReason.END_TURN, usage)
    await gate.settle(hold, _request(), resp)
    assert await _levels(pool) == [(pytest.approx(worst), pytest.approx(0, abs=1e-12))]


async def test_a_fail_budget_fails_the_run_and_an_unpriced_model_cannot_be_budgeted(
    pool: asyncpg.Pool, dsn: str, spans: SpanReader
) -> None:
    await make_agent(pool, tools=[])
    await budgets.set_budget(pool, T, "agent", "day", 0.0, "fail")
    before = sample("hango_budget_exhausted_total", tenant="default", action="fail")
    run_id = await enqueue(pool)
    provider = ScriptedProvider([{"text": "never", "usage": USAGE}])
    await run_until_idle(dsn, provider, model_prices=PRICES)
    row = await pool.fetchrow("SELECT status, error FROM runs WHERE id = $1", run_id)
    assert row["status"] == "failed" and row["error"]["type"] == "budget_exhausted"
    assert "day budget $0.00" in row["error"]["message"]
    assert provider.calls == 0
    assert sample("hango_budget_exhausted_total", tenant="default", action="fail") == before + 1
    [event] = spans.events("hango.budget.exhausted")
    assert event.attributes["hango.budget.action"] == "fail"
    assert event.attributes["hango.budget.period"] == "day"
    # a model without a price: its worst case is unknown, the run fails before the call
    await budgets.set_budget(pool, T, "agent", "day", 10.0, "fail")
    run_id = await enqueue(pool)
    await run_until_idle(dsn, provider)  # no HANGO_MODEL_PRICES: claude-test has no price
    row = await pool.fetchrow("SELECT status, error FROM runs WHERE id = $1", run_id)
    assert row["status"] == "failed" and row["error"]["type"] == "budget_unpriced"
    assert "HANGO_MODEL_PRICES" in row["error"]["message"] and provider.calls == 0
    assert spans.events("hango.budget.unpriced")


async def test_a_spent_budget_parks_its_runs_without_a_slot_until_it_has_room(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    await budgets.set_budget(pool, T, None, "month", 0.0)  # on_exhausted: wait
    ids = [await enqueue(pool, "go") for _ in range(3)]
    waits = sample("hango_budget_exhausted_total", tenant="default", action="wait")
    suspended = sample("hango_runs_suspended_total", reason="budget")
    provider = ScriptedProvider([{"text": "done", "usage": USAGE}])
    await run_until_idle(dsn, provider, model_prices=PRICES)
    rows = await pool.fetch(
        "SELECT status, lease_owner, waiting_for FROM runs WHERE id = ANY($1::uuid[])", ids
    )
    assert [r["status"] for r in rows] == ["waiting"] * 3
    assert all(r["lease_owner"] is None for r in rows)  # no worker, no slot
    assert {r["waiting_for"]["reason"] for r in rows} == {"budget"}
    assert provider.calls == 0
    assert sample("hango_budget_exhausted_total", tenant="default", action="wait") == waits + 3
    assert sample("hango_runs_suspended_total", reason="budget") == suspended + 3
    [shown] = await budgets.list_budgets(pool, T)
    assert shown["waiting"] == 3 and shown["remaining_usd"] == 0
    out = io.StringIO()
    print_run(Painter(out), await repo.run_details(pool, T, ids[0]))
    assert "waiting for a spend budget since" in out.getvalue()
    assert "approve" not in out.getvalue()  # nobody is asked to decide anything
    # raised: the waiting runs are queued again at once, and finish
    await budgets.set_budget(pool, T, None, "month", 1.0)
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM runs WHERE status = 'queued' AND id = ANY($1::uuid[])", ids
        )
        == 3
    )
    await run_until_idle(dsn, provider, model_prices=PRICES)
    statuses = await pool.fetch("SELECT status FROM runs WHERE id = ANY($1::uuid[])", ids)
    assert {r["status"] for r in statuses} == {"succeeded"} and provider.calls == 3
    assert await _levels(pool) == [(pytest.approx(3 * ACTUAL), pytest.approx(0, abs=1e-12))]


async def test_the_sweep_wakes_waiting_runs_when_the_window_rolls_over(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=[])
    await budgets.set_budget(pool, T, None, "day", 1.0)
    await pool.execute("UPDATE budgets SET spent_usd = 1.0")  # the day's budget is spent
    run_id = await enqueue(pool)
    provider = ScriptedProvider([{"text": "done", "usage": USAGE}])
    await run_until_idle(dsn, provider, model_prices=PRICES)
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id) == "waiting"
    deps = RunDeps(pool, settings(dsn), Registry([]), provider, "sweeper")
    await Worker(deps, dsn).sweep()  # still the same day: it waits on
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id) == "waiting"
    assert deps.budgets.applies(T, "any agent")  # the sweep read the directory too
    await pool.execute("UPDATE budgets SET window_start = window_start - interval '1 day'")
    assert await Worker(deps, dsn).sweep() >= 1  # a new day: woken
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id) == "queued"
    await run_until_idle(dsn, provider, model_prices=PRICES)
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id) == "succeeded"
    # the spend of the old window is gone, the new window holds this call only
    assert await _levels(pool) == [(pytest.approx(ACTUAL), pytest.approx(0, abs=1e-12))]


async def test_a_hold_of_an_attempt_that_ended_is_given_back_by_the_sweep(
    pool: asyncpg.Pool, dsn: str
) -> None:
    [claimed] = await enqueue_and_claim(pool, 1, "w1")
    aid = await _agent_id(pool)
    await budgets.set_budget(pool, T, None, "day", 1.0)
    gate = _gate(pool, aid, claimed["id"], claimed["attempt"])
    hold = await gate.reserve(_request())  # then the worker dies before settling
    assert hold is not None
    released = sample("hango_budget_holds_released_total")
    deps = RunDeps(pool, settings(dsn), Registry([]), ScriptedProvider([]), "sweeper")
    await Worker(deps, dsn).sweep()  # the attempt still runs: its hold stays
    assert await _levels(pool) == [(0, pytest.approx(hold.amount_usd))]
    await pool.execute(  # the lease expired and the run went back to the queue
        "UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL"
    )
    await Worker(deps, dsn).sweep()
    assert await _levels(pool) == [(0, 0)]
    assert await pool.fetchval("SELECT count(*) FROM budget_holds") == 0
    assert sample("hango_budget_holds_released_total") == released + 1
    assert sample("hango_budget_reserved_usd", tenant="default", agent="", period="day") == 0
    assert sample("hango_budget_limit_usd", tenant="default", agent="", period="day") == 1.0
    # the dead worker's call did end after all: its cost is still charged, once
    resp = Response(Message("assistant", [TextBlock("x")]), StopReason.END_TURN, Usage(**USAGE))
    await gate.settle(hold, _request(), resp)
    assert await _levels(pool) == [(pytest.approx(ACTUAL), 0)]


class _NoPool:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the idle path used the pool ({name})")


async def test_no_budget_for_the_run_costs_no_query() -> None:
    directory = BudgetDirectory(frozenset({"other-tenant"}), frozenset({"other-agent"}), True)
    gate = RunBudgetGate(_NoPool(), directory, TABLE, RunControl(), "r", 1, T, "a")  # type: ignore[arg-type]
    assert await gate.reserve(_request()) is None


async def test_eight_workers_of_fifty_runs_never_spend_past_the_budget(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """400 runs at once (8 workers x 50 slots) against one budget that holds 60 worst
    cases. The model answers no call until every run has either been granted its call
    or refused, so all the grants are in flight together: exactly 60 are granted (what
    is spent plus held never passes the limit), the other 340 fail without calling."""
    await make_agent(pool, tools=[], config={"max_tokens": 2000})
    request = Request(  # about what each run asks (the loop adds cache breakpoints)
        "claude-test",
        [Message("user", [TextBlock("same question")])],
        system=[TextBlock("Be brief.")],
        max_tokens=2000,
    )
    worst = worst_case_usd(TABLE, request)
    assert worst is not None
    limit = 60.5 * worst
    await budgets.set_budget(pool, T, None, "day", limit, "fail")
    ids = [await enqueue(pool, "same question") for _ in range(400)]
    usage = {"input_tokens": 100, "output_tokens": 1500}
    actual = TABLE.cost("claude-test", Usage(**usage))
    assert actual is not None and actual < worst
    provider = ScriptedProvider([{"text": "ok", "usage": usage}])
    refusals = sample("hango_budget_exhausted_total", tenant="default", action="fail")
    in_flight = peak = 0
    held: list[Any] = []
    everyone = asyncio.Event()
    complete = provider.complete

    def all_decided() -> bool:
        refused = sample("hango_budget_exhausted_total", tenant="default", action="fail")
        return in_flight + refused - refusals >= 400

    async def watch() -> None:
        while not all_decided():
            await asyncio.sleep(0.01)
        [(_, reserved)] = await _levels(pool)
        holds = await pool.fetchrow(
            "SELECT count(*) AS n, sum(amount_usd) AS total, min(amount_usd) AS least, "
            "max(amount_usd) AS most FROM budget_holds"
        )
        held.append((reserved, dict(holds)))
        everyone.set()

    async def counted(req: Request, on_text: Any = None) -> Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        try:
            await asyncio.wait_for(everyone.wait(), 120)
            return await complete(req, on_text)
        finally:
            in_flight -= 1

    provider.complete = counted  # type: ignore[method-assign]
    s = settings(dsn, worker_concurrency=50, model_prices=PRICES)
    shared = await db.create_pool(dsn, min_size=1, max_size=40)
    watcher = asyncio.create_task(watch())
    try:
        workers = [
            Worker(RunDeps(shared, s, Registry([]), provider, f"w{i}"), dsn) for i in range(8)
        ]
        await asyncio.gather(*(w.run(until_idle=True) for w in workers))
    finally:
        watcher.cancel()
        await shared.close()
    rows = await pool.fetch(
        "SELECT status, error->>'type' AS e FROM runs WHERE id = ANY($1::uuid[])", ids
    )
    ok = sum(1 for r in rows if r["status"] == "succeeded")
    refused = sum(1 for r in rows if r["e"] == "budget_exhausted")
    assert (ok, refused, peak) == (60, 340, 60)
    assert provider.calls == ok  # a refused run never called the model
    # the figure, with every grant in flight: 60 holds of one worst case each, held on
    # the budget together, and that is within the limit (a 61st would not be)
    [(reserved, holds)] = held
    assert holds["n"] == 60 and holds["least"] == holds["most"] >= worst
    assert reserved == pytest.approx(holds["total"]) and reserved <= limit
    assert reserved + holds["most"] > limit
    [(spent, reserved)] = await _levels(pool)
    assert spent == pytest.approx(ok * actual) and spent <= limit  # no overspend at all
    assert reserved == pytest.approx(0, abs=1e-9)
    assert await pool.fetchval("SELECT count(*) FROM budget_holds") == 0


def test_budgets_set_show_rm_as_an_operator_drives_them_and_bad_input(dsn: str) -> None:
    cli(dsn, "tenants", "create", "acme")
    cli(dsn, "agents", "create", "--tenant", "acme", "--name", "bot", "--model", "m")
    row = json.loads(
        cli(
            dsn, "budgets", "set", "--tenant", "acme", "--period", "month", "--usd", "500", "--json"
        ).stdout
    )
    assert (row["tenant"], row["agent"], row["period"], row["limit_usd"]) == (
        "acme",
        None,
        "month",
        500.0,
    )
    assert row["on_exhausted"] == "wait" and row["spent_usd"] == 0 and row["remaining_usd"] == 500
    line = cli(
        dsn,
        "budgets",
        "set",
        "--tenant",
        "acme",
        "--agent",
        "bot",
        "--period",
        "day",
        "--usd",
        "2.5",
        "--on-exhausted",
        "fail",
    ).stdout
    assert (
        line.startswith("acme/bot day: limit=$2.50 spent=$0.0000") and "on_exhausted=fail" in line
    )
    cli(
        dsn, "budgets", "set", "--tenant", "acme", "--agent", "bot", "--period", "day", "--usd", "3"
    )
    shown = json.loads(cli(dsn, "budgets", "show", "--tenant", "acme", "--json").stdout)
    assert [(b["agent"], b["period"], b["limit_usd"]) for b in shown] == [
        (None, "month", 500.0),
        ("bot", "day", 3.0),  # changed in place, on_exhausted back to the default
    ]
    assert shown[1]["on_exhausted"] == "wait"
    assert json.loads(cli(dsn, "budgets", "show", "--json").stdout) == []  # the default tenant
    assert len(json.loads(cli(dsn, "budgets", "show", "--all", "--json").stdout)) == 2
    for args, code, words in [
        (("budgets", "set", "--period", "day", "--usd", "-1"), 2, "out of range"),
        (("budgets", "set", "--period", "day", "--usd", "nan"), 2, "out of range"),
        (("budgets", "set", "--period", "day", "--usd", "lots"), 2, "not a number of USD"),
        (("budgets", "set", "--period", "week", "--usd", "1"), 2, "invalid choice"),
        (("budgets", "set", "--period", "day", "--usd", "1", "--on-exhausted", "x"), 2, "choice"),
        (
            (
                "budgets",
                "set",
                "--tenant",
                "acme",
                "--agent",
                "ghost",
                "--period",
                "day",
                "--usd",
                "1",
            ),
            3,
            "no agent 'ghost'",
        ),
        (("budgets", "set", "--tenant", "nosuch", "--period", "day", "--usd", "1"), 3, "no tenant"),
        (
            ("budgets", "rm", "--tenant", "acme", "--period", "day"),
            3,
            "no day budget for the tenant",
        ),
    ]:
        p = cli(dsn, *args, ok=False)
        assert p.returncode == code and words in p.stderr, (args, p.returncode, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    assert cli(dsn, "budgets", "rm", "--tenant", "acme", "--agent", "bot").stdout == (
        "removed 1 budget\n"
    )
    left = json.loads(cli(dsn, "budgets", "show", "--tenant", "acme", "--json").stdout)
    assert [b["period"] for b in left] == ["month"]


async def test_bad_budgets_are_refused_in_python_and_by_the_table(pool: asyncpg.Pool) -> None:
    for args, words in [
        (("day", -1.0), "0 to"),
        (("day", float("inf")), "0 to"),
        (("day", True), "0 to"),
        (("week", 1.0), "day or month"),
    ]:
        with pytest.raises(ValueError, match=words):
            await budgets.set_budget(pool, T, None, *args)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wait or fail"):
        await budgets.set_budget(pool, T, None, "day", 1.0, "panic")
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(
            "INSERT INTO budgets (tenant_id, period, limit_usd, window_start) "
            "VALUES ($1, 'day', 'NaN', now())",
            T,
        )
    assert await budgets.list_budgets(pool) == []
    await budgets.set_budget(pool, T, None, "day", 1.0)
    for edit in ("spent_usd = 'NaN'", "reserved_usd = -1", "spent_usd = 'Infinity'"):
        with pytest.raises(asyncpg.CheckViolationError):  # the workers' levels stay sane
            await pool.execute(f"UPDATE budgets SET {edit}")


async def test_a_run_that_waits_mid_run_resumes_with_its_history_whole(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """The budget has room for the first call, not the second: the run waits after its
    tool result is recorded, and once the budget is raised it goes on from there."""
    await make_agent(pool, tools=["calculator"], config={"max_tokens": 1000})
    first = Request(
        "claude-test",
        [Message("user", [TextBlock("add")])],
        system=[TextBlock("Be brief.")],
        max_tokens=1000,
    )
    worst = worst_case_usd(TABLE, first)
    assert worst is not None
    await budgets.set_budget(pool, T, "agent", "day", 1.5 * worst)
    usage = {"input_tokens": 10, "output_tokens": 900}  # most of the first call's hold
    script = [
        {"tool_calls": [{"name": "calculator", "input": {"expression": "1+1"}}], "usage": usage},
        {"text": "2", "usage": usage},
    ]
    provider = ScriptedProvider(script)
    run_id = await enqueue(pool, "add")
    await run_until_idle(dsn, provider, model_prices=PRICES)
    row = await pool.fetchrow("SELECT status, waiting_for FROM runs WHERE id = $1", run_id)
    assert row["status"] == "waiting" and row["waiting_for"]["reason"] == "budget"
    assert provider.calls == 1
    roles = await pool.fetch("SELECT role FROM messages WHERE run_id = $1 ORDER BY seq", run_id)
    assert [r["role"] for r in roles] == ["user", "assistant", "user"]  # the result is kept
    await budgets.set_budget(pool, T, "agent", "day", 10.0)
    await run_until_idle(dsn, provider, model_prices=PRICES)
    row = await pool.fetchrow("SELECT status FROM runs WHERE id = $1", run_id)
    assert row["status"] == "succeeded" and provider.calls == 2
    msgs = await pool.fetch(
        "SELECT role, content FROM messages WHERE run_id = $1 ORDER BY seq", run_id
    )
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[2]["content"][0]["type"] == "tool_result"
    cost = TABLE.cost("claude-test", Usage(**usage))
    assert cost is not None
    assert await _levels(pool) == [(pytest.approx(2 * cost), pytest.approx(0, abs=1e-12))]
