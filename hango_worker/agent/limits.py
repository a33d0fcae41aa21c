"""Ending a run early with an answer: the one way to stop early (docs/design.md §12).

Limits are checked *before* a model call is made (`Limits.reached`). When one is
reached the loop makes one last model call in which tools may not be used
(`tool_choice: none`; the tool definitions stay, so a history holding tool calls
stays valid and the prompt-cache prefix is unchanged), asking for the final
answer. The run then ends `succeeded` with the limit recorded
(`runs.limit_reached`, the `hango.run.limit` span attribute,
`hango_run_limits_total`). `on_limit: fail` ends it `failed` with the limit's
error type and no extra call.

Budgets (tokens) are spent by the calls themselves, so a call is made only while
the budget has room for it *and* for the wind-up answer after it, each call
projected from the previous request's input tokens and the request's
`max_tokens`. A run whose budget has no room even for the wind-up ends without
a model call (`failed`, the limit's error type). Tool-call limits are checked
before each tool call: a call over a limit is not executed (an error result for
the model) and the run winds up before its next model call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from hango_worker.provider.types import Message, TextBlock, Usage
from hango_worker.vocab import RunLimit

OnLimit = Literal["answer", "fail"]

# Appended to the user turn that the wind-up call answers (it is stored with it:
# the history shows what the model was asked).
WIND_UP_TEXT = (
    "[hango-worker] This run has reached its {limit} limit ({detail}). Tools can no "
    "longer be used. Reply now with your final answer: summarise what you found and "
    "did, and say plainly what is unfinished."
)


MAX_COUNT = 10**12  # no budget count is larger (tokens, calls)


class Budget(BaseModel):
    """Limits beyond the turn count, per run: agent config keys, and per-enqueue
    overrides (`runs.input.limits`). None: no limit."""

    # counts are whole numbers (`true` is not 1), amounts finite (no Infinity, no NaN)
    model_config = ConfigDict(extra="forbid")
    max_input_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT, strict=True)
    max_output_tokens: int | None = Field(default=None, ge=1, le=MAX_COUNT, strict=True)
    max_cost_usd: float | None = Field(default=None, gt=0, le=1e9, allow_inf_nan=False)
    max_tool_calls: int | None = Field(default=None, ge=0, le=MAX_COUNT, strict=True)
    tool_call_limits: dict[str, Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]] = Field(
        default_factory=dict
    )
    max_duration_s: float | None = Field(
        default=None, gt=0, le=10 * 365 * 86400, allow_inf_nan=False
    )

    def counts_tools(self) -> bool:
        return self.max_tool_calls is not None or bool(self.tool_call_limits)


class RunOverrides(Budget):
    """`runs.input.limits`: a producer's limits for one run; each key set wins over the
    agent's. `deadline` is a wall-clock time (with a UTC offset)."""

    max_turns: int | None = Field(default=None, ge=1, le=10_000, strict=True)
    deadline: AwareDatetime | None = None


def parse_overrides(raw: Any) -> dict[str, Any]:
    """Validate a producer's per-run limits; the JSON to store as `runs.input.limits`.
    ValueError names the first bad key."""
    try:
        return RunOverrides.model_validate(raw).model_dump(mode="json", exclude_unset=True)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise ValueError(f"limits are invalid at {loc}: {err['msg']}") from None


class ToolCounts(BaseModel):
    """Tool calls made so far (private state `limits`, only when a tool limit is set)."""

    model_config = ConfigDict(extra="forbid")
    total: int = 0
    by_tool: dict[str, int] = Field(default_factory=dict)
    refused: RunLimit | None = None  # a call was refused by this limit: wind up


@dataclass(frozen=True, slots=True)
class Reached:
    """A limit that was reached: its name (`runs.limit_reached`), a human detail, and
    whether the budget still has room for the wind-up call."""

    limit: RunLimit
    detail: str
    room: bool = True

    def error(self) -> dict[str, str]:
        """The run's error when the limit ends it without an answer."""
        why = "without a final answer"
        if not self.room:
            why = "with no budget left for a final answer"
        return {
            "type": str(self.limit),
            "message": f"the run reached {self.limit} ({self.detail}) {why}",
        }


@dataclass(slots=True)
class NextCall:
    """What the next call is projected to cost: the last request's input tokens (a lower
    bound for the next, which only grows), the request's max_tokens, and the last
    call's cost in USD. `spent_usd`: the run's cost so far (None: unknown, no price)."""

    input_tokens: int = 0
    max_tokens: int = 0
    cost_usd: float = 0.0
    spent_usd: float | None = 0.0


