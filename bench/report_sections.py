"""docs/benchmarks.md's summary and sections 1-5 (per turn, throughput, latency, chain,
memory), and the table helpers every section uses. `bench/report.py` assembles the page."""

from __future__ import annotations

from typing import Any

from bench.common import DASH, fmt, window_key

PLOT_NAME = "benchmarks-per-turn.png"

LABELS = {
    "hango": "hango-worker",
    "floor": "floor: raw asyncpg, one INSERT message + UPDATE state per turn, one commit",
    "hango+todo": "hango-worker, write_todos every 10th turn",
    "hango+compaction": "hango-worker, 8 KB tool results, 30k-token window (compaction)",
    "hango+thinking": "hango-worker, thinking on: a 1.5 KB thinking block + signature per response",
    "hango+attachment": "hango-worker, a 5 MB PDF in the run's input, stored once",
    "langchain-sync": 'LangChain create_agent, durability="sync"',
    "langchain-sync+todo": 'LangChain + TodoListMiddleware, durability="sync"',
    "langchain-default": "LangChain create_agent, default durability (async)",
}


THINKING_NOTE = (
    "The thinking row (`hango+thinking`) plays the same script with thinking on: every "
    "response starts with a thinking block of about 1.5 KB and a 560-character signature, "
    "kept in the history and sent back whole with every later call, as the API requires. "
    "To run it alone, beside the plain row: `.venv-bench/bin/python -m bench.run --quick "
    "--only per_turn --variants hango,hango+thinking` (drop `--quick` for 500 turns; the "
    "results go to `bench/results/<date>.json`)."
)


ATTACHMENT_NOTE = (
    "The attachment row (`hango+attachment`) plays the plain script with a 5 MB PDF in the "
    "run's input (docs/inputs-and-outputs.md): its bytes are stored once and put back in "
    "every request, never copied per turn, so its per-turn cost should stay within 10% "
    "of the plain row's (the `hango+attachment/hango` ratios). To run it alone, beside the "
    "plain row: `.venv-bench/bin/python -m bench.run --quick --only per_turn --variants "
    "hango,hango+attachment`."
)


def table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def x(v: float) -> str:
    return f"{v:.2f}\u00d7" if v < 10 else f"{v:.0f}\u00d7"


def ordered(d: dict[str, Any]) -> list[str]:
    return sorted(d, key=window_key)


def med(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f}"


# -- summary and sections 1-5 -----------------------------------------------------------------


