"""The compaction ladder (Summarization), end to end: Postgres queue → worker →
AnthropicProvider → the real `anthropic` SDK → FakeAnthropic with a small context
window, plus the ladder's pure parts (the view, the cuts, the estimate).

The fake model is a handler, not a script: compaction changes how many assistant
messages a request holds, so the next move is read from the last tool result instead
("page N" → fetch page N+1), which also makes a retried request get the same answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent import assemble
from hango_worker.agent import compaction as cp
from hango_worker.agent.context import ContextEstimate, context_window, messages_chars
from hango_worker.agent.offload import offloaded
from hango_worker.agent.spec import AgentConfig
from hango_worker.agent.stack import StackConfig, default_stack
from hango_worker.provider.anthropic import AnthropicProvider
from hango_worker.provider.types import Message, TextBlock, ToolResultBlock, ToolUseBlock
from hango_worker.service import serve
from hango_worker.store import repo
from hango_worker.testing import FakeAnthropic
from hango_worker.testing.fake_anthropic import RecordedRequest
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from tests.worker_helpers import details, enqueue, settings

MODEL = "claude-test"
WINDOW = 40_000  # fake tokens (chars / 4): four 30 KB results fill it
PAGE = 30_000  # characters of each tool result
PAGE_RE = re.compile(r"^page (\d+):", re.M)  # also under an offload pointer


# -- the fake model and the tool ----------------------------------------------------------


def is_summary(body: dict[str, Any]) -> bool:
    system = body.get("system") or []
    return any(isinstance(b, dict) and b.get("text") == cp.SUMMARY_SYSTEM for b in system)


class PageModel:
    """Fetches pages 1..pages one per turn, then answers; answers summary requests.
    `faults` maps a request kind ("summary" or "page N") to faults served first."""

    def __init__(self, pages: int, faults: dict[str, list[dict[str, Any]]] | None = None):
        self.pages = pages
        self.faults = faults or {}
        self.summaries = 0

    def __call__(self, rec: RecordedRequest) -> dict[str, Any]:
        body = rec.body
        if is_summary(body):
            if self.faults.get("summary"):
                return self.faults["summary"].pop(0)
            self.summaries += 1
            return {"text": f"Summary {self.summaries}: pages were fetched; keep going."}
        done = last_page(body["messages"])
        if self.faults.get(f"page {done}"):
            return self.faults[f"page {done}"].pop(0)
        if done >= self.pages:
            return {"text": f"Read {done} pages."}
        n = done + 1
        return {
            "tool_calls": [{"id": f"toolu_page_{n:04d}", "name": "fetch_page", "input": {"n": n}}]
        }


def last_page(messages: list[dict[str, Any]]) -> int:
    last = messages[-1]
    for block in last["content"] if isinstance(last["content"], list) else []:
        if block.get("type") == "tool_result":
            m = PAGE_RE.search(str(block.get("content")))
            if m:
                return int(m.group(1))
    return 0


def page_tool() -> Tool:
    async def fn(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        head = f"page {args['n']}: "
        body = "".join(f"line {i:05d} of page {args['n']}. " for i in range(PAGE // 20))
        return ToolResult((head + body)[:PAGE])

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "additionalProperties": False,
    }
    return Tool("fetch_page", "Fetches one page.", schema, fn, idempotent=True)


@pytest.fixture
def fake() -> Iterator[FakeAnthropic]:
    with FakeAnthropic(handler=PageModel(1), context_window=WINDOW) as server:
        yield server


async def make_agent(pool: asyncpg.Pool, system: str = "Fetch pages.", **config: Any) -> None:
    await repo.create_agent(
        pool,
        tenant_id=repo.DEFAULT_TENANT_ID,
        name="agent",
        model=MODEL,
        system=[system],
        tools=["fetch_page"],
        # results stay inline (no offload) unless a test asks: these tests are the ladder's
        config={
            "context_window": WINDOW,
            "max_turns": 1000,
            "offload_threshold_bytes": 1_000_000,
            **config,
        },
    )


async def work(dsn: str, fake: FakeAnthropic, **over: Any) -> None:
    provider = AnthropicProvider(api_key="test", base_url=fake.base_url, max_retries=0)
    registry = Registry([page_tool()])
    try:
        await serve(
            settings(dsn, model_retries=2, **over),
            dsn,
            until_idle=True,
            provider=provider,
            registry=registry,
            logs=False,
        )
    finally:
        await provider.aclose()


def messages_of(fake: FakeAnthropic) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.path == "/v1/messages"]


def without_breakpoints(value: Any) -> Any:
    """`value` with every cache_control removed (PromptCache's request-only markers)."""
    if isinstance(value, list):
        return [without_breakpoints(v) for v in value]
    if isinstance(value, dict):
        return {k: without_breakpoints(v) for k, v in value.items() if k != "cache_control"}
    return value


def turns_of(fake: FakeAnthropic) -> list[RecordedRequest]:
    return [r for r in messages_of(fake) if not is_summary(r.body)]


def compactions(rung: str) -> float:
    return REGISTRY.get_sample_value("hango_compactions_total", {"rung": rung}) or 0.0


def context_sizes() -> tuple[float, float, float]:
    """hango_context_tokens: (count, sum, requests at most 0.8 of the window)."""
    get = REGISTRY.get_sample_value
    under = get("hango_context_tokens_bucket", {"le": "0.8"}) or 0.0
    return (get("hango_context_tokens_count") or 0.0, get("hango_context_tokens_sum") or 0.0, under)


def rungs_seen(spans: Any) -> list[str]:
    reasons = [
        e.attributes.get("hango.middleware.reason", "")
        for e in spans.events("middleware.request_rewritten")
        if e.attributes.get("hango.middleware.name") == "summarization"
    ]
    return [r.removeprefix("compaction:") for r in reasons]


async def stored(pool: asyncpg.Pool, run_id: str) -> list[dict[str, Any]]:
    return list((await details(pool, run_id))["transcript"])


def without_summarization(cfg: StackConfig) -> list[Any]:
    stack = default_stack(cfg)
    assert stack[3] is not None and stack[3].name == "summarization"
    stack[3] = None
    return stack


def without_both(cfg: StackConfig) -> list[Any]:
    """The stack without the two middlewares that keep a long run in its window."""
    stack = without_summarization(cfg)
    assert stack[1] is not None and stack[1].name == "filesystem"
    stack[1] = None
    return stack


# -- end to end ---------------------------------------------------------------------------

LONG_RUN = 300


async def test_a_long_run_fails_without_the_ladder_and_finishes_with_it(
    pool: asyncpg.Pool,
    dsn: str,
    fake: FakeAnthropic,
    spans: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the default stack as a deployment has it: big results offloaded, then the ladder
    await make_agent(pool, keep_tool_results=2, offload_threshold_bytes=20_000)
    fake.handler = PageModel(LONG_RUN)
    with monkeypatch.context() as mp:
        mp.setattr(assemble, "default_stack", without_both)  # the one assembly
        bare = await enqueue(pool)
        await work(dsn, fake)
    run = await details(pool, bare)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "invalid_request_error"
    assert re.search(r"prompt is too long: \d+ tokens > 40000 maximum", run["error"]["message"])
    assert len(turns_of(fake)) < 10

    fake.clear()
    spans.exporter.clear()
    before = {r: compactions(r) for r in cp.RUNGS}
    run_id = await enqueue(pool)
    await work(dsn, fake)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    sent = messages_of(fake)
    assert len(sent) == LONG_RUN + 1  # no summary call: rungs (a) and (b) were enough
    assert all(r.input_tokens is not None and r.input_tokens <= WINDOW for r in sent)
    assert max(r.input_tokens or 0 for r in sent) > 0.7 * WINDOW  # the window was reached
    # the fake validates tool_use/tool_result pairing: any bad request would have failed
    # the run; every message is still in Postgres, each result whole
    msgs = await stored(pool, run_id)
    assert len(msgs) == 1 + 2 * LONG_RUN + 1
    results = [b for m in msgs for b in m["content"] if b["type"] == "tool_result"]
    assert len(results) == LONG_RUN
    # each 30 KB result is kept whole once, as a run file; the message holds its pointer
    files = dict(await pool.fetch("SELECT path, size FROM run_files WHERE run_id = $1", run_id))
    pointers = [offloaded(b["content"]) for b in results]
    assert all(p is not None and files[p[0]] == p[1] == PAGE for p in pointers)
    assert len(files) == LONG_RUN
    seen = rungs_seen(spans)
    # offloaded results leave short heads: clearing old ones is enough, nothing is paid
    assert "clear_tool_results" in seen and "summary" not in seen
    assert compactions("clear_tool_results") - before["clear_tool_results"] == seen.count(
        "clear_tool_results"
    )
    assert compactions("sliding_window") - before["sliding_window"] == seen.count("sliding_window")
    assert compactions("summary") == before["summary"]
    ordered = [
        r for r in spans.events("middleware.request_rewritten") if "compaction" in str(r.attributes)
    ]
    for e in ordered:
        assert (
            e.attributes["hango.context.tokens_after"] < e.attributes["hango.context.tokens_before"]
        )


async def test_the_ladder_stops_at_the_first_rung_that_suffices(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, spans: Any
) -> None:
    """Clearing old results is enough for a short run: no turn dropped, no summary paid."""
    await make_agent(pool, keep_tool_results=2)
    fake.handler = PageModel(8)
    before = {r: compactions(r) for r in cp.RUNGS}
    sizes_before = context_sizes()
    run_id = await enqueue(pool)
    await work(dsn, fake)
    assert (await details(pool, run_id))["status"] == "succeeded"
    sent = messages_of(fake)
    assert len(sent) == 9 and not any(is_summary(r.body) for r in sent)
    seen = rungs_seen(spans)
    assert seen and set(seen) == {"clear_tool_results"}
    assert compactions("clear_tool_results") - before["clear_tool_results"] == len(seen)
    assert compactions("sliding_window") == before["sliding_window"]
    assert compactions("summary") == before["summary"]
    # hango_context_tokens: each request's reported size / the window, all of them < 0.8
    count, total, under = (a - b for a, b in zip(context_sizes(), sizes_before, strict=True))
    assert count == under == 9
    assert total == pytest.approx(sum(r.input_tokens or 0 for r in sent) / WINDOW)
    # every request keeps the first message and all turns; only old results became notes
    last = sent[-1].body["messages"]
    assert len(last) == 1 + 2 * 8
    notes = [
        b["content"]
        for m in last
        for b in m["content"]
        if b.get("type") == "tool_result" and b["content"].startswith("[tool result cleared")
    ]
    assert notes and all("fetch_page" in n and f"{PAGE} characters" in n for n in notes)
    assert len(notes) <= 8 - 2


async def test_a_summary_is_paid_once_and_a_resume_sees_the_same_bytes(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, spans: Any
) -> None:
    """Five kept results cannot fit the target: rung (c) summarises. The run then fails
    (a 400 on its next turn); resumed, it re-derives the compacted view from its private
    state: the same bytes, and no second summary."""
    await make_agent(pool)  # keep_tool_results 5 (default)
    model = PageModel(6, {"page 6": [{"fault": "400", "message": "injected"}]})
    fake.handler = model
    run_id = await enqueue(pool)
    await work(dsn, fake)
    run = await details(pool, run_id)
    assert run["status"] == "failed" and run["error"]["message"] == "injected"
    sent = messages_of(fake)
    summaries = [r for r in sent if is_summary(r.body)]
    assert len(summaries) == 1 and model.summaries == 1
    assert "page 1:" in summaries[0].body["messages"][0]["content"][0]["text"]
    private = run["state_json"]["private"]["summarization"]
    assert private["summary_calls"] == 1 and private["summary"].startswith("Summary 1")
    # the summary's tokens are the run's: attempt 1's usage is every answered request's
    answered = [r for r in sent if r is not sent[-1]]
    u = run["usage"]  # input tokens with the prompt cache's reads and writes
    total = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
    assert total == sum(r.input_tokens or 0 for r in answered)
    assert "summary" in rungs_seen(spans)
    assert (
        len([s for s in spans.named("chat ") if s.attributes.get("gen_ai.usage.input_tokens")]) == 7
    )
    before_resume = turns_of(fake)
    compacted, failed = before_resume[-2], before_resume[-1]
    head = failed.body["messages"][0]["content"]
    assert head[-1]["text"].startswith("[Context compaction") and "Summary 1" in head[-1]["text"]

    fake.clear()
    await repo.resume(pool, repo.DEFAULT_TENANT_ID, run_id)
    await work(dsn, fake)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    after = messages_of(fake)
    assert not any(is_summary(r.body) for r in after) and model.summaries == 1
    first = after[0].body["messages"]
    assert json.dumps(first) == json.dumps(failed.body["messages"])
    # the compacted prefix is byte-identical; only the newest message's cache
    # breakpoint (PromptCache moves it forward every turn) differs
    prefix = compacted.body["messages"]
    assert json.dumps(without_breakpoints(first[: len(prefix)])) == json.dumps(
        without_breakpoints(prefix)
    )
    assert json.dumps(first[: len(prefix) - 1]) == json.dumps(prefix[:-1])
    assert len(await stored(pool, run_id)) == 1 + 2 * 6 + 1
    assert run["state_json"]["private"]["summarization"]["summary_calls"] == 1


async def test_a_failing_summariser_is_retried_and_never_loses_history(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic, spans: Any
) -> None:
    await make_agent(pool)
    overloaded = {"fault": "529"}
    fake.handler = PageModel(6, {"summary": [overloaded]})
    retried = await enqueue(pool)
    await work(dsn, fake)
    assert (await details(pool, retried))["status"] == "succeeded"
    assert len([r for r in messages_of(fake) if is_summary(r.body)]) == 2  # fault + retry
    retries = spans.events("model.retried")
    assert retries and retries[0].attributes["error.type"] == "overloaded_error"

    fake.clear()
    refused = {"fault": "400", "message": "summariser refused"}
    fake.handler = PageModel(6, {"summary": [refused] * 5})
    failed = await enqueue(pool)
    await work(dsn, fake)
    run = await details(pool, failed)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "invalid_request_error"
    assert run["error"]["message"] == "summariser refused"
    assert len(await stored(pool, failed)) == 1 + 2 * 5  # every turn up to the compaction
    assert "summarization" not in run["state_json"]["private"] or (
        run["state_json"]["private"]["summarization"]["summary_calls"] == 0
    )


async def test_a_window_smaller_than_the_prompt_fails_clearly(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic
) -> None:
    await make_agent(pool, system="You fetch pages. " * 500, context_window=1024)
    run_id = await enqueue(pool, text="read everything")
    await work(dsn, fake)
    run = await details(pool, run_id)
    assert run["status"] == "failed"
    assert run["error"]["type"] == "context_window_too_small"
    assert "the agent's context_window (1024 tokens)" in run["error"]["message"]
    assert "system prompt, tools and first message" in run["error"]["message"]
    assert messages_of(fake) == []  # refused before any call, not retried, not looping
    msgs = await stored(pool, run_id)
    assert [m["content"][0]["text"] for m in msgs] == ["read everything"]


def test_compaction_settings_are_validated() -> None:
    assert AgentConfig.model_validate({"compact_trigger": 0.9, "compact_target": 0.6})
    for bad, word in [
        ({"compact_target": 0.85}, "compact_target (0.85) must be below compact_trigger (0.8)"),
        ({"compact_trigger": 0.4}, "must be below compact_trigger (0.4)"),
        ({"compact_trigger": 1.5}, "compact_trigger"),
        ({"context_window": 100}, "context_window"),
        ({"keep_tool_results": 0}, "keep_tool_results"),
        ({"summary_model": ""}, "summary_model"),
        ({"compact_after": 0.5}, "compact_after"),
    ]:
        with pytest.raises(ValueError, match=re.escape(word)):
            AgentConfig.model_validate(bad)
    cfg = AgentConfig.model_validate({"summary_model": "claude-haiku-4-5"}).compaction()
    assert cfg == cp.CompactionConfig(summary_model="claude-haiku-4-5")
    assert context_window("claude-sonnet-4-5-20250929") == 200_000
    assert context_window("claude-sonnet-4-5", 1_000_000) == 1_000_000


# -- the pure parts -----------------------------------------------------------------------


def conversation(turns: int, size: int = 100) -> list[Message]:
    msgs = [Message("user", [TextBlock("start")])]
    for i in range(turns):
        uses = [ToolUseBlock(f"t{i}_{j}", "fetch_page", {"n": i}) for j in range(1 + i % 2)]
        msgs.append(Message("assistant", [TextBlock(f"turn {i}"), *uses]))
        msgs.append(Message("user", [ToolResultBlock(u.id, "r" * size) for u in uses]))
    msgs.append(Message("assistant", [TextBlock("done")]))
    msgs.append(Message("user", [TextBlock("a second question")]))
    return msgs


def paired(view: list[Message]) -> bool:
    for i, m in enumerate(view):
        results = {b.tool_use_id for b in m.content if isinstance(b, ToolResultBlock)}
        before = {u.id for u in view[i - 1].tool_uses()} if i else set()
        after = view[i + 1] if i + 1 < len(view) else None
        answered = (
            {b.tool_use_id for b in after.content if isinstance(b, ToolResultBlock)}
            if after
            else set()
        )
        if not results <= before or not {u.id for u in m.tool_uses()} <= answered:
            return False
    return True


def test_every_cut_keeps_pairs_and_the_first_message() -> None:
    msgs = conversation(12)
    for hi in range(1, len(msgs)):
        for excess in (0, 10, 100, 10_000):
            st = cp.CompactionState()
            cut = cp.plan_cut(msgs, st, min(hi, cp.last_cut(msgs)), excess)
            st.dropped_upto = cut
            st.clear_before = cut
            v = cp.view(msgs, st)
            assert v[0].content[0] == msgs[0].content[0] and paired(v), (hi, excess, cut)
            assert v[-1] is msgs[-1] and v[-2] is msgs[-2]  # the newest turn stays


def test_the_view_is_a_function_of_history_and_state() -> None:
    msgs = conversation(10, size=500)
    st = cp.CompactionState(dropped_upto=5, clear_before=9, summary="s", summary_upto=5)
    v = cp.view(msgs, st)
    longer = cp.view([*msgs, Message("assistant", [TextBlock("more")])], st)
    again = cp.view(msgs, cp.CompactionState.model_validate(json.loads(st.model_dump_json())))
    dump = [m.to_dict() for m in v]
    assert [m.to_dict() for m in again] == dump  # re-derived after a JSON round trip
    assert [m.to_dict() for m in longer[: len(v)]] == dump  # appending keeps the prefix
    notes = [b.content for m in v for b in m.content if isinstance(b, ToolResultBlock)]
    assert sum(n.startswith("[tool result cleared") for n in notes) == 3  # messages 6, 8


def test_an_offloaded_result_is_cleared_to_its_read_file_path() -> None:
    from hango_worker.agent.offload import offload_path, pointer_text

    path = offload_path("t0_0")
    m = Message("user", [ToolResultBlock("t0_0", pointer_text(path, 5_000_000, "head " * 100))])
    prev = Message("assistant", [ToolUseBlock("t0_0", "fetch_page", {})])
    note = cp.cleared(m, prev).content[0]
    assert isinstance(note, ToolResultBlock)
    assert note.content == (
        f"[tool result cleared from the context: fetch_page, 5000000 bytes, stored at {path}; "
        "read it with read_file]"
    )


def test_the_estimate_reads_only_what_was_added() -> None:
    """Last reported tokens + new characters / learned ratio: old messages are not read
    (a history whose old part is replaced gives the same estimate)."""
    msgs = conversation(4, size=1000)
    est = ContextEstimate()
    tokens, added = est.next_tokens(msgs, lambda: 40_000)
    assert (tokens, added) == (round(40_000 / 3.5 + 0.5), None)
    est.observe(len(msgs), 10_000, None)
    new = [Message("assistant", [TextBlock("x" * 3000)])]
    tokens, added = est.next_tokens([*msgs, *new], lambda: 0)
    assert added == messages_chars(new) and tokens == 10_000 + est.tokens(added)
    other = [Message("user", [TextBlock("y" * 10**6)])] * len(msgs)
    assert est.next_tokens([*other, *new], lambda: 0) == (tokens, added)
    est.observe(len(msgs) + 1, 10_000 + 754, added)  # the fake's 4 chars per token
    assert est.chars_per_token == pytest.approx(messages_chars(new) / 754)


async def test_a_cancel_during_the_summary_call_ends_the_run_cleanly(
    pool: asyncpg.Pool, dsn: str, fake: FakeAnthropic
) -> None:
    """The summary call is the run's model call: a cancel interrupts it, the run ends
    `cancelled` with every message kept and no summary recorded; a resume pays for it."""
    await make_agent(pool)
    pages = PageModel(6)
    release = threading.Event()
    summary_started = threading.Event()

    async def handler(rec: RecordedRequest) -> dict[str, Any]:
        if is_summary(rec.body) and not release.is_set():
            summary_started.set()
            while not release.is_set():  # held until the test has seen the cancel
                await asyncio.sleep(0.01)
            return {"text": "too late: the client is gone"}
        return pages(rec)

    fake.handler = handler
    run_id = await enqueue(pool)
    worker = asyncio.create_task(work(dsn, fake))
    try:
        assert await asyncio.to_thread(summary_started.wait, 60)
        assert await repo.request_cancel(pool, repo.DEFAULT_TENANT_ID, run_id) == "running"
        await asyncio.wait_for(worker, 60)
    finally:
        release.set()
    run = await details(pool, run_id)
    assert run["status"] == "cancelled"
    assert len(await stored(pool, run_id)) == 1 + 2 * 5
    private = run["state_json"]["private"].get("summarization", {})
    assert private.get("summary") is None and private.get("summary_calls", 0) == 0
    assert pages.summaries == 0

    await repo.resume(pool, repo.DEFAULT_TENANT_ID, run_id)
    await work(dsn, fake)
    run = await details(pool, run_id)
    assert run["status"] == "succeeded", run["error"]
    assert run["state_json"]["private"]["summarization"]["summary_calls"] == 1
    assert pages.summaries == 1
