"""Where a turn goes now, and the profile-driven fixes before and after.

1. pyinstrument over one hango per-turn run and over one-turn runs drained by
   serve() in process (when pyinstrument is installed): the current code.
2. Before/after. *Before* is what `make bench` recorded on the code before the
   fixes (commit BEFORE_COMMIT, results kept in BEFORE_FILE): it is read from
   that file and copied into these results, never re-measured or typed. *After*
   is the same measurements on the code as it is now: a per-turn run, one-turn
   runs drained in process, the chain's tool-call cost at 1,000 messages.
3. What the product ships is detected, not assumed (`shipped()`). A fix the
   product does not have yet is still measured, as a bench-only substitute and
   labelled so: today only the pool release without asyncpg's reset query,
   when `db.create_pool` does not pass `reset=` itself.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg

from bench import chain, per_turn
from bench.common import Sizes, create_database, drop_database, have, log, summarize
from hango_worker import service
from hango_worker.agent import chain as product_chain
from hango_worker.agent.middlewares import repeat as mw_repeat
from hango_worker.config import load_settings
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.service import serve
from hango_worker.store import db, repo
from hango_worker.tool.registry import Registry

RESULTS = Path(__file__).resolve().parent / "results"
BEFORE_COMMIT = "e025d28"
BEFORE_FILE = RESULTS / "2026-11-30-before-fixes.json"
MEMORY_RUNS = 200  # the memory benchmark's runs in flight (pool size reported for it)


# -- what the product ships ------------------------------------------------------------------


class _AsyncpgProxy:
    """`asyncpg` as seen by hango_worker.store.db. `adjust` sees (and may change) the
    kwargs `db.create_pool` passes; it returns what to hand back instead of a real pool,
    or None to create the pool with the adjusted kwargs."""

    def __init__(self, adjust: Callable[[dict[str, Any]], Any]) -> None:
        self._adjust = adjust

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncpg, name)

    def create_pool(self, *args: Any, **kwargs: Any) -> Any:
        instead = self._adjust(kwargs)
        return instead if instead is not None else asyncpg.create_pool(*args, **kwargs)


@contextlib.contextmanager
def _db_asyncpg(adjust: Callable[[dict[str, Any]], Any]) -> Iterator[None]:
    original = db.asyncpg
    db.asyncpg = _AsyncpgProxy(adjust)  # type: ignore[assignment]
    try:
        yield
    finally:
        db.asyncpg = original


async def pool_kwargs() -> dict[str, Any]:
    """The keyword arguments `db.create_pool` passes to asyncpg (no connection made)."""
    seen: dict[str, Any] = {}

    async def no_pool() -> None:
        return None

    def record(kwargs: dict[str, Any]) -> Any:
        seen.update(kwargs)
        return no_pool()

    with _db_asyncpg(record):
        await db.create_pool("postgresql://probe@localhost/probe")
    return seen


async def shipped() -> dict[str, Any]:
    """Which of the profile-driven fixes the code under test has."""
    fields = getattr(mw_repeat.RepeatState, "model_fields", {})
    pool_size = getattr(service, "pool_size", None)
    return {
        "repeat_max_tracked": getattr(mw_repeat, "MAX_TRACKED", None),
        "repeat_state_ordered_list": "recent" in fields,
        "capabilities_cached": hasattr(product_chain, "capabilities"),
        "pool_reset_skipped": (await pool_kwargs()).get("reset") is not None,
        "pool_size_for": {"runs": MEMORY_RUNS, "max_size": pool_size(MEMORY_RUNS)}
        if pool_size
        else None,
    }


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query: the hot path keeps no session state
    (no SET, LISTEN, advisory lock or cursor on pool connections); an open transaction
    is still rolled back by asyncpg before this is called."""


@contextlib.contextmanager
def no_pool_reset() -> Iterator[None]:
    """Bench-only substitute: every pool `db.create_pool` makes meanwhile skips the reset."""

    def add_reset(kwargs: dict[str, Any]) -> None:
        kwargs["reset"] = _no_reset

    with _db_asyncpg(add_reset):
        yield


