"""`python -m bench.run [--quick]`: every benchmark, side by side, on one durable Postgres.

One embedded PostgreSQL 18 (fsync and synchronous_commit on, checked), one
database per side and benchmark. Sides alternate within each repetition.
Results go to bench/results/<date>.json; `python -m bench.report` turns the
newest one into docs/benchmarks.md and docs/benchmarks-per-turn.png.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import (
    chain,
    claim,
    parallel_tools,
    per_turn,
    per_turn_floor,
    profile,
    prompt_cache,
    throughput,
)
from bench.common import (
    FULL,
    QUICK,
    SIZES,
    Sizes,
    check_durable,
    create_database,
    drop_database,
    have,
    log,
    machine,
    pg_settings,
    ratio,
    start_server,
    versions,
    windows_for,
)

RESULTS = Path(__file__).resolve().parent / "results"


# -- 1. per turn -----------------------------------------------------------------------------


async def bench_per_turn(admin: str, sizes: Sizes, langchain: bool) -> dict[str, Any]:
    hdb = await create_database(admin, "pt_hango", migrated=True)
    ldb = await create_database(admin, "pt_langchain", migrated=False)
    if langchain:
        from bench import lc_side

        await lc_side.setup(ldb)
    variants = [
        "hango",
        "floor",
        "hango+todo",
        "hango+compaction",
        "hango+thinking",
        "hango+attachment",
    ]
    if langchain:
        variants = [
            "hango",
            "floor",
            "langchain-sync",
            "hango+todo",
            "langchain-sync+todo",
            "hango+compaction",
            "hango+thinking",
            "hango+attachment",
        ]
    if sizes.per_turn_variants:  # `--variants`: only these (and no async LangChain row)
        variants = [v for v in variants if v in sizes.per_turn_variants]
        langchain = langchain and "langchain-default" in sizes.per_turn_variants
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for rep in range(sizes.reps):
        for v in variants if rep % 2 == 0 else list(reversed(variants)):
            runs[v].append(await _one_per_turn(v, hdb, ldb, sizes))
            log(f"per-turn {v} rep {rep + 1}: {runs[v][-1]['total_s']:.2f}s")
    if langchain:
        runs["langchain-default"] = []
        for rep in range(sizes.async_reps):
            runs["langchain-default"].append(
                await _one_per_turn("langchain-default", hdb, ldb, sizes)
            )
            log(f"per-turn langchain-default rep {rep + 1}")
    out = {v: per_turn.aggregate(r, sizes.turns) for v, r in runs.items()}
    await drop_database(admin, hdb)
    await drop_database(admin, ldb)
    return {"turns": sizes.turns, "variants": out, "ratios": _per_turn_ratios(out, sizes.turns)}


async def _one_per_turn(variant: str, hdb: str, ldb: str, sizes: Sizes) -> dict[str, Any]:
    todo, turns = variant.endswith("+todo"), sizes.turns
    if variant == "floor":
        return await per_turn_floor.floor_run(hdb, turns)
    if variant.startswith("hango"):
        return await per_turn.hango_run(
            hdb,
            turns,
            todo=todo,
            compact=variant == "hango+compaction",
            thinking=variant == "hango+thinking",
            attach=sizes.attachment_bytes if variant == "hango+attachment" else 0,
        )
    from bench import lc_side

    durability = None if variant == "langchain-default" else "sync"
    return await lc_side.langchain_run(ldb, turns, todo=todo, durability=durability)


def _per_turn_ratios(out: dict[str, Any], turns: int) -> dict[str, Any]:
    ratios: dict[str, Any] = {}
    h, fl = out.get("hango"), out.get("floor")
    if h and fl:  # hango ÷ floor: how far a turn is from the least it could cost
        r = {}
        for a, b in windows_for(turns):
            k = f"{a}-{b}"
            r[f"wall {k}"] = ratio(h["windows"][k]["median"], fl["windows"][k]["median"])
            r[f"cpu {k}"] = ratio(h["cpu_windows"][k]["median"], fl["cpu_windows"][k]["median"])
        ratios["hango/floor"] = r
    h, th = out.get("hango"), out.get("hango+thinking")
    if h and th:  # thinking blocks in the history ÷ none
        r = {}
        for a, b in windows_for(turns):
            k = f"{a}-{b}"
            r[f"wall {k}"] = ratio(th["windows"][k]["median"], h["windows"][k]["median"])
            r[f"cpu {k}"] = ratio(th["cpu_windows"][k]["median"], h["cpu_windows"][k]["median"])
        r["bytes"] = ratio(th["bytes_per_turn"]["median"], h["bytes_per_turn"]["median"])
        r["live bytes"] = ratio(
            th["live_bytes_per_turn"]["median"], h["live_bytes_per_turn"]["median"]
        )
        ratios["hango+thinking/hango"] = r
    h, at = out.get("hango"), out.get("hango+attachment")
    if h and at:  # a 5 MB attachment in the run's input ÷ none: no per-turn copying
        r = {}
        for a, b in windows_for(turns):
            k = f"{a}-{b}"
            r[f"wall {k}"] = ratio(at["windows"][k]["median"], h["windows"][k]["median"])
            r[f"cpu {k}"] = ratio(at["cpu_windows"][k]["median"], h["cpu_windows"][k]["median"])
        r["mean"] = ratio(at["mean_turn_ms"]["median"], h["mean_turn_ms"]["median"])
        ratios["hango+attachment/hango"] = r
    for suffix in ("", "+todo"):
        h, lc = out.get("hango" + suffix), out.get("langchain-sync" + suffix)
        if not h or not lc:
            continue
        r = {}
        for a, b in windows_for(turns):
            k = f"{a}-{b}"
            r[f"wall {k}"] = ratio(lc["windows"][k]["median"], h["windows"][k]["median"])
            r[f"cpu {k}"] = ratio(lc["cpu_windows"][k]["median"], h["cpu_windows"][k]["median"])
        r["bytes"] = ratio(lc["bytes_per_turn"]["median"], h["bytes_per_turn"]["median"])
        ratios["langchain/hango" + suffix] = r
    return ratios


# -- 2, 3, 5. processes ----------------------------------------------------------------------


async def bench_throughput(admin: str, sizes: Sizes, pgqueuer: bool) -> dict[str, Any]:
    sides = ["hango", "pgqueuer", "floor"] if pgqueuer else ["hango", "floor"]
    out: dict[str, Any] = {"jobs": sizes.jobs, "by_procs": {}}
    for n in sizes.procs:
        raw: dict[str, list[dict[str, float]]] = {s: [] for s in sides}
        for rep in range(sizes.reps):
            for side in sides if rep % 2 == 0 else list(reversed(sides)):
                dsn = await create_database(admin, f"tp_{side}", migrated=side == "hango")
                try:
                    raw[side].append(await throughput.burst(side, dsn, n, sizes.jobs))
                finally:
                    await drop_database(admin, dsn)
                log(f"throughput {side} x{n} rep {rep + 1}: {raw[side][-1]['per_s']:.0f}/s")
        res = {s: throughput.summarize_bursts(r) for s, r in raw.items()}
        h = res["hango"]["per_s"]["median"]
        res["ratios"] = {f"hango/{s}": ratio(h, res[s]["per_s"]["median"]) for s in sides[1:]}
        out["by_procs"][str(n)] = res
    return out


async def bench_latency(admin: str, sizes: Sizes, pgqueuer: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": sizes.latency_samples}
    for side in ["hango", "pgqueuer"] if pgqueuer else ["hango"]:
        dsn = await create_database(admin, f"lat_{side}", migrated=side == "hango")
        try:
            out[side] = await throughput.latency(side, dsn, sizes.latency_samples)
        finally:
            await drop_database(admin, dsn)
        log(f"latency {side}: p50 {out[side]['p50_ms']:.2f} ms p99 {out[side]['p99_ms']:.2f} ms")
    return out


async def bench_memory(admin: str, sizes: Sizes) -> dict[str, Any]:
    dsn = await create_database(admin, "mem", migrated=True)
    try:
        res = await throughput.memory(dsn, sizes.memory_runs, sizes.memory_delay_s)
    finally:
        await drop_database(admin, dsn)
    log(f"memory: {res['in_flight_mib']:.1f} MiB with {res['runs']} runs in flight")
    return res


# -- all of it -------------------------------------------------------------------------------


async def run_all(
    admin: str, sizes: Sizes, only: set[str] | None = None, *, require_durable: bool = True
) -> dict[str, Any]:
    started = time.perf_counter()
    settings = await pg_settings(admin)
    if require_durable:
        check_durable(settings)
    langchain, pgqueuer = have("langchain"), have("pgqueuer")
    res: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "sizes": sizes.__dict__ | {"procs": list(sizes.procs)},
        "machine": machine(),
        "versions": versions(),
        "postgres": settings,
        "alternatives": {"langchain": langchain, "pgqueuer": pgqueuer},
    }

    def want(name: str) -> bool:
        return only is None or name in only

    if want("per_turn"):
        res["per_turn"] = await bench_per_turn(admin, sizes, langchain)
    if want("throughput"):
        res["throughput"] = await bench_throughput(admin, sizes, pgqueuer)
    if want("latency"):
        res["latency"] = await bench_latency(admin, sizes, pgqueuer)
    if want("chain"):
        res["chain"] = await chain.chain_overhead(sizes.chain_calls, sizes.chain_reps)
        res["chain"]["per_middleware"] = chain.per_middleware(res["chain"])
        log("chain overhead done")
    if want("memory"):
        res["memory"] = await bench_memory(admin, sizes)
    if want("prompt_cache"):
        res["prompt_cache"] = await prompt_cache.compare(sizes.turns)
        log("prompt cache done")
    if want("parallel_tools"):
        res["parallel_tools"] = await parallel_tools.compare(admin, sizes.turns, sizes.reps)
        log(f"parallel tools done: {res['parallel_tools']['speedup']:.2f}x")
    if want("claim"):
        res["claim"] = await claim.measure(admin, sizes)
    if want("profile"):
        res["profile"] = await profile.profile_all(admin, sizes, res["versions"]["git"])
        log("profile done")
    res["wall_s"] = time.perf_counter() - started
    return res


def write_results(res: dict[str, Any], out_dir: Path = RESULTS) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{res['date'][:10]}.json"
    path.write_text(json.dumps(res, indent=1, sort_keys=True) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (100 turns, fewer reps)")
    ap.add_argument("--sizes", choices=sorted(SIZES), help=argparse.SUPPRESS)
    ap.add_argument(
        "--only",
        help=(
            "comma-separated: per_turn,throughput,latency,chain,memory,prompt_cache,"
            "parallel_tools,claim,profile"
        ),
    )
    ap.add_argument(
        "--variants",
        help="per_turn only these variants, comma-separated (e.g. hango,hango+thinking)",
    )
    a = ap.parse_args()
    sizes = SIZES[a.sizes] if a.sizes else (QUICK if a.quick else FULL)
    if a.variants:
        sizes = dataclasses.replace(sizes, per_turn_variants=tuple(a.variants.split(",")))
    only = set(a.only.split(",")) if a.only else None
    for k in [k for k in os.environ if k.startswith(("OTEL_", "LANGSMITH_", "LANGCHAIN_"))]:
        del os.environ[k]
    data_dir = tempfile.mkdtemp(prefix="hango-bench-pg-")
    server, admin = start_server(data_dir)
    try:
        log(f"benchmarks ({sizes.name}) on {admin}")
        res = asyncio.run(run_all(admin, sizes, only))
    finally:
        from hango_worker.store import embedded

        embedded.stop(server)
        shutil.rmtree(data_dir, ignore_errors=True)
    path = write_results(res)
    log(f"results: {path} ({res['wall_s']:.0f}s)")


if __name__ == "__main__":
    main()