@dataclass(frozen=True, slots=True)
class Limits:
    max_turns: int = 50
    on_limit: OnLimit = "answer"
    budget: Budget = field(default_factory=Budget)
    deadline: float | None = None  # epoch seconds

    def reached(
        self,
        turns_done: int,
        usage: Usage,
        next_call: NextCall,
        counts: ToolCounts | None,
        now: float,
    ) -> Reached | None:
        """The first limit reached before the next model call, or None."""
        if self.deadline is not None and now >= self.deadline:
            return Reached(RunLimit.DEADLINE, "the run's wall-clock deadline passed")
        for hit in (self._tokens(usage, next_call), self._cost(next_call), self._tools(counts)):
            if hit is not None:
                return hit
        if turns_done >= self.max_turns:
            return Reached(RunLimit.MAX_TURNS, str(self.max_turns))
        return None

    def _tokens(self, usage: Usage, nxt: NextCall) -> Reached | None:
        b = self.budget
        used_in = usage.input_tokens + usage.cache_read_input_tokens
        used_in += usage.cache_creation_input_tokens
        for limit, cap, used, one in (
            (RunLimit.MAX_INPUT_TOKENS, b.max_input_tokens, used_in, nxt.input_tokens),
            (RunLimit.MAX_OUTPUT_TOKENS, b.max_output_tokens, usage.output_tokens, nxt.max_tokens),
        ):
            if cap is not None and used + 2 * one > cap:
                return Reached(limit, f"{used} of {cap} tokens used", room=used + one <= cap)
        return None

    def _cost(self, nxt: NextCall) -> Reached | None:
        cap = self.budget.max_cost_usd
        if cap is None:
            return None
        if nxt.spent_usd is None:  # a budget in dollars needs a price: never guess
            why = "its model has no price, so its cost cannot be bounded; see HANGO_MODEL_PRICES"
            return Reached(RunLimit.MAX_COST_USD, why, room=False)
        spent, one = nxt.spent_usd, nxt.cost_usd
        if spent + 2 * one > cap:
            return Reached(
                RunLimit.MAX_COST_USD, f"${spent:.4f} of ${cap}", room=spent + one <= cap
            )
        return None

    def _tools(self, counts: ToolCounts | None) -> Reached | None:
        if counts is None:
            return None
        cap = self.budget.max_tool_calls
        if cap is not None and counts.total >= cap:
            return Reached(RunLimit.MAX_TOOL_CALLS, f"{counts.total} of {cap} tool calls")
        if counts.refused is not None:
            return Reached(counts.refused, "a tool's own call limit")
        return None

    def refuse_tool(self, name: str, counts: ToolCounts) -> str | None:
        """Why a tool call must not run (its limit is used up), or None (then count it)."""
        cap = self.budget.max_tool_calls
        if cap is not None and counts.total >= cap:
            counts.refused = RunLimit.MAX_TOOL_CALLS
            return f"this run may make at most {cap} tool calls (max_tool_calls)"
        own = self.budget.tool_call_limits.get(name)
        if own is not None and counts.by_tool.get(name, 0) >= own:
            counts.refused = RunLimit.TOOL_CALL_LIMIT
            return f"this run may call {name!r} at most {own} times (tool_call_limits)"
        counts.total += 1
        if name in self.budget.tool_call_limits:
            counts.by_tool[name] = counts.by_tool.get(name, 0) + 1
        return None


# The budget of runs without overrides, per agent config object (a parsed agent is kept
# per row version, run/execute.py, so its config is the same object run after run).
# Budgets are read, never changed. Bounded: emptied when full.
_plain: dict[int, tuple[Budget, Budget]] = {}


def merge(agent: Budget, over: RunOverrides | None) -> Budget:
    """The run's budget: the agent's, with each key the producer set for this run winning."""
    if over is None:
        found = _plain.get(id(agent))
        if found is not None and found[0] is agent:
            return found[1]
        if len(_plain) >= 1024:
            _plain.clear()
        budget = Budget.model_validate(agent.model_dump(include=set(Budget.model_fields)))
        _plain[id(agent)] = (agent, budget)
        return budget
    values = agent.model_dump(include=set(Budget.model_fields))
    if over is not None:
        values.update(over.model_dump(include=set(Budget.model_fields) & over.model_fields_set))
    return Budget.model_validate(values)


def deadline_of(budget: Budget, over: RunOverrides | None, started: float) -> float | None:
    """The earliest of `started + max_duration_s` and the producer's `deadline` (epoch s)."""
    ends = []
    if budget.max_duration_s is not None:
        ends.append(started + budget.max_duration_s)
    if over is not None and over.deadline is not None:
        ends.append(over.deadline.timestamp())
    return min(ends) if ends else None


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