def summary(r: dict[str, Any]) -> str:
    rows: list[list[str]] = []
    pt = r.get("per_turn")
    if pt:
        v = pt["variants"]
        wins = ordered(v["hango"]["windows"])
        first, last = wins[0], wins[-1]
        for key in [k for k in ("hango", "floor", "langchain-sync") if k in v]:
            res = v[key]
            w, c = res["windows"], res["cpu_windows"]
            rows.append(
                [
                    f"per-turn wall, turns {first} / {last} ({LABELS[key]})",
                    f"{fmt(w[first], ' ms')} / {fmt(w[last], ' ms')}",
                ]
            )
            rows.append(
                [
                    f"client CPU per turn, turns {first} / {last} ({LABELS[key]})",
                    f"{fmt(c[first], ' ms')} / {fmt(c[last], ' ms')}",
                ]
            )
            rows.append(
                [
                    f"bytes per turn: table growth / live rows ({LABELS[key]})",
                    f"{fmt(res['bytes_per_turn'], ' B', 0)} / "
                    f"{fmt(res['live_bytes_per_turn'], ' B', 0)}",
                ]
            )
        fr = pt.get("ratios", {}).get("hango/floor")
        if fr:
            rows.append(
                [
                    "per-turn wall, hango-worker \u00f7 floor",
                    f"turns {first}: {x(fr['wall ' + first])}, turns {last}: "
                    f"{x(fr['wall ' + last])}",
                ]
            )
        rows += _compaction_summary(v, first, last)
    tp = r.get("throughput")
    if tp:
        for n, res in tp["by_procs"].items():
            line = f"{med(res['hango']['per_s'], 0)} runs/s"
            for other in ("pgqueuer", "floor"):
                if other in res:
                    line += f" vs {other} {med(res[other]['per_s'], 0)} jobs/s"
            rows.append([f"throughput, {n} worker process(es)", line])
    lat = r.get("latency")
    if lat:
        for side, what in (("hango", "first model call"), ("pgqueuer", "pgqueuer handler")):
            if side in lat:
                s = lat[side]
                line = f"p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms"
                rows.append([f"enqueue \u2192 {what} (idle worker)", line])
    ch = r.get("chain")
    if ch:
        pm = ch["per_middleware"]
        for key in ("h10/no-tracing", "h10/tracing", "h1000/no-tracing", "h1000/tracing"):
            p, (h, tr) = pm[key], key.split("/")
            rows.append(
                [
                    f"chain cost per middleware, {tr.replace('-', ' ')}, history "
                    f"{ch['history_messages'].get(h[1:], h[1:])} messages",
                    f"model call {p['model_call_us_per_mw']:.1f} \u00b5s, "
                    f"tool call {p['tool_call_us_per_mw']:.1f} \u00b5s",
                ]
            )
    mem = r.get("memory")
    if mem:
        rows.append(
            [
                f"worker RSS, {mem['runs']} runs in flight",
                f"{mem['in_flight_mib']:.1f} MiB (idle {mem['idle_mib']:.1f} MiB, "
                f"{mem['per_run_kib']:.0f} KiB per run)",
            ]
        )
        rows.append(
            [
                f"Postgres connections one worker holds, {mem['runs']} runs in flight",
                str(mem["pg_connections"]),
            ]
        )
    return "## Summary\n\n" + table(["what", "measured"], rows) + "\n"


def per_turn_section(r: dict[str, Any]) -> str:
    pt = r.get("per_turn")
    if not pt:
        return ""
    v = pt["variants"]
    wins = ordered(v["hango"]["windows"])
    head = ["side", *[f"wall ms, turns {w}" for w in wins], "mean wall ms", "total s"]
    rows = []
    for key, res in v.items():
        rows.append(
            [
                LABELS.get(key, key),
                *[fmt(res["windows"][w]) for w in wins],
                fmt(res["mean_turn_ms"]),
                fmt(res["total_s"]),
            ]
        )
    cpu_head = ["side", *[f"client CPU ms, turns {w}" for w in wins], "mean CPU ms"]
    cpu_rows = [
        [
            LABELS.get(k, k),
            *[fmt(res["cpu_windows"][w]) for w in wins],
            fmt(res["cpu_mean_turn_ms"]),
        ]
        for k, res in v.items()
    ]
    bw = ordered(v["hango"]["bytes_windows"])
    b_head = [
        "side",
        "table growth per turn (whole run)",
        *[f"growth/turn, {w}" for w in bw],
        "live row bytes per turn",
    ]
    b_rows = [
        [
            LABELS.get(k, k),
            fmt(res["bytes_per_turn"], "", 0),
            *[fmt(res["bytes_windows"][w], "", 0) for w in bw if w in res["bytes_windows"]],
            fmt(res["live_bytes_per_turn"], "", 0),
        ]
        for k, res in v.items()
    ]
    parts = [
        f"## 1. Per-turn cost against history length\n\nA run of {pt['turns']} turns, one tool "
        "call per turn, zero-latency scripted model, on both sides. hango-worker runs the real "
        "worker path in process (`serve(until_idle=True)`: claim, load, the loop, PgRunIO "
        "checkpoints) with its default middleware stack, tracing off. LangChain runs "
        "`create_agent` with `AsyncPostgresSaver.from_conn_string` (its documented set-up) "
        "and a fake chat model playing the same script.",
        table(head, rows),
        table(cpu_head, cpu_rows),
        "Bytes: *table growth* is the `pg_total_relation_size` (heap, TOAST, indexes) delta "
        "of the side's tables: hango `messages, run_events, tool_calls, runs, sessions`; "
        "LangChain `checkpoints, checkpoint_blobs, checkpoint_writes`. It includes dead row "
        "versions not yet vacuumed (autovacuum runs when it likes, so single runs vary). "
        "Windows are sampled at model calls, so page granularity (8 KiB) shows. *Live row "
        "bytes* is the delta of `sum(pg_column_size(row))` over the same tables: what stays "
        "once vacuum has run. The async (default) LangChain row's windows are not "
        "meaningful: its writes trail its model calls.",
        table(b_head, b_rows),
    ]
    parts.append(_per_turn_ratios(pt))
    parts.append(THINKING_NOTE)
    parts.append(ATTACHMENT_NOTE)
    if "langchain-default" in v and "lag_s" in v["langchain-default"]:
        lag = v["langchain-default"]["lag_s"]
        reps = v["langchain-default"]["reps"]
        parts.append(
            f"({reps} repetition(s) of the default-durability row.) "
            "LangChain's default durability writes checkpoints in the background: its turns "
            "above do not wait for Postgres, and `ainvoke` returned "
            f"**{fmt(lag, ' s')}** after the last model call (the backlog of checkpoint "
            "writes still to commit). The durable comparison is the `sync` row."
        )
    if "hango+compaction" in v:
        parts.append(_compaction_note(v["hango+compaction"]))
    parts.append(
        "Settings that differ: hango-worker's default stack always carries Todo (its "
        "`write_todos` tool reaches the model only when the agent lists it, as in the "
        "todo rows); LangChain's plain rows have no middleware. Neither side traces."
    )
    parts.append(f"![per-turn cost against turn index]({PLOT_NAME})")
    return "\n\n".join(parts) + "\n"


