"""Ending a run early with an answer: the one way to stop early (docs/design.md §12).

A limit is checked *before* a model call is made. When one is reached the loop
makes one last model call in which tools may not be used (`tool_choice: none`;
the tool definitions stay, so a history holding tool calls stays valid and the
prompt-cache prefix is unchanged), asking for the final answer. The run then
ends `succeeded` with the limit recorded (`runs.limit_reached`, the
`hango.run.limit` span attribute, `hango_run_limits_total`). `on_limit: fail`
keeps the strict behaviour: the run fails with the limit's error type.

Today one limit exists (`max_turns`); usage, cost and deadline limits are meant
to add a check to `Limits.reached` and reuse everything else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hango_worker.provider.types import Message, TextBlock
from hango_worker.vocab import ErrorType, RunLimit

OnLimit = Literal["answer", "fail"]

# Appended to the user turn that the wind-up call answers (it is stored with it:
# the history shows what the model was asked).
WIND_UP_TEXT = (
    "[hango-worker] This run has reached its {limit} limit ({detail}). Tools can no "
    "longer be used. Reply now with your final answer: summarise what you found and "
    "did, and say plainly what is unfinished."
)

_ERROR_TYPES = {RunLimit.MAX_TURNS: ErrorType.MAX_TURNS}


@dataclass(frozen=True, slots=True)
class Reached:
    """A limit that was reached: its name (`runs.limit_reached`) and a human detail."""

    limit: RunLimit
    detail: str

    def error(self) -> dict[str, str]:
        """The run's error when the limit ends it without an answer."""
        return {
            "type": _ERROR_TYPES.get(self.limit, self.limit),
            "message": f"the run reached {self.limit} ({self.detail}) without a final answer",
        }


@dataclass(frozen=True, slots=True)
class Limits:
    max_turns: int = 50
    on_limit: OnLimit = "answer"

    def reached(self, turns_done: int) -> Reached | None:
        """The first limit reached before the next model call, or None."""
        if turns_done >= self.max_turns:
            return Reached(RunLimit.MAX_TURNS, str(self.max_turns))
        return None


def ask_for_answer(messages: list[Message], persisted: int, reached: Reached) -> None:
    """Ask for the final answer in the user turn the wind-up call answers: appended to
    the last user message while it is not yet stored (tool results must stay first in
    it, so the text goes after them), else a new user message."""
    block = TextBlock(WIND_UP_TEXT.format(limit=reached.limit, detail=reached.detail))
    last = messages[-1] if messages else None
    if last is not None and last.role == "user" and len(messages) > persisted:
        last.content.append(block)
    else:
        messages.append(Message("user", [block]))
