"""6. Prompt cache: one long run with and without PromptCache, side by side.

The same agent (a ~3k-token system prompt, 10 tools), the same script and the same
stack but for the PromptCache slot, through the real `anthropic` SDK against
FakeAnthropic, whose cache reads and writes follow the breakpoints it receives
(tokens approximated as characters / 4). Cost at the list prices of the agent's model
(`hango_worker/provider/prices.py`). Token counts are deterministic: one repetition.
"""

from __future__ import annotations

import time
from typing import Any

from hango_worker.testing.cache_run import MODEL, measure, read_share, turn_usages

MAX_TURNS = 50
VARIANTS = {"with PromptCache": True, "without (slot left out)": False}


async def compare(turns: int) -> dict[str, Any]:
    turns = min(MAX_TURNS, turns)
    out: dict[str, Any] = {"turns": turns, "model": MODEL, "variants": {}}
    for label, cache in VARIANTS.items():
        started = time.perf_counter()
        m = await measure(turns, cache=cache)
        per_turn = turn_usages(m.io)
        later = per_turn[1:]
        reads = sum(u["cache_read_input_tokens"] for u in later)
        total = sum(
            u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
            for u in later
        )
        out["variants"][label] = {
            "turn2_share": read_share(per_turn[1]) if len(per_turn) > 1 else 0.0,
            "share_from_turn2": reads / total if total else 0.0,
            "min_share_from_turn2": min((read_share(u) for u in later), default=0.0),
            "usage": m.outcome.usage.to_dict(),
            "cost_usd": m.outcome.cost_usd,
            "wall_s": time.perf_counter() - started,
        }
    with_, without = (out["variants"][k]["cost_usd"] for k in VARIANTS)
    out["cost_ratio"] = with_ / without if with_ is not None and without else None
    return out


def section(r: dict[str, Any]) -> str:
    """docs/benchmarks.md's prompt-cache section (empty when not measured)."""
    pc = r.get("prompt_cache")
    if not pc:
        return ""
    v = pc["variants"]
    cols = list(v)

    def row(what: str, fmt: Any) -> str:
        return f"| {what} | " + " | ".join(fmt(v[c]) for c in cols) + " |"

    def tok(key: str) -> Any:
        return lambda s: f"{s['usage'][key]:,}"

    def usd(s: dict[str, Any]) -> str:
        return "unknown" if s["cost_usd"] is None else f"${s['cost_usd']:.4f}"

    lines = [
        "| | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
        row("cache-read share, turn 2", lambda s: f"{s['turn2_share']:.1%}"),
        row(f"cache-read share, turns 2-{pc['turns']}", lambda s: f"{s['share_from_turn2']:.1%}"),
        row("lowest turn from turn 2", lambda s: f"{s['min_share_from_turn2']:.1%}"),
        row("input tokens (uncached)", tok("input_tokens")),
        row("cache reads", tok("cache_read_input_tokens")),
        row("cache writes", tok("cache_creation_input_tokens")),
        row("output tokens", tok("output_tokens")),
        row(f"cost per run ({pc['model']} list prices)", usd),
    ]
    ratio = pc.get("cost_ratio")
    verdict = (
        f" With PromptCache the run costs **{ratio:.1%}** of the run without it."
        if ratio is not None
        else ""
    )
    return (
        f"## 6. Prompt cache\n\nOne {pc['turns']}-turn run (a ~3k-token system prompt, "
        "10 tools, one tool call per turn) with the default stack and with its PromptCache "
        "slot left out, through the real `anthropic` SDK against FakeAnthropic, whose "
        "cache reads and writes follow the `cache_control` breakpoints it receives "
        "(tokens = characters / 4; `bench/prompt_cache.py`). Share = cache reads / "
        f"(input + cache reads + cache writes).{verdict}\n\n" + "\n".join(lines) + "\n"
    )
