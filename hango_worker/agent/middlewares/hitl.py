"""HumanInTheLoop: calls that need a person's approval, and questions for a person.

A call of a tool named by the agent's `approvals` rules (always, or when its
arguments match) suspends the run before it executes (`SuspendRun`): the run
becomes `waiting`, holding no lease and no worker (docs/design.md §12, one way
to wait). `hango-worker runs approve|reject|answer` (or the Client) records a
decision and re-queues the run; the attempt that resumes it gets the decisions
for its pending turn and applies them here: approved (possibly with edited
arguments) → the call runs; rejected → an error result carrying the reason.

`ask_user(question)` (allowed only when the agent lists it) suspends the same
way until an answer arrives; the answer is the tool result.

It sits just outside the allowlist, so it sees a call after every rewrite, but
before the allowlist decides: a call of a tool the agent may not use is passed
on (the allowlist refuses it) and never offered for approval.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import re2
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from hango_worker.agent.middleware import StackContext, SuspendRun, ToolCallRequest, ToolHandler
from hango_worker.agent.ports import DecisionRecord as DecisionRecord  # callers import it here
from hango_worker.agent.state import State
from hango_worker.provider.types import ToolUseBlock
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from hango_worker.vocab import Decision

ASK_USER = "ask_user"
ASK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"question": {"type": "string", "minLength": 1, "maxLength": 4000}},
    "required": ["question"],
    "additionalProperties": False,
}
ASK_DESCRIPTION = (
    "Ask the person you work for a question and wait for their answer (it may take "
    "minutes or days). Use it only when you cannot go on without them."
)


_EVENTS = {
    Decision.APPROVE: "hitl.approved",
    Decision.REJECT: "hitl.rejected",
    Decision.ANSWER: "hitl.answered",
    Decision.TIMEOUT: "hitl.timed_out",
}


_RE2 = re2.Options()
_RE2.log_errors = False  # a bad pattern is our one-line error, not a log line on stderr


def compile_pattern(pattern: str) -> Any:
    """An approval rule's pattern, compiled by RE2: matching takes time linear in the
    text, whatever the pattern (no catastrophic backtracking on the event loop: a rule
    is matched against every call the model makes). ValueError for what RE2 refuses
    (backreferences, lookaround) or cannot hold in its memory bound."""
    try:
        return re2.compile(pattern, options=_RE2)
    except re2.error as e:
        raw = e.args[0] if e.args else e
        why = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
        raise ValueError(
            f"{why} (approval patterns use RE2 syntax: no backreferences or lookaround)"
        ) from None


class ApprovalRule(BaseModel):
    """`approvals` entry: calls of `tool` need approval — always, or only when every
    argument named in `when` matches its regular expression (RE2, searched in the
    argument's value as text; non-strings as compact JSON)."""

    model_config = ConfigDict(extra="forbid")
    tool: str = Field(min_length=1, max_length=200)
    when: dict[str, str] = Field(default_factory=dict)
    _compiled: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("when")
    @classmethod
    def _patterns(cls, v: dict[str, str]) -> dict[str, str]:
        for arg, pattern in v.items():
            try:
                compile_pattern(pattern)
            except ValueError as e:
                raise ValueError(f"when.{arg}: {pattern!r} is not a valid regex: {e}") from None
        return v

    def model_post_init(self, context: Any) -> None:
        self._compiled = {arg: compile_pattern(p) for arg, p in self.when.items()}

    def matches(self, name: str, args: Mapping[str, Any]) -> bool:
        if name != self.tool:
            return False
        for arg, compiled in self._compiled.items():
            if arg not in args:
                return False
            value = args[arg]
            text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
            if compiled.search(text) is None:
                return False
        return True


class HitlConfig(BaseModel):
    """The agent's settings (`agents.config`, a section of AgentConfig): calls that wait
    for a person's approval, and for how long."""

    approvals: list[ApprovalRule] = Field(default_factory=list)
    approval_timeout_s: float | None = Field(default=None, gt=0, le=90 * 86400)
    on_approval_timeout: Literal["reject", "fail"] = "reject"


class HumanInTheLoop:
    name = "human_in_the_loop"

    def __init__(
        self,
        rules: Iterable[ApprovalRule],
        allowed: Iterable[str],
        decisions: Mapping[str, DecisionRecord] | None = None,
        timeout_s: float | None = None,
        on_timeout: Literal["reject", "fail"] = "reject",
    ) -> None:
        self.rules = tuple(rules)
        self.allowed = frozenset(allowed)
        self.decisions = dict(decisions or {})
        self.timeout_s = timeout_s
        self.on_timeout = on_timeout
        self._tool: Tool | None = None

    def provide_tools(self, state: State) -> list[Tool]:
        if self._tool is None:

            async def never(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
                return ToolResult.error("ask_user can only run through the human-in-the-loop")

            self._tool = Tool(ASK_USER, ASK_DESCRIPTION, ASK_SCHEMA, never, sequential=True)
        return [self._tool]

    def runs_alone(self, call: ToolUseBlock) -> bool:
        """A call that may wait for a person is handled alone and in order, as in a
        sequential batch: the calls before it finish first, the later ones wait."""
        if call.name not in self.allowed:
            return False
        return call.name == ASK_USER or next_rule(self.rules, call.name, call.input) is not None

    async def wrap_tool_call(self, req: ToolCallRequest, next: ToolHandler) -> ToolResult:
        call = req.call
        if call.name not in self.allowed or req.tool is None:
            return await next(req)  # the allowlist refuses it: never offered for approval
        asking = call.name == ASK_USER
        rule = None if asking else next_rule(self.rules, call.name, call.input)
        if not asking and rule is None:
            return await next(req)
        d = self._decision(call.id, call.name, call.input)
        if d is None:
            self._suspend(req, rule)
        assert d is not None
        middleware_event(_EVENTS[d.decision], self.name, call.name)
        metrics.HITL_DECISIONS.labels(d.decision).inc()
        if d.decision == Decision.APPROVE:
            return await next(req.with_call(input=d.input) if d.input is not None else req)
        if d.decision == Decision.ANSWER:
            return ToolResult(d.text or "")
        if d.decision == Decision.TIMEOUT:
            return ToolResult.error(
                "not executed: no one decided within the approval timeout", "denied"
            )
        who = "declined to answer" if asking else "rejected this call"
        return ToolResult.error(f"not executed: a person {who}: {d.text or 'no reason'}", "denied")

    def _decision(self, call_id: str, name: str, args: dict[str, Any]) -> DecisionRecord | None:
        d = self.decisions.get(call_id)
        if d is None or d.name != name or d.call_input != args:
            return None  # a decision is for that very call of the pending turn only
        del self.decisions[call_id]
        return d

    def _suspend(self, req: ToolCallRequest, rule: ApprovalRule | None) -> None:
        call = req.call
        detail: dict[str, Any] = {"tool_use_id": call.id, "name": call.name, "input": call.input}
        if rule is None:
            detail["question"] = str(call.input.get("question", ""))
            reason = "question"
        else:
            detail["rule"] = rule.model_dump()
            reason = "approval"
        if self.timeout_s is not None:
            detail["timeout_s"] = self.timeout_s
            detail["on_timeout"] = self.on_timeout
        middleware_event("hitl.suspended", self.name, reason, **{"gen_ai.tool.name": call.name})
        metrics.RUNS_SUSPENDED.labels(reason).inc()
        raise SuspendRun(reason, detail)


def next_rule(
    rules: Iterable[ApprovalRule], name: str, args: Mapping[str, Any]
) -> ApprovalRule | None:
    """The first rule that asks for approval of this call, or None."""
    return next((r for r in rules if r.matches(name, args)), None)


def build(ctx: StackContext) -> HumanInTheLoop:
    c = ctx.settings(HitlConfig)
    return HumanInTheLoop(
        c.approvals, ctx.allowlist, ctx.decisions, c.approval_timeout_s, c.on_approval_timeout
    )
