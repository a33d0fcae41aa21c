"""The HTTP API under /v1/ on the console's real uvicorn and the real database: the
enqueue's idempotency key, roles and tenant scoping, decisions, problem documents, the
resumable event stream (and Client.stream, the same stream), the OpenAPI document."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import asyncpg
import httpx2 as httpx

from hango_worker.client import Client
from hango_worker.console.api_openapi import document
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.store.run_stream import Position, parse_event_id
from tests.console_helpers import ACT, OTHER, READ, bearer, console, other_tenant_run, waiting_runs
from tests.helpers import call, recording_tool, scripted
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle

DOC = Path(__file__).resolve().parent.parent / "docs" / "http-api.json"
PROBLEM = "application/problem+json"


def is_problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    body: dict[str, Any] = r.json()
    assert body["status"] == status and body["detail"]
    return body


async def events(
    c: httpx.AsyncClient, run_id: str, last: str | None = None
) -> list[tuple[str | None, str, dict[str, Any]]]:
    """(id, event, data) of each message of the run's stream, to its end."""
    headers = {"Last-Event-ID": last} if last is not None else {}
    out: list[tuple[str | None, str, dict[str, Any]]] = []
    msg: dict[str, str] = {}
    async with c.stream("GET", f"/v1/runs/{run_id}/events", headers=headers) as s:
        assert s.status_code == 200
        assert s.headers["content-type"].startswith("text/event-stream")
        async for line in s.aiter_lines():
            if line.startswith(":"):  # a keep-alive comment
                continue
            if line:
                key, _, value = line.partition(": ")
                msg[key] = value
                continue
            if "event" in msg:
                out.append((msg.get("id"), msg["event"], json.loads(msg["data"])))
                if msg["event"] == "end":
                    return out
            msg = {}
    return out


async def test_an_enqueue_with_an_idempotency_key_twice_makes_one_run(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool)
    body = {"agent": "agent", "input": "hello", "priority": 7, "limits": {"max_turns": 3}}
    key = {"Idempotency-Key": "order-1234"}
    async with console(dsn) as url, httpx.AsyncClient(base_url=url) as c:
        is_problem(await c.post("/v1/runs", json=body), 401)
        is_problem(await c.post("/v1/runs", json=body, headers=bearer(READ)), 403)
        first = await c.post("/v1/runs", json=body, headers={**key, **bearer(ACT)})
        again = await c.post("/v1/runs", json=body, headers={**key, **bearer(ACT)})
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["run_id"] == again.json()["run_id"]
        assert (first.json()["created"], again.json()["created"]) == (True, False)
        run_id = first.json()["run_id"]
        # the rules are the CLI's and the SQL API's: one line naming what is wrong
        act = bearer(ACT)
        bad = await c.post("/v1/runs", json={**body, "priority": 5000}, headers=act)
        assert "priority must be 0 to 1000" in is_problem(bad, 400)["detail"]
        bad = await c.post("/v1/runs", json={**body, "limits": {"max_turns": 0}}, headers=act)
        assert "limits.max_turns" in is_problem(bad, 422)["detail"]
        is_problem(await c.post("/v1/runs", json={**body, "agent": "nobody"}, headers=act), 404)
        is_problem(await c.post("/v1/runs", json={**body, "colour": "red"}, headers=act), 422)
        is_problem(await c.post("/v1/runs", content=b"{", headers=act), 400)
        long_key = {"Idempotency-Key": "k" * 201, **act}
        is_problem(await c.post("/v1/runs", json=body, headers=long_key), 400)
        r = await c.get(f"/v1/runs/{run_id}", headers=bearer(READ))
        assert r.status_code == 200
        run = r.json()
        assert (run["status"], run["input"]["text"], run["priority"]) == ("queued", "hello", 7)
        assert "state_json" not in run
        # the API takes bearer tokens only: a signed-in browser's cookie is not one
        assert (await c.post("/login", data={"token": ACT})).status_code == 303
        is_problem(await c.get(f"/v1/runs/{run_id}"), 401)
        is_problem(await c.delete(f"/v1/runs/{run_id}", headers=act), 405)
        is_problem(await c.get("/v1/nothing", headers=act), 404)
    assert await pool.fetchval("SELECT count(*) FROM runs") == 1


async def test_runs_are_listed_by_cursor_and_scoped_to_the_tokens_tenant(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool)
    ours = [await enqueue(pool, f"r{i}") for i in range(3)]
    theirs = await other_tenant_run(pool)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        seen: list[str] = []
        params: dict[str, str] = {"limit": "2", "agent": "agent", "status": "queued"}
        while True:
            page = (await c.get("/v1/runs", params=params)).json()
            seen += [r["id"] for r in page["runs"]]
            if page["next"] is None:
                break
            params["after"] = page["next"]
        assert seen == ours[::-1]  # newest first, each once
        is_problem(await c.get("/v1/runs", params={"status": "bogus"}), 400)
        is_problem(await c.get("/v1/runs", params={"after": "junk"}), 400)
        is_problem(await c.get(f"/v1/runs/{theirs}"), 404)  # another tenant's: no such run
        is_problem(await c.get(f"/v1/runs/{theirs}/events"), 404)
        is_problem(await c.get("/v1/runs/not-a-uuid"), 404)
        other = bearer(OTHER)
        assert (await c.get(f"/v1/runs/{theirs}", headers=other)).status_code == 200
        assert (await c.get("/v1/runs", headers=other)).json()["runs"][0]["id"] == theirs
        is_problem(await c.post(f"/v1/runs/{ours[0]}/cancel", headers=other), 404)
        r = await c.post(f"/v1/runs/{ours[0]}/cancel", headers=bearer(ACT))
        assert r.json() == {"run_id": ours[0], "status": "cancelled"}


