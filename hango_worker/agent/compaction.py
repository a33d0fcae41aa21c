"""The compaction ladder's pure parts: the state, the view it gives, and each rung's plan.

Compaction is a view (docs/design.md §12): the history is never rewritten. The
model is shown `view(history, state)`:

- the first message, with one note appended when messages were dropped (and the
  summary of the dropped ones, when one was made);
- then `history[dropped_upto:]`, where each tool result in a message before
  `clear_before` is replaced by a one-line note (tool name, size, and for a result
  offloaded to the run's files the path to `read_file`).

Everything the view depends on lives in `CompactionState` (the middleware's private
state in `runs.state_json`), so the view re-derived after a resume is byte-identical,
and it only changes when a rung moves a boundary: between compactions the prompt
cache sees a stable prefix.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from hango_worker.agent.context import ContextEstimate, media_chars, message_chars
from hango_worker.agent.offload import offloaded
from hango_worker.provider.content import describe
from hango_worker.provider.types import (
    Block,
    Message,
    RawBlock,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    compact_json,
)

RUNGS = ("clear_tool_results", "sliding_window", "summary")
DEFAULT_TRIGGER = 0.8
DEFAULT_TARGET = 0.5
DEFAULT_KEEP_TOOL_RESULTS = 5


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """The agent's compaction settings, resolved (the keys of the same names in
    agent/middlewares/summarize.py:SummarizeConfig, each unset one at its default)."""

    context_window: int | None = None  # None: the model's window (agent/context.py)
    compact_trigger: float = DEFAULT_TRIGGER
    compact_target: float = DEFAULT_TARGET
    keep_tool_results: int = DEFAULT_KEEP_TOOL_RESULTS
    summary_model: str | None = None  # None: the agent's model


class CompactionState(BaseModel):
    """Private state of `Summarization`. Documented default: nothing compacted."""

    model_config = ConfigDict(extra="forbid")
    dropped_upto: int = Field(default=1, ge=1)  # messages 1 .. dropped_upto-1 not shown
    clear_before: int = Field(default=0, ge=0)  # tool results before it shown as notes
    summary: str | None = None
    summary_upto: int = Field(default=1, ge=1)  # the summary covers messages 1 .. upto-1
    summary_calls: int = Field(default=0, ge=0)
    estimate: ContextEstimate = Field(default_factory=ContextEstimate)

    def key(self) -> tuple[int, int, str | None, int]:
        """What the view depends on besides the history."""
        return (self.dropped_upto, self.clear_before, self.summary, self.summary_upto)

    def fits(self, msgs: Sequence[Message]) -> bool:
        """The boundaries still describe this history (else it is compacted afresh)."""
        d = self.dropped_upto
        if self.clear_before > len(msgs) or self.summary_upto > d:
            return False
        return d == 1 or (
            d < len(msgs) and msgs[d].role == "assistant" and msgs[d - 1].role == "user"
        )


# -- the view ---------------------------------------------------------------------------


def cleared_note(tool: str, content: str) -> str:
    where = offloaded(content)
    if where is not None:
        path, size = where
        return (
            f"[tool result cleared from the context: {tool}, {size} bytes, stored at {path}; "
            "read it with read_file]"
        )
    return (
        f"[tool result cleared from the context: {tool}, {len(content)} characters; "
        "call the tool again if you need it]"
    )


def cleared_media_note(tool: str, blocks: list[dict[str, Any]]) -> str:
    """What a cleared image or document result was, and that it is kept."""
    what = "; ".join(describe(b) for b in blocks if isinstance(b, dict) and b.get("type") != "text")
    return (
        f"[tool result cleared from the context: {tool} returned {what}; it is kept "
        "with the run: call the tool again if you need to see it]"
    )


def cleared(m: Message, prev: Message | None) -> Message:
    """`m` with each of its tool results replaced by a note (short ones are kept)."""
    if m.role != "user" or not any(isinstance(b, ToolResultBlock) for b in m.content):
        return m
    names = {u.id: u.name for u in prev.tool_uses()} if prev is not None else {}
    out: list[Block] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock) and b.blocks and media_chars(b.blocks):
            b = ToolResultBlock(
                b.tool_use_id, cleared_media_note(names.get(b.tool_use_id, "a tool"), b.blocks)
            )
        elif isinstance(b, ToolResultBlock):
            note = cleared_note(names.get(b.tool_use_id, "unknown tool"), b.content)
            if len(note) < len(b.content):
                b = ToolResultBlock(b.tool_use_id, note, b.is_error)
        out.append(b)
    return Message("user", out)


def head_note(st: CompactionState) -> str | None:
    if st.dropped_upto <= 1:
        return None
    note = (
        f"[Context compaction: messages 2 to {st.dropped_upto} of this conversation are "
        "no longer shown."
    )
    if st.summary is not None:
        note += f" Summary of messages 2 to {st.summary_upto}:\n{st.summary}\n"
    return note + "]"


def head(first: Message, st: CompactionState) -> Message:
    note = head_note(st)
    return first if note is None else Message(first.role, [*first.content, TextBlock(note)])


def shown(msgs: Sequence[Message], i: int, st: CompactionState) -> Message:
    """Message `i` (≥ dropped_upto) as the view shows it."""
    return cleared(msgs[i], msgs[i - 1]) if i < st.clear_before else msgs[i]


def view(msgs: Sequence[Message], st: CompactionState) -> list[Message]:
    if not msgs:
        return []
    return [head(msgs[0], st), *(shown(msgs, i, st) for i in range(st.dropped_upto, len(msgs)))]


# -- planning the rungs -----------------------------------------------------------------


def keep_from(msgs: Sequence[Message], lo: int, k: int) -> int:
    """Index of the message holding the k-th newest tool result (looking no further
    back than `lo`); the oldest one if fewer; len(msgs) if there is none."""
    found, count = len(msgs), 0
    for i in range(len(msgs) - 1, max(lo, 1) - 1, -1):
        n = sum(1 for b in msgs[i].content if isinstance(b, ToolResultBlock))
        if n:
            found, count = i, count + n
            if count >= k:
                break
    return found


def clear_saving(msgs: Sequence[Message], st: CompactionState, new_clear: int) -> int:
    """Characters saved by moving `clear_before` to `new_clear`."""
    saved = 0
    for i in range(max(st.dropped_upto, st.clear_before, 1), new_clear):
        saved += message_chars(msgs[i]) - message_chars(cleared(msgs[i], msgs[i - 1]))
    return saved


def last_cut(msgs: Sequence[Message]) -> int:
    """The furthest a cut may go: the newest assistant message (the newest turn stays)."""
    for i in range(len(msgs) - 1, 0, -1):
        if msgs[i].role == "assistant" and msgs[i - 1].role == "user":
            return i
    return 1


def plan_cut(
    msgs: Sequence[Message], st: CompactionState, hi: int, excess: int, extra_chars: int = 0
) -> int:
    """The smallest new `dropped_upto` ≤ hi that removes at least `excess` tokens
    (net of `extra_chars` the head gains), or the largest allowed one; a cut always
    lands on an assistant message right after a user message, so no tool_use is
    separated from its tool_result and the first message stays."""
    est = st.estimate
    removed, best = 0, st.dropped_upto
    for i in range(st.dropped_upto, min(hi, len(msgs))):
        removed += message_chars(shown(msgs, i, st))
        j = i + 1
        if msgs[j].role == "assistant" and msgs[j - 1].role == "user":
            best = j
            if est.tokens(removed) - est.tokens(extra_chars) >= excess:
                return j
    return best


def dropped_chars(msgs: Sequence[Message], st: CompactionState, upto: int) -> int:
    return sum(message_chars(shown(msgs, i, st)) for i in range(st.dropped_upto, upto))


# -- the summariser's input -------------------------------------------------------------

SUMMARY_SYSTEM = (
    "You compact an agent's conversation. Summarise the transcript you are given so "
    "the agent can continue its task without it: the task and constraints, decisions "
    "made, facts and results found (names, numbers, paths), tool calls worth knowing "
    "about and what is still to do. Be concise; write only the summary."
)
_BLOCK_CAP = 1500  # characters of one block shown to the summariser


def _render_block(b: Block) -> str:
    if isinstance(b, TextBlock):
        text = b.text
    elif isinstance(b, ToolUseBlock):
        text = f"(calls {b.name} {json.dumps(b.input, separators=(',', ':'))})"
    elif isinstance(b, ToolResultBlock):
        text = f"(result{' error' if b.is_error else ''}, {len(b.content)} chars) {b.content}"
    elif isinstance(b, RawBlock) and b.type != "redacted_thinking":  # server tools' use, results
        text = f"({b.type} {compact_json(b.data)})"
    else:
        return ""
    return text if len(text) <= _BLOCK_CAP else text[:_BLOCK_CAP] + " […]"


def summary_prompt(previous: str | None, msgs: Sequence[Message], budget_chars: int) -> str:
    """The transcript to summarise (the newest part, within `budget_chars`), after the
    previous summary it extends."""
    lines: list[str] = []
    size = 0
    for m in reversed(msgs):
        line = f"{m.role}: " + " ".join(t for t in map(_render_block, m.content) if t)
        if size + len(line) > budget_chars and lines:
            lines.append("[… earlier messages omitted …]")
            break
        lines.append(line[:budget_chars])
        size += len(line)
    parts = []
    if previous:
        parts.append(f"Summary so far:\n{previous}\n")
    parts.append("Transcript to add to it:\n" + "\n".join(reversed(lines)))
    return "\n".join(parts)