def _compaction_summary(v: dict[str, Any], first: str, last: str) -> list[list[str]]:
    res = v.get("hango+compaction")
    if not res or "summary_calls" not in res:
        return []
    w = res["windows"]
    return [
        [
            f"per-turn wall, turns {first} / {last} ({LABELS['hango+compaction']})",
            f"{fmt(w[first], ' ms')} / {fmt(w[last], ' ms')} "
            f"({w[last]['median'] / w[first]['median']:.2f}\u00d7), "
            f"summary calls {med(res['summary_calls'], 0)}",
        ]
    ]


def _compaction_note(res: dict[str, Any]) -> str:
    rungs = ", ".join(f"{k} {med(n, 0)}" for k, n in res.get("compactions", {}).items())
    return (
        "The compaction row: each tool result is 8 KB (about 2,000 tokens), the agent's "
        "`context_window` is 30,000 tokens (everything else at its default: trigger 0.8, "
        "target 0.5, 5 results kept whole), and the model reports input tokens as the fake "
        "Anthropic server counts them (characters / 4); summary requests are answered at "
        f"once. Rungs applied per run (median): {rungs}; summary calls "
        f"{med(res.get('summary_calls', {'median': 0}), 0)}. A turn's cost includes the "
        "compactions it triggers."
    )


def _per_turn_ratios(pt: dict[str, Any]) -> str:
    rows = []
    for name, rr in pt.get("ratios", {}).items():
        rows.append([name, ", ".join(f"{k}: {x(val)}" for k, val in rr.items())])
    if not rows:
        return "(LangChain was not installed in this run: no ratios.)"
    return (
        "Ratios (medians; LangChain \u00f7 hango-worker: how much cheaper hango-worker is, "
        "bytes = table growth; hango-worker \u00f7 floor: how far a hango turn is from the "
        "least a durable turn can cost; hango+thinking \u00f7 hango: what thinking blocks in "
        "the history cost a turn; hango+attachment \u00f7 hango: what a 5 MB attachment "
        "costs a turn):\n\n" + table(["compared", "ratios"], rows)
    )