# -- pyinstrument ----------------------------------------------------------------------------


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


# -- before (recorded) and after (measured here) ---------------------------------------------


def recorded_before(path: Path = BEFORE_FILE) -> dict[str, Any] | None:
    """The numbers `make bench` recorded on BEFORE_COMMIT, as the report needs them."""
    if not path.exists():
        return None
    old = json.loads(path.read_text())
    commit = old["versions"].get("git")
    if commit != BEFORE_COMMIT:
        raise SystemExit(f"{path.name} was recorded on {commit}, expected {BEFORE_COMMIT}")
    ba = old["profile"]["before_after"]
    hango = dict(old["per_turn"]["variants"]["hango"])
    hango.pop("series_ms", None)
    return {
        "commit": commit,
        "date": old["date"],
        "source": str(path.relative_to(RESULTS.parent.parent)),
        "sizes": old["sizes"],
        "profile": ba["before"],
        # the same run's bench-only substitutes of the fixes: what they predicted
        "substitutes": ba.get("all_fixes"),
        "per_turn_hango": hango,
        "throughput": {n: res["hango"] for n, res in old["throughput"]["by_procs"].items()},
        "latency": old["latency"]["hango"],
        "chain_per_middleware": old["chain"]["per_middleware"],
        "memory": old["memory"],
        "max_connections": old["postgres"].get("max_connections"),
    }


def variants(ships: dict[str, Any]) -> dict[str, Callable[[], contextlib.AbstractContextManager]]:
    """The code as it is, plus each fix it does not ship yet as a substitute."""
    out: dict[str, Callable[[], contextlib.AbstractContextManager[Any]]] = {
        "after": contextlib.nullcontext
    }
    if not ships["pool_reset_skipped"]:
        out["after+no_pool_reset"] = no_pool_reset
    return out


async def after(
    admin: str, sizes: Sizes, ships: dict[str, Any], commit: str = ""
) -> dict[str, Any]:
    """Each variant in turn (order rotating per repetition): per-turn run, 1-turn runs
    drained in process, chain tool-call cost at 1,000 messages."""
    found = variants(ships)
    names = list(found)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    drains: dict[str, list[dict[str, float]]] = {k: [] for k in names}
    tool_us: dict[str, list[float]] = {k: [] for k in names}
    calls = max(5, sizes.chain_calls // 2)
    dsn = await create_database(admin, "prof_ba", migrated=True)
    try:
        for rep in range(max(1, sizes.reps)):
            k = rep % len(names)
            for which in names[k:] + names[:k]:
                with found[which]():
                    runs[which].append(await per_turn.hango_run(dsn, sizes.turns))
                    drains[which].append(await drain_runs(dsn, max(5, sizes.jobs // 3)))
                    base = await chain.history_state("default", 1000)
                    m = await chain.measure("default", False, base, calls)
                    tool_us[which].append(m["tool_call_us"])
            log(f"profile after rep {rep + 1}")
    finally:
        await drop_database(admin, dsn)
    out = {k: per_turn.aggregate(v, sizes.turns) for k, v in runs.items()}
    for k in out:
        out[k].pop("series_ms", None)
        out[k]["commit"] = commit
        out[k]["chain_tool_call_us_h1000"] = summarize(tool_us[k])
        out[k]["runs_per_s_in_process"] = summarize([d["per_s"] for d in drains[k]])
        out[k]["cpu_ms_per_run"] = summarize([d["cpu_ms_per_run"] for d in drains[k]])
    return out


async def profile_all(admin: str, sizes: Sizes, commit: str = "") -> dict[str, Any]:
    ships = await shipped()
    out: dict[str, Any] = {"shipped": ships, "before": recorded_before()}
    if have("pyinstrument"):
        dsn = await create_database(admin, "prof", migrated=True)
        try:
            out["pyinstrument"] = await pyinstrument_profile(dsn, sizes.turns)
            out["pyinstrument_runs"] = await pyinstrument_runs(dsn, max(5, sizes.jobs // 3))
        finally:
            await drop_database(admin, dsn)
    out["after"] = await after(admin, sizes, ships, commit)
    return out
