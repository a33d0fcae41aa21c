"""Terminal rendering of runs: transcript, events, the live view."""

from __future__ import annotations

import json
import re
import sys
from typing import Any, TextIO

from hango_worker.provider.content import BLOB_KEY as BLOB_KEY
from hango_worker.provider.content import describe, result_text
from hango_worker.provider.sanitize import clean_text

# input blocks shown as one line (provider/content.py `describe`), never their bytes
ATTACHMENTS = frozenset(("image", "document", "search_result", "container_upload"))

DIM, BOLD, GREEN, RED, CYAN, YELLOW, RESET = (
    "\033[2m",
    "\033[1m",
    "\033[32m",
    "\033[31m",
    "\033[36m",
    "\033[33m",
    "\033[0m",
)


# Terminal control sequences in stored text (model output, tool results, errors) must
# never reach the operator's terminal: an escape can retitle, recolour or clear it.
# ESC sequences (CSI, OSC/DCS/APC/PM/SOS strings, two-character escapes) and their
# 8-bit C1 forms go as a whole; every other C0/C1 control character except \n and
# \t is dropped. Lone surrogates become U+FFFD (they cannot be written at all).
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"  # CSI … final byte
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # strings
    r"|\x1b[ -/]*[0-~]?"  # other escapes
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # other controls
)


def safe(text: Any) -> str:
    """`text` as it may be printed: no terminal control sequences (see `_CONTROL`)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable() or (s.isascii() and not _CONTROL.search(s)):
        return s
    return _CONTROL.sub("", clean_text(s)[0])


class Painter:
    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.color = self.out.isatty()

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        return "".join(styles) + text + RESET

    def line(self, text: str = "") -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def raw(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()


def short(value: Any, limit: int = 160) -> str:
    s = safe(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
    return s if len(s) <= limit else s[: limit - 1] + "…"


def attachment(block: dict[str, Any]) -> str:
    """An input block (image, document, …) in one line: name, media type, size."""
    return describe(block)


def attachments_text(blocks: list[dict[str, Any]]) -> str:
    """A tool result's blocks as text: its text, a line per image or document."""
    return result_text(blocks)


def block_lines(p: Painter, role: str, block: dict[str, Any]) -> list[str]:
    kind = block.get("type")
    if kind == "text":
        who = p("assistant", BOLD, CYAN) if role == "assistant" else p("user", BOLD)
        lines = [f"{who}: {safe(block.get('text', ''))}"]
        cites = block.get("citations")
        if isinstance(cites, list) and cites:
            where = [c.get("url") or c.get("document_title") for c in cites if isinstance(c, dict)]
            lines.append(p(f"  ({len(cites)} citations: {short(where)})", DIM))
        return lines
    if kind == "tool_use":
        return [p(f"  → {safe(block.get('name'))}({short(block.get('input'))})", YELLOW)]
    if kind == "tool_result":
        mark = p("  ✗ ", RED) if block.get("is_error") else p("  ← ", GREEN)
        content = block.get("content", "")
        if isinstance(content, list):  # blocks: text, and a line per image or document
            return [mark + short(result_text([b for b in content if isinstance(b, dict)]))]
        return [mark + short(content)]
    if kind == "thinking":
        return [p(f"  (thinking) {short(block.get('thinking', ''))}", DIM)]
    if kind == "server_tool_use":
        return [p(f"  ⇢ {safe(block.get('name'))}({short(block.get('input'))})", YELLOW)]
    if kind in ATTACHMENTS:  # by name, media type and size: never the bytes
        return [p(f"  [{safe(describe(block))}]", DIM)]
    # any other block (a server tool's result, redacted thinking, a type added later)
    rest = {k: v for k, v in block.items() if k != "type"}
    return [p(f"  [{safe(kind)}] {short(rest, 120)}", DIM)]


def _print_budget_wait(p: Painter, w: dict[str, Any], since: Any) -> None:
    need = w.get("need_usd")
    ask = f"${need:.6f}" if isinstance(need, int | float) else "?"
    p.line(p(f"waiting for a spend budget since {since}: the next call needs up to {ask}", YELLOW))
    for b in w.get("budgets") or []:
        if isinstance(b, dict):
            p.line(f"  {safe(b.get('period'))} budget: {safe(json.dumps(b, ensure_ascii=False))}")
    p.line(p("  goes on when it has room: hango-worker budgets show | budgets set …", DIM))