def throughput_section(r: dict[str, Any]) -> str:
    tp = r.get("throughput")
    if not tp:
        return ""
    rows = []
    for n, res in tp["by_procs"].items():
        for side, label in (
            ("hango", "hango-worker: full 1-turn runs"),
            ("pgqueuer", "pgqueuer: no-op jobs"),
            ("floor", "raw asyncpg claim-and-complete"),
        ):
            if side in res:
                s = res[side]
                rows.append(
                    [
                        n,
                        label,
                        fmt(s["per_s"], "", 0),
                        fmt(s["seconds"]),
                        fmt(s["cpu_ms_per_job"]),
                        fmt(s["pg_cpu_ms_per_job"]),
                    ]
                )
        ratio_txt = ", ".join(f"{k} {x(val)}" for k, val in res["ratios"].items())
        rows.append([n, "ratio", ratio_txt, "", "", ""])
    return (
        f"## 2. Throughput\n\n{tp['jobs']} runs (jobs) enqueued in one transaction to idle "
        "workers (separate processes, warmed up); the clock runs from the enqueue commit to "
        "the client's poll (every 10 ms: an `EXISTS` for the first unfinished job, never a "
        "count) seeing none left. hango-worker: `hango-worker run`, "
        "defaults (`HANGO_WORKER_CONCURRENCY=8`), scripted model answering at once; each run "
        "is claimed, loaded, calls the model and commits its final checkpoint. pgqueuer: "
        "`PgQueuer.run()` defaults (batch size 10), a no-op entrypoint, one asyncpg "
        "connection per process. Floor: a batch claim (`FOR UPDATE SKIP LOCKED`) and one "
        "commit per job, 8 at a time per process, woken by NOTIFY. Worker CPU is the "
        "worker processes' user+system time during the burst; Postgres CPU that of the "
        "benchmark server's processes, less the client's own poll connection (not the "
        "side's cost). The machine has "
        f"{r['machine']['cores']} cores: a second worker process competes with Postgres "
        "for them.\n\n"
        + table(
            [
                "processes",
                "side",
                "per second",
                "seconds",
                "worker CPU ms/job",
                "Postgres CPU ms/job",
            ],
            rows,
        )
        + "\n"
    )


def latency_section(r: dict[str, Any]) -> str:
    lat = r.get("latency")
    if not lat:
        return ""
    rows = []
    for side, label in (
        ("hango", "hango-worker: enqueue \u2192 first model call"),
        ("pgqueuer", "pgqueuer: enqueue \u2192 handler start"),
    ):
        if side in lat:
            s = lat[side]
            rows.append(
                [
                    label,
                    f"{s['p50_ms']:.2f}",
                    f"{s['p99_ms']:.2f}",
                    f"{s['min_ms']:.2f}{DASH}{s['max_ms']:.2f}",
                    str(s["n"]),
                ]
            )
    return (
        "## 3. Latency, idle worker\n\nOne worker process, idle (LISTENing); one run enqueued "
        "at a time (`repo.enqueue`, the real path), the next only after the previous one "
        "was picked up and a 50\u2013100 ms pause. Measured from the start of the enqueue "
        "call (its statements and its durable commit included; hango's `repo.enqueue` also "
        "looks the agent up first) to the moment the worker's model (hango) or handler "
        "(pgqueuer) is called, on a monotonic clock shared by both processes.\n\n"
        + table(["what", "p50 ms", "p99 ms", "min\u2013max ms", "samples"], rows)
        + "\n"
    )