async def test_approve_a_waiting_run_over_the_api(pool: asyncpg.Pool, dsn: str) -> None:
    run_id, other = await waiting_runs(pool, dsn, n=2)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(ACT)) as c:
        approve = f"/v1/runs/{run_id}/approve"
        is_problem(await c.post(approve, json={}, headers=bearer(READ)), 403)
        is_problem(await c.post(f"/v1/runs/{other}/answer", json={"text": "yes"}), 409)
        is_problem(await c.post(f"/v1/runs/{other}/reject", json={"reason": " "}), 400)
        r = await c.post(approve, json={"input": {"text": "edited"}})
        assert r.status_code == 200 and r.json()["decision"] == "approve"
        is_problem(await c.post(approve, json={}), 409)  # once
    row = await pool.fetchrow("SELECT decision, decided_by FROM run_decisions")
    assert (row["decision"], row["decided_by"]) == ("approve", "api:alice")
    tool, calls = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="hi")]}, {"text": "all done"})
    await run_until_idle(dsn, turns, tools=[tool])
    assert calls == [{"text": "edited"}]
    run = await details(pool, run_id)
    assert run["status"] == "succeeded"
    # two attempts by two workers (waiting, then resumed): one stream, resumable anywhere
    assert {e["attempt"] for e in run["events"]} >= {1, 2}
    seqs = [str(e["seq"]) for e in run["events"]]
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        whole = await events(c, run_id)
        assert [i for i, _, _ in whole] == [*seqs, None]
        assert any(e == "run_waiting" for _, e, _ in whole)
        assert any(e == "decision" for _, e, _ in whole)
        for k in range(len(seqs)):
            assert await events(c, run_id, last=seqs[k]) == whole[k + 1 :]


async def test_the_stream_of_a_finished_run_resumes_after_any_event(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool)
    run_id = await enqueue(pool, "hi")
    await run_until_idle(dsn, scripted({"text": "hello there"}))
    seqs = [e["seq"] for e in (await details(pool, run_id))["events"]]
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        whole = await events(c, run_id)
        assert [i for i, _, _ in whole] == [str(s) for s in seqs] + [None]
        assert whole[-1][1:] == ("end", {"status": "succeeded"})
        assert any(e == "model_message" for _, e, _ in whole)
        for k in range(len(seqs)):  # a resume continues with the next event: no gap, no repeat
            assert await events(c, run_id, last=str(seqs[k])) == whole[k + 1 :]
        assert await events(c, run_id, last=f"{seqs[1]}.4") == whole[2:]
        is_problem(await c.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "x"}), 400)
        forked = await c.post(
            f"/v1/runs/{run_id}/fork", json={"at_turn": 0, "input": "again"}, headers=bearer(ACT)
        )
        assert forked.status_code == 201 and forked.json()["run_id"] != run_id
        bad = await c.post(f"/v1/runs/{run_id}/fork", json={"at_turn": 9}, headers=bearer(ACT))
        assert "no turn 9" in is_problem(bad, 400)["detail"]
    client = Client(pool)
    same = [(e.id, e.event, e.data) async for e in client.stream(run_id, str(seqs[0]))]
    assert same == whole[1:]


async def test_a_stream_started_during_a_run_ends_with_its_final_status(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool)
    answer = "one two three four five six seven eight nine ten " * 4
    run_id = await enqueue(pool, "count")
    provider = ScriptedProvider([{"text": answer}], chunk_delay_s=0.02)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        reader = asyncio.create_task(events(c, run_id))
        await run_until_idle(dsn, provider)
        got = await reader
    assert got[-1][1:] == ("end", {"status": "succeeded"})
    durable = [int(i) for i, e, _ in got if i is not None and "." not in i]
    assert durable == sorted(set(durable))
    message = next(d for _, e, d in got if e == "model_message")
    assert message["payload"]["message"]["content"][0]["text"] == answer
    for i, e, d in got:  # each delta: after the durable event its id names, text not committed yet
        if e == "text_delta":
            assert i is not None and answer[d["offset"] :].startswith(d["text"])
    ids = [tuple(int(p) for p in i.split(".")) + (0,) * (1 - i.count(".")) for i, _, _ in got if i]
    assert ids == sorted(set(ids))  # every id once, in order


def test_deltas_skip_committed_text_and_restart_with_a_new_attempt() -> None:
    pos = Position(attempt=1)
    first = pos.delta(0, "Hello, ")
    assert first is not None and (first.id, first.data) == ("0.1", {"text": "Hello, ", "offset": 0})
    text = {"type": "text", "text": "Hello, world"}
    message = {"message": {"content": [text]}}
    pos.saw({"seq": 1, "type": "model_message", "attempt": 1, "payload": message})
    assert pos.delta(7, "world") is None  # a late chunk the message already carries
    late = pos.delta(7, "world and more")
    assert late is not None and (late.id, late.data) == ("1.1", {"text": " and more", "offset": 12})
    pos.claim(2)  # another worker took the run over: its text starts at 0 again
    again = pos.delta(0, "Hello")
    assert again is not None and (again.id, again.data) == ("1.2", {"text": "Hello", "offset": 0})
    assert parse_event_id("7.3") == (7, 3) and parse_event_id(None) == (0, 0)


async def test_the_openapi_document_is_served_and_checked_in(dsn: str) -> None:
    async with console(dsn) as url, httpx.AsyncClient(base_url=url) as c:
        served = (await c.get("/v1/openapi.json")).json()
    assert served == document()
    assert json.loads(DOC.read_text(encoding="utf-8")) == served, (
        "docs/http-api.json is stale: python -m hango_worker.console.api_openapi > docs/http-api.json"
    )
    assert set(served["paths"]) >= {"/v1/runs", "/v1/runs/{run_id}/events"}
