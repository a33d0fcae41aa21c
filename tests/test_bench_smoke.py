"""Every benchmark in bench/, at tiny sizes, so none of them can rot.

This asserts the shape of the results and that the report renders, never a
speed. It runs the hango-worker side of every benchmark (and the raw asyncpg
floor); LangChain and pgqueuer are not in the product's environment, so their
code paths are import-guarded and exercised by `make bench` only.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from bench import profile, report
from bench.common import SMOKE, have, windows_for
from bench.run import run_all, write_results


def positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0


def check_summary(s: dict[str, float]) -> None:
    assert set(s) >= {"median", "min", "max", "n"}
    assert s["min"] <= s["median"] <= s["max"]


def check_per_turn(pt: dict[str, Any]) -> None:
    assert pt["turns"] == SMOKE.turns
    ladder = pt["variants"]["hango+compaction"]
    assert set(ladder["compactions"]) == {"clear_tool_results", "sliding_window", "summary"}
    check_summary(ladder["summary_calls"])
    assert set(pt["ratios"]["hango+thinking/hango"]) >= {"bytes", "live bytes"}
    live = {
        k: pt["variants"][k]["live_bytes_per_turn"]["median"] for k in ("hango", "hango+thinking")
    }
    assert live["hango+thinking"] > live["hango"] + 500, live  # its thinking blocks are stored
    assert set(pt["ratios"]["hango+attachment/hango"]) >= {"mean"}
    for key in ("hango", "hango+todo", "hango+compaction", "hango+thinking", "hango+attachment"):
        v = pt["variants"][key]
        assert len(v["series_ms"]) == SMOKE.turns and all(map(positive, v["series_ms"]))
        assert list(v["windows"]) == [f"{a}-{b}" for a, b in windows_for(SMOKE.turns)]
        for w in v["windows"].values():
            check_summary(w)
            assert positive(w["median"])
        assert positive(v["bytes_per_turn"]["median"])
        assert positive(v["cpu_mean_turn_ms"]["median"])


def check_processes(res: dict[str, Any]) -> None:
    for n in SMOKE.procs:
        by = res["throughput"]["by_procs"][str(n)]
        for side in ("hango", "floor"):
            assert positive(by[side]["per_s"]["median"])
        assert positive(by["ratios"]["hango/floor"])
    lat = res["latency"]["hango"]
    assert lat["n"] == SMOKE.latency_samples and 0 < lat["p50_ms"] <= lat["p99_ms"]
    mem = res["memory"]
    assert mem["runs"] == SMOKE.memory_runs and positive(mem["in_flight_mib"])
    assert mem["samples"] > 0 and mem["pg_connections"] > 0


def check_chain(ch: dict[str, Any]) -> None:
    assert len(ch["configs"]) == 8
    for cfg in ch["configs"].values():
        for metric in ("model_call_us", "tool_call_us", "turn_us"):
            assert positive(cfg[metric]["median"])
    assert ch["middlewares"] == [
        "filesystem",
        "summarization",
        "repair_tool_calls",
        "todo",
        "repeat_call",
        "prompt_cache",
        "human_in_the_loop",
        "tool_allowlist",
    ]
    assert set(ch["per_middleware"]) == {
        "h10/no-tracing",
        "h10/tracing",
        "h1000/no-tracing",
        "h1000/tracing",
    }
    assert int(ch["history_messages"]["1000"]) >= 1000


def check_profile(p: dict[str, Any]) -> None:
    """After = the code as it is (+ a substitute for each fix not shipped); before = recorded."""
    ships = p["shipped"]
    assert ships["repeat_max_tracked"] and ships["pool_size_for"]["max_size"] > 0
    after = p["after"]
    expected = {"after"} | (set() if ships["pool_reset_skipped"] else {"after+no_pool_reset"})
    assert set(after) == expected
    for v in after.values():
        assert positive(v["chain_tool_call_us_h1000"]["median"])
        assert positive(v["mean_turn_ms"]["median"])
        assert positive(v["runs_per_s_in_process"]["median"])
    before = p["before"]  # bench/results/*-before-fixes.json, recorded on the earlier code
    assert before is not None and before["commit"] == profile.BEFORE_COMMIT
    assert positive(before["profile"]["mean_turn_ms"]["median"])
    assert before["memory"]["pg_connections"] > 0


def check_prompt_cache(pc: dict[str, Any]) -> None:
    assert pc["turns"] == SMOKE.turns
    with_, without = (pc["variants"][k] for k in ("with PromptCache", "without (slot left out)"))
    assert with_["share_from_turn2"] > 0.9 and without["share_from_turn2"] == 0.0
    assert 0 < with_["cost_usd"] < without["cost_usd"]
    assert pc["cost_ratio"] == with_["cost_usd"] / without["cost_usd"]


def check_parallel_tools(pt: dict[str, Any]) -> None:
    assert pt["calls"] == 3 and pt["turns"] == min(5, SMOKE.turns)
    for v in pt["variants"].values():
        assert v["turn_s"]["n"] == pt["turns"] * SMOKE.reps
        assert v["turn_s"]["min"] >= v["ideal_s"]  # a floor, not a speed: sleeps are sleeps
    assert positive(pt["speedup"])


def check_claim(c: dict[str, Any]) -> None:
    assert len(c["cases"]) == 4
    for v in c["cases"].values():
        assert positive(v["p50_ms"]) and v["p50_ms"] <= v["p95_ms"]
        assert v["claims"] > 0 and v["runs"] > 0


def with_alternatives(res: dict[str, Any]) -> dict[str, Any]:
    """A synthetic results dict with the alternatives' entries (copied from hango's)."""
    r = copy.deepcopy(res)
    v = r["per_turn"]["variants"]
    v["langchain-sync"] = copy.deepcopy(v["hango"])
    v["langchain-sync+todo"] = copy.deepcopy(v["hango+todo"])
    v["langchain-default"] = copy.deepcopy(v["hango"]) | {"lag_s": v["hango"]["total_s"]}
    r["per_turn"]["ratios"] = {"langchain/hango": {"wall 1-1": 1.0, "bytes": 1.0}}
    by = r["throughput"]["by_procs"]["1"]
    by["pgqueuer"] = copy.deepcopy(by["floor"])
    by["ratios"]["hango/pgqueuer"] = 1.0
    r["latency"]["pgqueuer"] = copy.deepcopy(r["latency"]["hango"])
    r["sizes"]["name"] = "full"
    return r


async def test_every_benchmark_runs_at_tiny_sizes(pg_admin_dsn: str, tmp_path: Path) -> None:
    res = await run_all(pg_admin_dsn, SMOKE, require_durable=False)
    assert res["alternatives"] == {"langchain": have("langchain"), "pgqueuer": have("pgqueuer")}
    assert {"fsync", "synchronous_commit", "server_version"} <= set(res["postgres"])
    assert positive(res["machine"]["cores"]) and res["versions"]["hango-worker"]
    check_per_turn(res["per_turn"])
    check_processes(res)
    check_chain(res["chain"])
    check_profile(res["profile"])
    check_prompt_cache(res["prompt_cache"])
    check_parallel_tools(res["parallel_tools"])
    check_claim(res["claim"])

    path = write_results(res, tmp_path / "results")
    assert json.loads(path.read_text())["per_turn"]["turns"] == SMOKE.turns

    for r in (res, with_alternatives(res)):
        doc = report.write(r, tmp_path / "benchmarks.md", tmp_path / "plot.png")
        text = doc.read_text()
        for title in ("## Summary", "## 1. Per-turn", "## 2. Throughput", "## 3. Latency"):
            assert title in text
        for title in ("## 4. Chain overhead", "## 5. Memory", "## 6. Prompt cache", "## Machine"):
            assert title in text
        assert "## Profiling" in text and "## 7. Parallel tool calls" in text
        assert "## 8. Claim latency" in text
        assert (tmp_path / "plot.png").exists() == have("matplotlib")
    assert "pgqueuer: no-op jobs" in text and 'durability="sync"' in text
    assert f"**before**: {profile.BEFORE_COMMIT}" in text and "**after**:" in text
    assert "smoke" not in text  # the synthetic full-size dict has no size warning