def chain_section(r: dict[str, Any]) -> str:
    ch = r.get("chain")
    if not ch:
        return ""
    rows = []
    for key, res in ch["configs"].items():
        h, kind, tr = key.split("/")
        rows.append(
            [
                str(ch["history_messages"].get(h[1:], h[1:])),
                kind,
                tr,
                fmt(res["model_call_us"], "", 1),
                fmt(res["tool_call_us"], "", 1),
                fmt(res["turn_us"], "", 1),
            ]
        )
    pm_rows = []
    for key, p in ch["per_middleware"].items():
        h, tr = key.split("/")
        pm_rows.append(
            [
                str(ch["history_messages"].get(h[1:], h[1:])),
                tr,
                f"{p['model_call_us']:.1f} ({p['model_call_us_per_mw']:.1f})",
                f"{p['tool_call_us']:.1f} ({p['tool_call_us_per_mw']:.1f})",
                f"{p['turn_us']:.1f} ({p['turn_us_per_mw']:.1f})",
            ]
        )
    names = ", ".join(ch["middlewares"])
    return (
        "## 4. Chain overhead (in process, no database)\n\n"
        "The real `AgentLoop` on `testing/inmem.py`'s `MemoryRunIO`, a model and a tool "
        "that answer at once; their own time is subtracted. *model call*: "
        "`chain.model_call` (wrappers + base handler: system assembly, chat span, metrics, "
        "cancel race). *tool call*: tool span + `chain.tool_call`. *turn*: everything "
        "between two model calls, in-memory checkpoint included. Tracing on = SDK "
        "`TracerProvider` + `BatchSpanProcessor` + an exporter that drops the batch. "
        "History is built by the same loop first, so middleware state is realistic. "
        "Microseconds, median (min\u2013max) over repetitions.\n\n"
        + table(["history (messages)", "stack", "tracing", "model call", "tool call", "turn"], rows)
        + f"\n\nDefault stack minus empty stack, per call (and per middleware: \u00f7 "
        f"{len(ch['middlewares'])}, the stack being {names}), \u00b5s:\n\n"
        + table(["history", "tracing", "model call", "tool call", "turn"], pm_rows)
        + "\n"
    )


def memory_section(r: dict[str, Any]) -> str:
    m = r.get("memory")
    if not m:
        return ""
    pool = m.get("pool_max_size")
    rows = [
        ["idle (after one warm-up run)", f"{m['idle_mib']:.1f} MiB"],
        [f"peak with {m['runs']} runs in flight", f"{m['in_flight_mib']:.1f} MiB"],
        ["per run in flight", f"{m['per_run_kib']:.0f} KiB"],
        ["after they finished", f"{m['after_mib']:.1f} MiB"],
        ["Postgres connections held by the worker (peak)", str(m["pg_connections"])],
    ]
    if pool is not None:
        rows.append([f"its pool's max_size (`service.pool_size({m['runs']})`)", str(pool)])
    conns = (
        f"Postgres runs with max_connections = {r['postgres']['max_connections']}, as it "
        "comes: the worker's pool is sized per worker (`min(concurrency, 16) + 4`), not per "
        "run, so the worker holds that pool plus its LISTEN connection, and the server "
        "needs no extra room for this test."
        if pool is not None
        else ""
    )
    before = (r.get("profile") or {}).get("before") or {}
    if conns and before.get("memory"):
        conns += (
            f" (Before, on {before['commit']}, the pool was sized concurrency + 4: the "
            f"worker held {before['memory']['pg_connections']} connections and this test "
            f"ran with max_connections = {before['max_connections']}.)"
        )
    return (
        f"## 5. Memory\n\nOne `hango-worker run` process with "
        f"`HANGO_WORKER_CONCURRENCY={m['concurrency_setting']}` (the default is 8; raised so "
        f"{m['runs']} runs can be in flight), scripted model sleeping in each of a run's two "
        f"turns (one tool call between). RSS by psutil, sampled every 100 ms while all "
        f"{m['runs']} runs are `running`; connections are the backends of the worker's "
        f"database (pg_stat_activity) at the same moments. {conns}\n\n"
        + table(["what", "value"], rows)
        + "\n"
    )
