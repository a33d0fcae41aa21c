"""The run console over HTTP, on a real uvicorn and the real database: pages, escaping,
authentication, roles, CSRF, tenant scoping, decisions, live text, the runs query plan.
(The same in a real browser: tests/browser/.)"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
from typing import Any

import asyncpg
import httpx2 as httpx
import pytest
from prometheus_client import REGISTRY

from hango_worker.config import ConfigError
from hango_worker.console import server
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.store import repo
from tests.console_helpers import (
    ACT,
    OTHER,
    OTHER_TENANT,
    READ,
    bearer,
    console,
    csrf_of,
    other_tenant_run,
    waiting_runs,
)
from tests.helpers import call, recording_tool, scripted
from tests.test_cli import cli
from tests.worker_helpers import details, enqueue, make_agent, run_until_idle, settings

T = repo.DEFAULT_TENANT_ID


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_runs_page_filters_and_pages_by_key(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, name="alpha")
    await make_agent(pool, name="beta")
    alpha = [await enqueue(pool, f"a{i}", agent="alpha") for i in range(53)]
    beta = await enqueue(pool, "b", agent="beta")
    await pool.execute("UPDATE runs SET status = 'failed' WHERE id = $1", alpha[0])
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        first = await c.get("/runs", params={"agent": "alpha"})
        assert first.status_code == 200
        assert beta not in first.text and alpha[-1] in first.text and alpha[0] not in first.text
        nxt = first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
        second = await c.get(nxt.replace("&amp;", "&"))
        shown = [r for r in alpha if r in second.text]
        assert shown == alpha[:3]  # the 50 newest on page 1, the 3 oldest on page 2
        assert 'rel="next"' not in second.text
        failed = await c.get("/runs", params={"status": "failed"})
        assert alpha[0] in failed.text and alpha[1] not in failed.text
        assert (await c.get("/runs", params={"status": "bogus"})).status_code == 400
        assert (await c.get("/runs", params={"agent": "nobody"})).status_code == 404
        assert (await c.get("/runs", params={"after": "junk"})).status_code == 400


async def test_a_transcript_with_script_and_ansi_renders_inert(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["echo"])
    evil = "<script>alert(1)</script> \x1b[31mred\x1b[0m \x1b]0;title\x07done"
    tool, _ = recording_tool()
    run_id = await enqueue(pool, "<img src=x onerror=alert(2)>")
    turns = scripted({"tool_calls": [call("echo", text=evil)]}, {"text": evil})
    await run_until_idle(dsn, turns, tools=[tool])
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        r = await c.get(f"/runs/{run_id}")
    assert r.status_code == 200
    page = r.text
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(2)&gt;" in page
    assert "\x1b" not in page and "\x07" not in page
    # the model's text: the words stay, the escapes go (arguments show as JSON: \u001b)
    assert '<div class="text">&lt;script&gt;alert(1)&lt;/script&gt; red done</div>' in page
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert "<script" not in page.replace('<script src="/static/console.js" defer></script>', "")


async def _state(pool: asyncpg.Pool, run_id: str) -> tuple[Any, ...]:
    row = await pool.fetchrow(
        "SELECT status, waiting_for::text AS w FROM runs WHERE id = $1", run_id
    )
    n = await pool.fetchval("SELECT count(*) FROM run_decisions WHERE run_id = $1", run_id)
    return row["status"], row["w"], n


async def test_refusals_have_the_right_status_and_change_nothing(
    pool: asyncpg.Pool, dsn: str
) -> None:
    (run_id,) = await waiting_runs(pool, dsn)
    theirs = await other_tenant_run(pool)
    before = await _state(pool, run_id)
    assert before[0] == "waiting"
    async with console(dsn) as url, httpx.AsyncClient(base_url=url) as c:
        act = f"/runs/{run_id}/approve"
        assert (await c.get("/runs")).status_code == 401
        assert (await c.get(f"/runs/{run_id}")).status_code == 401
        assert (await c.post(act, data={})).status_code == 401
        assert (await c.get("/runs", headers=bearer("x" * 40))).status_code == 401
        assert (await c.get("/runs", headers={"Authorization": "Basic abc"})).status_code == 401
        r = await c.post(act, data={}, headers=bearer(READ))
        assert r.status_code == 403 and "read-only" in r.text
        page = (await c.get(f"/runs/{run_id}", headers=bearer(READ))).text
        assert 'name="csrf"' not in page and "Read-only" in page
        # a browser signed in (cookie) and lured to another site that posts the form
        opaque = await c.post("/login", data={"token": ACT}, headers={"Origin": "null"})
        assert opaque.status_code == 403 and "set-cookie" not in opaque.headers
        login = await c.post("/login", data={"token": ACT})
        assert login.status_code == 303 and "samesite=strict" in login.headers["set-cookie"].lower()
        evil = {"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}
        r = await c.post(act, data={"input": ""}, headers=evil)
        assert r.status_code == 403 and "cross-site" in r.text
        r = await c.post(act, data={"input": ""})  # same site, but no CSRF token
        assert r.status_code == 403 and "CSRF" in r.text
        r = await c.post(act, data={"csrf": "0" * 64})
        assert r.status_code == 403
        c.cookies.clear()
        # another tenant's token sees neither the run nor can act on it, and vice versa
        assert (await c.get(f"/runs/{run_id}", headers=bearer(OTHER))).status_code == 404
        assert (await c.post(act, headers=bearer(OTHER))).status_code == 404
        assert (await c.get(f"/runs/{theirs}", headers=bearer(ACT))).status_code == 404
        assert (await c.get(f"/runs/{theirs}/live", headers=bearer(ACT))).status_code == 404
        assert theirs not in (await c.get("/runs", headers=bearer(ACT))).text
        tenant = {"tenant": "00000000-0000-0000-0000-0000000000aa"}
        assert (await c.get("/runs", params=tenant, headers=bearer(ACT))).status_code == 404
        assert (await c.get("/runs/not-a-uuid", headers=bearer(ACT))).status_code == 404
    assert await _state(pool, run_id) == before
    assert metric("hango_console_requests_total", route="/runs/{id}/action", code="403") >= 4


async def test_approve_in_the_console_is_the_cli_decision_and_happens_once(
    pool: asyncpg.Pool, dsn: str
) -> None:
    (run_id,) = await waiting_runs(pool, dsn)
    decided = metric("hango_console_decisions_total", decision="approve")
    async with console(dsn) as url, httpx.AsyncClient(base_url=url) as c:
        await c.post("/login", data={"token": ACT})
        page = (await c.get(f"/runs/{run_id}")).text
        assert "Waiting for approval" in page and "echo" in page
        waiting = (await c.get("/waiting")).text
        assert run_id in waiting
        form = {"csrf": csrf_of(page), "input": '{"text": "edited"}'}
        r = await c.post(f"/runs/{run_id}/approve", data=form)
        assert r.status_code == 303 and r.headers["location"] == f"/runs/{run_id}"
        again = await c.post(f"/runs/{run_id}/approve", data=form)
        assert again.status_code == 409 and "not waiting" in again.text
        bad = await c.post(f"/runs/{run_id}/remove", data=form)
        assert bad.status_code == 404
    row = await pool.fetchrow("SELECT decision, input, decided_by FROM run_decisions")
    assert (row["decision"], row["input"], row["decided_by"]) == (
        "approve",
        {"text": "edited"},
        "console:alice",
    )
    assert metric("hango_console_decisions_total", decision="approve") == decided + 1
    tool, calls = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="hi")]}, {"text": "all done"})
    await run_until_idle(dsn, turns, tools=[tool])
    assert calls == [{"text": "edited"}]
    assert (await details(pool, run_id))["status"] == "succeeded"


async def test_reject_with_a_reason_and_bad_forms(pool: asyncpg.Pool, dsn: str) -> None:
    run_id, other = await waiting_runs(pool, dsn, n=2)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(ACT)) as c:
        # a bearer request needs no CSRF token (a browser never adds the header cross-site)
        assert (await c.post(f"/runs/{run_id}/reject", data={"reason": " "})).status_code == 400
        r = await c.post(f"/runs/{other}/approve", data={"input": "[1]"})
        assert r.status_code == 400 and "JSON object" in r.text
        r = await c.post(f"/runs/{other}/answer", data={"text": "yes"})
        assert r.status_code == 409 and "approval, not an answer" in r.text
        big = await c.post(f"/runs/{other}/reject", content=b"reason=" + b"x" * 300_000)
        assert big.status_code == 413
        assert (await _state(pool, other))[2] == 0  # no decision recorded
        r = await c.post(f"/runs/{run_id}/reject", data={"reason": "not <b>today</b>"})
        assert r.status_code == 303
    tool, calls = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="hi")]}, {"text": "all done"})
    await run_until_idle(dsn, turns, tools=[tool])
    assert calls == []
    run = await details(pool, run_id)
    results = [b for m in run["transcript"] for b in m["content"] if b["type"] == "tool_result"]
    assert results[0]["is_error"] and "not <b>today</b>" in json.dumps(results[0]["content"])
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        page = (await c.get(f"/runs/{run_id}")).text
    assert "not &lt;b&gt;today&lt;/b&gt;" in page


async def test_live_text_streams_each_character_once_and_ends(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool)
    answer = "one two three four five six seven eight nine ten " * 4
    run_id = await enqueue(pool, "count")
    provider = ScriptedProvider([{"text": answer}], chunk_delay_s=0.02)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        page = (await c.get(f"/runs/{run_id}")).text
        assert f'data-src="/runs/{run_id}/live"' in page  # queued: the live pane is there
        worker = asyncio.create_task(run_until_idle(dsn, provider))
        texts: list[str] = []
        ended = None
        async with c.stream("GET", f"/runs/{run_id}/live") as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            event = None
            async for line in s.aiter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "text":
                    texts.append(json.loads(line[6:])["text"])
                elif line.startswith("data: ") and event == "end":
                    ended = json.loads(line[6:])
                    break
        await worker
        done = (await c.get(f"/runs/{run_id}")).text
    assert ended == {"status": "succeeded"}
    shown = "".join(texts)
    assert shown.count(answer.strip()) == 1, shown
    assert "run finished: succeeded" in shown
    assert len(texts) > 2  # it arrived in pieces, while the run ran
    assert 'id="live"' not in done


async def test_a_trusted_proxy_header_authenticates_named_users(
    pool: asyncpg.Pool, dsn: str
) -> None:
    users = {"bob": {"role": "read"}}
    over = {"console_tokens": {}, "console_proxy_header": "X-Forwarded-User"}
    async with (
        console(dsn, console_proxy_users=users, **over) as url,
        httpx.AsyncClient(base_url=url) as c,
    ):
        assert (await c.get("/runs", headers={"X-Forwarded-User": "bob"})).status_code == 200
        assert (await c.get("/runs", headers={"X-Forwarded-User": "eve"})).status_code == 401
        assert (await c.get("/runs")).status_code == 401
        assert (await c.get("/runs", headers=bearer(ACT))).status_code == 401  # no tokens


def test_the_console_is_off_without_credentials_and_on_loopback_by_default(dsn: str) -> None:
    s = settings(dsn)
    assert s.console_host == "127.0.0.1" and s.console_tokens == {}
    with pytest.raises(ConfigError, match="needs credentials"):
        server.check(s)
    with pytest.raises(ConfigError, match="HANGO_CONSOLE_PROXY_USERS"):
        server.check(settings(dsn, console_proxy_header="X-User"))
    with pytest.raises(ConfigError, match="HANGO_CONSOLE_TOKENS"):
        settings(dsn, console_tokens={"short": {"role": "act"}})
    with pytest.raises(ConfigError, match="HANGO_CONSOLE_TOKENS"):
        settings(dsn, console_tokens={"x" * 40: {"role": "admin"}})
    r = cli(dsn, "console", ok=False)
    assert r.returncode == 2 and "needs credentials" in r.stderr and "Traceback" not in r.stderr


async def test_the_runs_page_query_is_on_the_index_with_100000_finished_runs(
    pool: asyncpg.Pool,
) -> None:
    from hango_worker.store.console_queries import RUNS_PAGE

    await make_agent(pool)
    agent_id = await pool.fetchval("SELECT id::text FROM agents")
    await enqueue(pool)
    session = await pool.fetchval("SELECT session_id::text FROM runs")
    await pool.execute(
        "INSERT INTO runs (id, tenant_id, session_id, agent_id, status, input, created_at, "
        "finished_at) SELECT gen_random_uuid(), $1, $2, $3, "
        "(ARRAY['succeeded', 'failed', 'cancelled'])[1 + i % 3], '{}'::jsonb, "
        "now() - i * interval '1 second', now() - i * interval '1 second' "
        "FROM generate_series(1, 100000) AS i",
        T,
        session,
        agent_id,
    )
    await pool.execute("ANALYZE runs")
    last = await pool.fetchrow("SELECT created_at, id::text FROM runs ORDER BY created_at LIMIT 1")
    cases = [
        (None, None, None, None),
        ("failed", None, None, None),
        (None, agent_id, None, None),
        ("succeeded", agent_id, last["created_at"], last["id"]),
    ]
    async with pool.acquire() as conn:
        for generic in (False, True):
            mode = "force_generic_plan" if generic else "auto"
            await conn.execute(f"SET plan_cache_mode = {mode}")
            for status, agent, at, rid in cases:
                raw = await conn.fetchval(
                    "EXPLAIN (FORMAT JSON) " + RUNS_PAGE, T, status, agent, at, rid, 51
                )
                plan = raw if isinstance(raw, list) else json.loads(raw)
                nodes = list(_nodes(plan[0]["Plan"]))
                scans = {(n["Node Type"], n.get("Index Name")) for n in nodes}
                kinds = {n["Node Type"] for n in nodes}
                assert ("Index Scan", "runs_tenant_created_idx") in scans, (mode, status, scans)
                assert not any(n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "runs"
                               for n in nodes), (mode, status, nodes)  # fmt: skip
                assert "Sort" not in kinds, (mode, status, kinds)  # at most an Incremental Sort


def _nodes(plan: dict[str, Any]) -> Any:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def test_answer_a_question_in_the_console(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, name="asker", tools=["ask_user"])
    run_id = await enqueue(pool, "deploy it", agent="asker")
    turns = scripted(
        {"tool_calls": [call("ask_user", question="Which <region>?")]}, {"text": "deploying"}
    )
    await run_until_idle(dsn, turns)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url) as c:
        await c.post("/login", data={"token": ACT})
        page = (await c.get(f"/runs/{run_id}")).text
        assert "Waiting for an answer" in page and "Which &lt;region&gt;?" in page
        assert 'id="approve"' not in page and 'id="answer"' in page
        waiting = (await c.get("/waiting")).text
        assert run_id in waiting and "an answer" in waiting
        r = await c.post(
            f"/runs/{run_id}/answer", data={"csrf": csrf_of(page), "text": "eu-west-1"}
        )
        assert r.status_code == 303
    await run_until_idle(dsn, turns)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded"
    results = [b for m in run["transcript"] for b in m["content"] if b["type"] == "tool_result"]
    assert "eu-west-1" in json.dumps(results[0]["content"])


async def test_a_malformed_run_shows_markers_not_a_server_error(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool)
    run_id = await enqueue(pool, "hi")
    await run_until_idle(dsn, scripted({"text": "hello"}))
    await pool.execute(
        "UPDATE messages SET content = '\"just a string\"'::jsonb WHERE run_id = $1 AND seq = 1",
        run_id,
    )
    await pool.execute(
        "UPDATE runs SET error = '\"boom\"'::jsonb, state_json = '{\"todos\": 3}'::jsonb "
        "WHERE id = $1",
        run_id,
    )
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        r = await c.get(f"/runs/{run_id}")
    assert r.status_code == 200
    assert "[malformed message: str]" in r.text and "error (malformed)" in r.text
    assert "[malformed todos]" in r.text and "hello" in r.text


async def test_sign_in_csrf_and_tenant_choice_are_bound_to_the_credential(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """An unknown token gets no cookie; a CSRF token is good only for the credential
    whose page it came from; the tenant a list shows is one the credential holds."""
    (run_id,) = await waiting_runs(pool, dsn)
    theirs = await other_tenant_run(pool)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url) as c:
        bad = await c.post("/login", data={"token": "x" * 40})
        assert bad.status_code == 401 and "set-cookie" not in bad.headers
        assert "unknown token" in bad.text
        await c.post("/login", data={"token": ACT})
        mine = csrf_of((await c.get(f"/runs/{run_id}")).text)
        c.cookies.clear()
        await c.post("/login", data={"token": OTHER})  # signed in with another token
        r = await c.post(f"/runs/{theirs}/approve", data={"csrf": mine, "input": ""})
        assert r.status_code == 403 and "CSRF" in r.text
        c.cookies.clear()
        await c.post("/login", data={"token": ACT})
        listed = await c.get("/runs", params={"tenant": ""})  # none asked: the first
        assert listed.status_code == 200 and run_id in listed.text
        r = await c.get("/runs", params={"tenant": "junk"})
        assert r.status_code == 400 and "&#x27;junk&#x27; is not a tenant id" in r.text
        r = await c.get("/runs", params={"tenant": OTHER_TENANT})
        assert r.status_code == 404 and "no such tenant for this credential" in r.text
    assert (await _state(pool, run_id))[2] == 0  # no decision recorded


async def test_an_action_from_another_site_is_refused_by_either_header(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Sec-Fetch-Site alone, or Origin alone, is enough to refuse a cross-site action;
    a request the browser says is the user's own (none) from this very origin goes."""
    (run_id,) = await waiting_runs(pool, dsn)
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(ACT)) as c:
        act, form = f"/runs/{run_id}/reject", {"reason": "no"}
        r = await c.post(act, data=form, headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403 and "cross-site request refused" in r.text
        r = await c.post(act, data=form, headers={"Sec-Fetch-Site": "same-site"})
        assert r.status_code == 403  # a sibling host is another site here
        r = await c.post(act, data=form, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "Origin is another site" in r.text
        assert (await _state(pool, run_id))[2] == 0
        own = {"Sec-Fetch-Site": "none", "Origin": url.rstrip("/")}
        assert (await c.post(act, data=form, headers=own)).status_code == 303
    assert (await _state(pool, run_id))[2] == 1


async def test_image_attachments_show_as_thumbnails_of_their_own_bytes(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """An inline image and one stored once by reference (docs/inputs-and-outputs.md): the
    run page links each as a thumbnail; the link serves its exact bytes with its media
    type, to this tenant only; anything else there is a 404."""
    small = b"\x89PNG\r\n\x1a\n" + os.urandom(64)
    large = b"\x89PNG\r\n\x1a\n" + os.urandom(40_000)  # above the store-once threshold
    blocks = [
        {"type": "text", "text": "Look."},
        *({"type": "image", "source": {"type": "base64", "media_type": "image/png",
           "data": base64.b64encode(b).decode()}} for b in (small, large)),
    ]  # fmt: skip
    await make_agent(pool)
    ids = await repo.enqueue_run(
        pool, tenant_id=repo.DEFAULT_TENANT_ID, agent="agent", input_text="", content=blocks
    )
    run_id = ids.run_id
    await run_until_idle(dsn, scripted({"text": "two images"}))
    stored = await pool.fetchval(
        "SELECT content::text FROM messages WHERE run_id = $1 AND seq = 1", run_id
    )
    assert "hango_blob" in stored  # the large one is a reference, its bytes in blobs
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(READ)) as c:
        page = (await c.get(f"/runs/{run_id}")).text
        srcs = re.findall(r'<img src="([^"]+)"', page)
        assert srcs == [f"/runs/{run_id}/images/1/1", f"/runs/{run_id}/images/1/2"]
        for src, want in zip(srcs, (small, large), strict=True):
            r = await c.get(src)
            assert (r.status_code, r.content) == (200, want)
            assert r.headers["content-type"] == "image/png"
            assert r.headers["x-content-type-options"] == "nosniff"
        for bad in ("1/0", "1/9", "1/1.0", "2/0", "1/x"):
            assert (await c.get(f"/runs/{run_id}/images/{bad}")).status_code == 404, bad
    async with console(dsn) as url, httpx.AsyncClient(base_url=url, headers=bearer(OTHER)) as c:
        assert (await c.get(srcs[1])).status_code == 404  # another tenant's: no such run
