"""What `runs show` prints: everything that can be shown, malformed rows marked."""

from __future__ import annotations

import json
from typing import Any

from hango_worker.render import LiveView, Painter

MALFORMED = "malformed"


def _block_problem(block: Any) -> str | None:
    if not isinstance(block, dict):
        return f"a content block is {type(block).__name__}, not an object"
    if not isinstance(block.get("type"), str):
        return "a content block has no type"
    return None


def _message(m: dict[str, Any]) -> dict[str, Any]:
    content = m.get("content")
    if not isinstance(content, list):
        problem: str | None = f"content is {type(content).__name__}, not a list of blocks"
    else:
        problem = next(filter(None, map(_block_problem, content)), None)
    if problem is None:
        return m
    note = {"type": f"{MALFORMED} message #{m.get('seq')}: {problem}"}
    return {**m, "content": [note], MALFORMED: problem, "raw_content": content}


def _todos(state: Any) -> tuple[Any, str | None]:
    if state is None:
        return state, None
    if not isinstance(state, dict):
        return {}, f"state_json is {type(state).__name__}, not an object"
    todos = state.get("todos") or []
    ok = isinstance(todos, list) and all(
        isinstance(t, dict) and isinstance(t.get("content"), str) and "status" in t for t in todos
    )
    if ok:
        return state, None
    return {**state, "todos": []}, "state_json.todos is not a list of {content, status}"


def showable(run: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`run` with every malformed part replaced by a marker, and what was malformed."""
    problems: list[str] = []
    transcript = [_message(m) for m in run.get("transcript", [])]
    problems += [f"message #{m.get('seq')}: {m[MALFORMED]}" for m in transcript if MALFORMED in m]
    state, state_problem = _todos(run.get("state_json"))
    problems += [state_problem] if state_problem else []
    error = run.get("error")
    if error is not None and not isinstance(error, dict):
        problems.append(f"error is {type(error).__name__}, not an object")
        error = {"type": MALFORMED, "message": repr(error)[:200]}
    return {**run, "transcript": transcript, "state_json": state, "error": error}, problems


class JsonLines(LiveView):
    """`runs watch --json`: one JSON object per line — each committed event as it
    lands, and each streamed text chunk as {"type": "text", "offset", "text"}."""

    def __init__(self) -> None:
        super().__init__(Painter())

    def _emit(self, value: dict[str, Any]) -> None:
        self.p.line(json.dumps(value, default=str, ensure_ascii=False))

    def delta(self, run_id: str, text: str, offset: int | None = None) -> None:
        self._emit({"type": "text", "run_id": run_id, "offset": offset, "text": text})

    def event(self, e: dict[str, Any]) -> None:
        self._emit(e)
