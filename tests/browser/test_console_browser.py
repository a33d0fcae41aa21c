"""The run console in a real browser: Debian's Chromium, headless, driven by Playwright
(`make test-browser`; HANGO_CHROMIUM names the binary, no browser is downloaded).

Sign in, open the runs page and a run; watch a run's live text arrive; approve a
waiting run and see it resume and finish; reject another with a reason and see the
reason reach the transcript. HANGO_CONSOLE_SCREENSHOT=PATH saves the waiting run's
page there (docs/console.png is made so).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
from playwright.async_api import Browser, Page, async_playwright

from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.provider.types import Provider
from hango_worker.run.worker import Worker
from hango_worker.service import serve
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool
from tests.console_helpers import ACT, console, waiting_runs
from tests.helpers import call, recording_tool, scripted
from tests.worker_helpers import enqueue, make_agent, run_until_idle, settings

CHROMIUM = os.environ.get("HANGO_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no browser at {CHROMIUM}: install Debian's chromium or set HANGO_CHROMIUM")
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            yield b
        finally:
            await b.close()


async def signed_in(browser: Browser, url: str) -> Page:
    page = await browser.new_page(viewport={"width": 1200, "height": 900})
    response = await page.goto(url + "/runs")
    assert response is not None and response.status == 401  # the login form
    await page.fill("input[name=token]", ACT)
    await page.click("#signin")
    await page.wait_for_selector("table#runs")
    return page


@asynccontextmanager
async def worker(dsn: str, provider: Provider, tools: Sequence[Tool] = ()) -> AsyncIterator[None]:
    """A worker serving in the background until the block ends."""
    ready: list[Worker] = []
    registry = Registry([*Registry.default(load_entry_points=False).view(["current_time"]), *tools])
    task = asyncio.create_task(
        serve(
            settings(dsn),
            dsn,
            provider=provider,
            registry=registry,
            logs=False,
            on_ready=lambda w, _: ready.append(w),
        )
    )
    try:
        async with asyncio.timeout(30):
            while not ready:
                await asyncio.sleep(0.02)
        yield
    finally:
        if ready:
            ready[0].request_shutdown()
        await task


async def test_runs_page_then_a_run_and_its_transcript(
    browser: Browser, pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool, tools=["echo"])
    run_id = await enqueue(pool, "say <b>hello</b>")
    tool, _ = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="ping")]}, {"text": "Hello <script>x"})
    await run_until_idle(dsn, turns, tools=[tool])
    async with console(dsn) as url:
        page = await signed_in(browser, url)
        await page.click(f"a[href='/runs/{run_id}']")
        await page.wait_for_selector("#transcript")
        transcript = await page.inner_text("#transcript")
        assert "say <b>hello</b>" in transcript  # as text, not markup
        assert "echo: ping" in transcript and "Hello <script>x" in transcript
        assert await page.inner_text(".status") == "succeeded"
        assert await page.query_selector("#transcript b") is None


async def test_a_running_runs_live_text_arrives(
    browser: Browser, pool: asyncpg.Pool, dsn: str
) -> None:
    await make_agent(pool)
    words = " ".join(f"word{i}" for i in range(60))
    run_id = await enqueue(pool, "talk")
    provider = ScriptedProvider([{"text": words}], chunk_delay_s=0.05)
    async with console(dsn) as url:
        page = await signed_in(browser, url)
        await page.goto(f"{url}/runs/{run_id}")
        await page.wait_for_selector("#live")
        async with worker(dsn, provider):
            async with asyncio.timeout(30):  # (the page's CSP forbids wait_for_function's eval)
                while "word5 " not in await page.inner_text("#live"):
                    await asyncio.sleep(0.02)
            status = await pool.fetchval("SELECT status FROM runs WHERE id = $1", run_id)
            assert status == "running"  # the text arrived while the model still streamed
            await page.wait_for_selector(".status.succeeded", timeout=30_000)  # reloaded at end
        assert "word59" in await page.inner_text("#transcript")
        assert await page.query_selector("#live") is None


async def test_approve_one_waiting_run_and_reject_another_with_a_reason(
    browser: Browser, pool: asyncpg.Pool, dsn: str
) -> None:
    approved, rejected = await waiting_runs(pool, dsn, n=2)
    tool, calls = recording_tool()
    turns = scripted({"tool_calls": [call("echo", text="hi")]}, {"text": "all done"})
    async with console(dsn) as url, worker(dsn, turns, [tool]):
        page = await signed_in(browser, url)
        await page.click("text=Waiting")
        await page.click(f"a[href='/runs/{approved}']")
        await page.wait_for_selector("#approve")
        shot = os.environ.get("HANGO_CONSOLE_SCREENSHOT")
        if shot:
            await page.screenshot(path=str(Path(shot)), full_page=True)
        await page.click("#approve")
        await page.wait_for_selector(".status.succeeded", timeout=30_000)
        assert "echo: hi" in await page.inner_text("#transcript")
        assert calls == [{"text": "hi"}]

        await page.goto(f"{url}/runs/{rejected}")
        await page.fill("textarea[name=reason]", "not <b>today</b>, ask finance")
        await page.click("#reject")
        await page.wait_for_selector(".status.succeeded", timeout=30_000)
        transcript = await page.inner_text("#transcript")
        assert "not <b>today</b>, ask finance" in transcript
        assert calls == [{"text": "hi"}]  # the rejected call never ran
    rows = await pool.fetch("SELECT decision, decided_by FROM run_decisions ORDER BY decision")
    assert [(r["decision"], r["decided_by"]) for r in rows] == [
        ("approve", "console:alice"),
        ("reject", "console:alice"),
    ]