def _print_waiting(p: Painter, w: dict[str, Any], since: Any, until: Any) -> None:
    if w.get("reason") == "budget":
        _print_budget_wait(p, w, since)
        return
    raw = w.get("call")
    call: dict[str, Any] = raw if isinstance(raw, dict) else {}
    what = "an answer" if w.get("reason") == "question" else "approval"
    p.line(p(f"waiting for {what} since {since}" + (f" (until {until})" if until else ""), YELLOW))
    p.line(f"  call {safe(call.get('tool_use_id'))}  {safe(call.get('name'))}")
    if call.get("question"):
        p.line(f"  question: {safe(call.get('question'))}")
    p.line(f"  input: {safe(json.dumps(call.get('input'), ensure_ascii=False))[:2000]}")
    verbs = (
        "runs answer ID --text …"
        if what == "an answer"
        else "runs approve ID | runs reject ID --reason …"
    )
    p.line(p(f"  decide with: hango-worker {verbs}", DIM))


def usage_line(usage: Any) -> str:
    """A run's tokens (thinking apart, a part of output), cache reads and writes apart
    from plain input, its server-tool units and service tiers, and its cost."""
    if not isinstance(usage, dict):
        return f"usage {json.dumps(usage)}"

    def n(key: str) -> int:
        v = usage.get(key)
        return v if isinstance(v, int) else 0

    cost = usage.get("cost_usd")
    money = f"${cost:.6f}" if isinstance(cost, int | float) else "unknown (no price for the model)"
    if not isinstance(cost, int | float) and usage.get("cost_unpriced"):
        money = f"unknown (no price for {usage['cost_unpriced']})"
    thinking = f" (thinking {n('thinking_tokens')})" if n("thinking_tokens") else ""
    return (
        f"usage input {n('input_tokens')} · output {n('output_tokens')}{thinking} · "
        f"cache read {n('cache_read_input_tokens')} · "
        f"cache write {n('cache_creation_input_tokens')} "
        f"(1h {n('cache_creation_1h_input_tokens')})"
        f"{_counts(usage.get('server_tool_use'), 'server tools')}"
        f"{_counts(_tiers(usage.get('service_tiers')), 'tiers')} · cost {money}"
    )


def _tiers(d: Any) -> Any:
    """The responses per service tier, shown only when some ran on another than standard."""
    return d if isinstance(d, dict) and set(d) - {"standard"} else None


def _counts(d: Any, what: str) -> str:
    """` · what k n, k n` for a dict of counts (server-tool units, tiers), else ''."""
    if not isinstance(d, dict) or not d:
        return ""
    return f" · {what} " + ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def _tenure(run: dict[str, Any]) -> str:
    """How the claims before this one ended, when not all in one go: handed back by
    stopping workers (not failures) or lost (the lease expired since the last progress)."""
    parts = []
    if run.get("handed_back"):
        parts.append(f"{run['handed_back']} handed back at shutdowns")
    if run.get("lost_count"):
        parts.append(f"{run['lost_count']} lost since the last turn")
    return f" ({', '.join(parts)})" if parts else ""


