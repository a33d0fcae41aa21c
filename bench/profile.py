"""Where a long run's turn goes, and the measured effect of the fix it points to.

1. pyinstrument over one hango per-turn run (when pyinstrument is installed):
   self time per function, hango_worker frames and overall.
2. Before/after: the same run with RepeatCall as it is, and with a bounded
   RepeatCall (the proposed fix, applied here as a bench-only substitute, the
   product code untouched), alternating; and the chain's per-tool-call cost at
   a 1,000-message history with each.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any

import asyncpg
from pydantic import BaseModel, Field

from bench import chain, per_turn
from bench.common import Sizes, create_database, drop_database, have, summarize
from hango_worker.agent import mw_repeat
from hango_worker.agent.chain import Chain
from hango_worker.agent.middleware import (
    ModelWrapper,
    PromptContributor,
    RunHook,
    ToolCallRequest,
    ToolHandler,
    ToolProvider,
    ToolWrapper,
)
from hango_worker.agent.state import load_private, store_private
from hango_worker.config import load_settings
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.run import execute
from hango_worker.service import serve
from hango_worker.store import db, repo
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.tool.registry import Registry
from hango_worker.tool.types import ToolResult

WINDOW = 64


class RecentCalls(BaseModel):
    """Counts of the last WINDOW distinct calls, oldest first (a list: jsonb keeps no order)."""

    recent: list[tuple[str, int]] = Field(default_factory=list)


class BoundedRepeatCall(mw_repeat.RepeatCall):
    """RepeatCall whose state is bounded: the Nth identical call among the last 64."""

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        st, _ = load_private(req.state, self.name, RecentCalls)
        key = mw_repeat.call_key(req.call.name, req.call.input)
        prior = 0
        for i, (k, c) in enumerate(st.recent):
            if k == key:
                prior = c
                del st.recent[i]
                break
        next_count = prior + 1
        st.recent = [*st.recent[-(WINDOW - 1) :], (key, next_count)]
        store_private(req.state, self.name, st)
        if next_count >= self.threshold:
            middleware_event("middleware.repeat_call_blocked", self.name, "identical call")
            return ToolResult.error(
                f"this exact call was already made {prior} times; "
                "use the previous result or change approach"
            )
        return await next(req)


class CachedCapabilityChain(Chain):
    """Chain whose capability discovery (isinstance on runtime_checkable protocols,
    slow: typing walks the protocol's attributes every time) is done once per class."""

    _caps: dict[type, tuple[bool, ...]] = {}

    def __init__(self, middlewares: Sequence[Any]) -> None:
        mws = [m for m in middlewares if m is not None]
        seen: set[str] = set()
        for m in mws:
            if m.name in seen:
                raise ValueError(f"middleware {m.name!r} appears twice in the stack")
            seen.add(m.name)
        self.middlewares = mws
        self.names = [m.name for m in mws]
        caps = [self._capabilities(m) for m in mws]
        pick = [[m for m, c in zip(mws, caps, strict=True) if c[i]] for i in range(5)]
        self.model_wrappers, self.tool_wrappers, self.run_hooks = pick[0], pick[1], pick[2]
        self.tool_providers, self.contributors = pick[3], pick[4]
        self._model = None
        self._tool = None

    @classmethod
    def _capabilities(cls, m: Any) -> tuple[bool, ...]:
        found = cls._caps.get(type(m))
        if found is None:
            protocols = (ModelWrapper, ToolWrapper, RunHook, ToolProvider, PromptContributor)
            found = cls._caps[type(m)] = tuple(isinstance(m, p) for p in protocols)
        return found


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query: the hot path keeps no session state
    (no SET, LISTEN, advisory lock or cursor on pool connections); an open transaction
    is still rolled back by asyncpg before this is called."""


@contextlib.contextmanager
def all_fixes() -> Iterator[None]:
    """Bounded RepeatCall + cached chain capabilities + pool release without reset query."""
    original_pool = db.create_pool

    async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> Any:
        return await asyncpg.create_pool(
            db._asyncpg_dsn(dsn),
            min_size=min_size,
            max_size=max_size,
            init=db._init,
            statement_cache_size=256,
            reset=_no_reset,
        )

    original_chain = execute.Chain
    db.create_pool = create_pool  # type: ignore[assignment]
    execute.Chain = CachedCapabilityChain  # type: ignore[misc]
    try:
        with bounded_repeat_call():
            yield
    finally:
        db.create_pool = original_pool
        execute.Chain = original_chain  # type: ignore[misc]


@contextlib.contextmanager
def bounded_repeat_call() -> Iterator[None]:
    """Swap RepeatCall for BoundedRepeatCall in every stack built meanwhile."""
    original = execute.default_stack

    def patched(cfg: Any) -> list[Any]:
        return [
            BoundedRepeatCall(m.threshold) if isinstance(m, mw_repeat.RepeatCall) else m
            for m in original(cfg)
        ]

    execute.default_stack = patched  # type: ignore[assignment]
    chain_default = chain.default_stack
    chain.default_stack = patched  # type: ignore[assignment]
    try:
        yield
    finally:
        execute.default_stack = original
        chain.default_stack = chain_default


async def pyinstrument_profile(dsn: str, turns: int) -> dict[str, Any]:
    """One long run (the per-turn benchmark's hango side) under pyinstrument."""
    return await _profiled(per_turn.hango_run(dsn, turns))


async def enqueue_one_turn_runs(dsn: str, runs: int) -> None:
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    try:
        name = f"bench-{time.monotonic_ns()}"
        await repo.create_agent(
            pool,
            tenant_id=repo.DEFAULT_TENANT_ID,
            name=name,
            model="scripted",
            system=[],
            tools=[],
            config={},
        )
        for _ in range(runs):
            await repo.enqueue(pool, tenant_id=repo.DEFAULT_TENANT_ID, agent=name, input_text="go")
    finally:
        await pool.close()


def drain(dsn: str) -> Awaitable[Any]:
    """serve() until the queue is empty: defaults, scripted model answering at once."""
    settings = load_settings(database_url=dsn, metrics_port=0, log_level="WARNING")
    return serve(
        settings,
        dsn,
        until_idle=True,
        provider=ScriptedProvider([{"text": "Done."}]),
        registry=Registry([]),
        logs=False,
    )


async def drain_runs(dsn: str, runs: int) -> dict[str, float]:
    """`runs` one-turn runs drained in process: runs/s and worker CPU per run."""
    await enqueue_one_turn_runs(dsn, runs)
    t, cpu = time.perf_counter(), time.process_time()
    await drain(dsn)
    return {
        "per_s": runs / (time.perf_counter() - t),
        "cpu_ms_per_run": (time.process_time() - cpu) * 1000 / runs,
    }


async def pyinstrument_runs(dsn: str, runs: int) -> dict[str, Any]:
    """`runs` one-turn runs drained by serve() in process (the throughput path)."""
    await enqueue_one_turn_runs(dsn, runs)
    return await _profiled(drain(dsn))


async def _profiled(work: Awaitable[Any]) -> dict[str, Any]:
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    await work
    profiler.stop()
    session = profiler.last_session
    assert session is not None
    selfs: dict[str, float] = {}
    _walk(session.root_frame(), selfs)
    total = sum(selfs.values()) or 1.0
    rows = sorted(selfs.items(), key=lambda kv: -kv[1])
    ours = [(k, v) for k, v in rows if "hango_worker/" in k]
    busy = sum(v for k, v in rows if not k.startswith(("epoll.poll", "select")))
    return {
        "sampled_s": total,
        "busy_s": busy,
        "top": [{"function": k, "self_pct": 100 * v / total} for k, v in rows[:15]],
        "top_hango": [{"function": k, "self_pct": 100 * v / total} for k, v in ours[:12]],
    }


def _walk(frame: Any, acc: dict[str, float]) -> None:
    if frame is None:
        return
    path = frame.file_path_short or frame.file_path or ""
    if not frame.is_synthetic:
        key = f"{frame.function} ({path}:{frame.line_no})"
        acc[key] = acc.get(key, 0.0) + frame.total_self_time
    for child in frame.children:
        _walk(child, acc)


VARIANTS = {
    "before": contextlib.nullcontext,
    "bounded_repeat": bounded_repeat_call,
    "all_fixes": all_fixes,
}


async def before_after(admin: str, sizes: Sizes) -> dict[str, Any]:
    """Each variant in turn (order rotating per repetition): per-turn run, 1-turn runs
    drained in process, chain tool-call cost at 1,000 messages."""
    names = list(VARIANTS)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    drains: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    tool_us: dict[str, list[float]] = {k: [] for k in names}
    calls = max(5, sizes.chain_calls // 2)
    dsn = await create_database(admin, "prof_ba", migrated=True)
    try:
        for rep in range(max(1, sizes.reps)):
            for which in names[rep % 3 :] + names[: rep % 3]:
                with VARIANTS[which]():
                    runs[which].append(await per_turn.hango_run(dsn, sizes.turns))
                    drains[which].append(await drain_runs(dsn, max(5, sizes.jobs // 3)))
                    base = await chain.history_state("default", 1000)
                    m = await chain.measure("default", False, base, calls)
                    tool_us[which].append(m["tool_call_us"])
    finally:
        await drop_database(admin, dsn)
    out = {k: per_turn.aggregate(v, sizes.turns) for k, v in runs.items()}
    for k in out:
        out[k].pop("series_ms", None)
        out[k]["chain_tool_call_us_h1000"] = summarize(tool_us[k])
        out[k]["runs_per_s_in_process"] = summarize([d["per_s"] for d in drains[k]])
        out[k]["cpu_ms_per_run"] = summarize([d["cpu_ms_per_run"] for d in drains[k]])
    return out


async def profile_all(admin: str, sizes: Sizes) -> dict[str, Any]:
    out: dict[str, Any] = {
        "window": WINDOW,
        "repeat_max_tracked": getattr(mw_repeat, "MAX_TRACKED", None),
    }
    if have("pyinstrument"):
        dsn = await create_database(admin, "prof", migrated=True)
        try:
            out["pyinstrument"] = await pyinstrument_profile(dsn, sizes.turns)
            out["pyinstrument_runs"] = await pyinstrument_runs(dsn, max(5, sizes.jobs // 3))
        finally:
            await drop_database(admin, dsn)
    out["before_after"] = await before_after(admin, sizes)
    return out