def print_run(p: Painter, run: dict[str, Any]) -> None:
    status = run["status"]
    colour = (
        GREEN if status == "succeeded" else RED if status in ("failed", "cancelled") else YELLOW
    )
    p.line(f"run {run['id']}  {p(status, BOLD, colour)}  attempt {run['attempt']}{_tenure(run)}")
    p.line(
        f"session {run['session_id']}  created {run['created_at']}  finished {run['finished_at']}"
    )
    if run.get("limit_reached"):
        p.line(
            p(f"limit: {safe(run['limit_reached'])} (the run ended with a wind-up answer)", YELLOW)
            if status == "succeeded"
            else p(f"limit: {safe(run['limit_reached'])}", RED)
        )
    run_input = run.get("input")
    if isinstance(run_input, dict) and run_input.get("params") is not None:
        shown = json.dumps(run_input["params"], ensure_ascii=False, sort_keys=True)
        p.line(p(f"params {safe(shown)}", DIM))
    waiting = run.get("waiting_for")
    if status == "waiting" and isinstance(waiting, dict):
        _print_waiting(p, waiting, run.get("waiting_since"), run.get("waiting_until"))
    if run.get("usage"):
        p.line(p(usage_line(run["usage"]), DIM))
    if run.get("error"):
        err = run["error"]
        p.line(p(f"error {safe(err.get('type'))}: {safe(err.get('message'))}", RED))
    if run.get("output") is not None:  # a structured answer (docs/structured-output.md)
        shown = json.dumps(run["output"], ensure_ascii=False)
        p.line(p("output: ", BOLD) + safe(shown if len(shown) <= 2000 else shown[:1999] + "…"))
    if run.get("parent_run_id"):
        p.line(p(f"subagent of run {run['parent_run_id']} (depth {run.get('depth')})", DIM))
    for c in run.get("children") or []:
        p.line(f"child {c['id']}  {c['status']}  (task {safe(c['parent_tool_use_id'])})")
    p.line(p("— transcript —", DIM))
    for m in run.get("transcript", []):
        for b in m["content"]:
            for ln in block_lines(p, m["role"], b):
                p.line(ln)
    todos = (run.get("state_json") or {}).get("todos") or []
    if todos:
        p.line(p("— plan (state_json.todos) —", DIM))
        marks = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}
        for t in todos:
            p.line(f"  {marks.get(t['status'], '[?]')} {safe(t['content'])}")
    p.line(p(f"— {len(run.get('events', []))} events —", DIM))
    for e in run.get("events", []):
        line = f"  #{e['seq']} {safe(e['type'])} (attempt {e['attempt']}, {safe(e['worker_id'])})"
        p.line(p(line, DIM))


class LiveView:
    """Prints a run as it happens: streamed text, tool calls and results, the end.

    Text arrives twice: streamed (deltas, possibly late and batched) and in each
    committed `model_message` event. `printed` counts the run's assistant text
    already shown, so each character is printed once whichever arrives first."""

    def __init__(self, p: Painter, run_id: str | None = None) -> None:
        self.p = p
        self.run_id = run_id  # only this run (None: every run)
        self.streaming = False
        self.deltas = 0
        self.printed = 0  # characters of assistant text shown
        self.committed = 0  # characters of assistant text in events seen so far

    def delta(self, run_id: str, text: str, offset: int | None = None) -> None:
        if self.run_id is not None and run_id != self.run_id:
            return
        self.deltas += 1
        start = self.printed if offset is None else offset
        new = text[max(0, self.printed - start) :]
        if not new or start > self.printed:
            return
        if not self.streaming:
            self.p.raw(self.p("assistant", BOLD, CYAN) + ": ")
            self.streaming = True
        self.p.raw(safe(new))
        self.printed += len(new)

    def events(self, run_id: str, events: list[dict[str, Any]]) -> None:
        if self.run_id is not None and run_id != self.run_id:
            return
        for e in events:
            self.event(e)

    def event(self, e: dict[str, Any]) -> None:
        kind, payload = e["type"], e.get("payload") or {}
        if kind == "model_message":
            self._message(payload.get("message", {}).get("content", []))
        elif kind == "tool_result":
            block = {"type": "tool_result", **payload}
            self.p.line(block_lines(self.p, "user", block)[0])
        elif kind == "run_started" and payload.get("attempt", 1) > 1:
            self.p.line(self.p(f"— attempt {safe(payload.get('attempt'))} started —", DIM))
        elif kind == "run_finished":
            self.p.line(self.p(f"— run finished: {safe(payload.get('status'))} —", BOLD))

    def _message(self, content: list[dict[str, Any]]) -> None:
        text = "".join(b.get("text", "") for b in content if b.get("type") == "text")
        start = self.committed
        self.committed += len(text)
        if text:
            self.delta(self.run_id or "", text, offset=start)
        if self.streaming:
            self.p.line()
            self.streaming = False
        for b in content:
            if b.get("type") == "tool_use":
                self.p.line(block_lines(self.p, "assistant", b)[0])
