"""Output: the run's final answer as JSON matching the agent's `output_schema`
(docs/structured-output.md).

Two ways to ask for it, chosen once per run (`OutputSpec.of`):

- **native**: the API's structured outputs. Every request carries
  `output_config.format` (provider/structured.py:output_format, merged into the
  agent's own `output_config`); the final answer is the reply's text, parsed as JSON.
  Used for the models that have it (`native_support`) when the SDK can express the
  schema, or when the agent says `output_mode: native`.
- **tool**: a forced final tool. The model gets the tool `final_answer`, whose input is
  the answer (a schema that is not an object is wrapped as `{"answer": ...}`), and
  `tool_choice: any`, so it ends its run only by calling it; the wind-up forces that very
  tool. With thinking on, the API forces no tool: the choice stays as it was and a plain
  text answer is read as JSON. Used for every other model, or with `output_mode: tool`.

Either way the answer is validated against the agent's schema (jsonschema, with format
checks). A violation is counted in private state `output` (so it survives a wait or a
crash) and told to the model once: a user turn (native) or the final tool's error result
(tool), and the run goes on with another turn, within its limits. A second violation, or
one in the wind-up (no turn may follow), ends the run `failed` with `output_invalid`
naming the JSON path. Span event `agent.output_invalid`, counter
`hango_output_invalid_total{attempt}`. An accepted answer ends the run `succeeded` with
`Outcome.output` (runs.output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, field_validator, model_validator
from pydantic_core import PydanticCustomError

from hango_worker.agent.middleware import (
    Answer,
    ModelHandler,
    ModelRequest,
    ModelResponse,
    StackContext,
)
from hango_worker.agent.state import State, load_private, store_private
from hango_worker.provider import structured
from hango_worker.provider.structured import (
    Violation,
    native_support,
    output_format,
    parse_answer,
    violation,
)
from hango_worker.provider.types import Message, StopReason, TextBlock, ToolResultBlock
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import middleware_event
from hango_worker.tool.types import Tool, ToolContext, ToolResult
from hango_worker.vocab import ErrorType

NAME = "output"
TOOL_NAME = "final_answer"
WRAP_KEY = "answer"  # the final tool's one property when the schema is not an object
MAX_VIOLATIONS = 2  # the second one ends the run
ACCEPTED = "Final answer recorded."
ALONE = (
    f"{TOOL_NAME} ends the run: call it alone, in a reply of its own, once your other "
    "tool calls have their results. Nothing was recorded."
)
DESCRIPTION = (
    "Give your final answer. Call this once, alone, when your work is done: its input is "
    "the answer, which must match this schema exactly. The run ends with this call."
)
_FINAL_STOPS = (StopReason.END_TURN, StopReason.STOP_SEQUENCE, StopReason.TOOL_USE)

Mode = Literal["native", "tool"]


class OutputConfig(BaseModel):
    """The agent's settings (`agents.config`, a section of AgentConfig): the JSON Schema
    its final answer must match, and how it is asked for (auto: the API's structured
    outputs where the model has them, else the forced final tool)."""

    output_schema: dict[str, Any] | None = None
    output_mode: Literal["auto", "native", "tool"] = "auto"

    @field_validator("output_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            try:
                structured.check_schema(v)
            except ValueError as e:
                raise PydanticCustomError("output_schema", "{why}", {"why": str(e)}) from None
        return v

    @model_validator(mode="after")
    def _output_schema(self) -> OutputConfig:
        if self.output_schema is None:
            return self
        fmt = (self.model_extra or {}).get("output_config") or {}  # AgentConfig's API keys
        if isinstance(fmt, dict) and fmt.get("format") is not None:
            raise PydanticCustomError(
                "output_schema",
                "output_schema and output_config.format cannot both be set: "
                "output_schema sends output_config.format itself",
            )
        if self.output_mode == "native":
            try:
                structured.output_format(self.output_schema)
            except (ValueError, TypeError) as e:
                raise PydanticCustomError(
                    "output_schema",
                    "output_schema: the API's structured outputs cannot express it ({why}); "
                    "use output_mode auto or tool",
                    {"why": str(e)},
                ) from None
        return self


class OutputState(BaseModel):
    """Private state `output`: how many final answers broke the schema so far."""

    violations: int = 0


def _expressible(schema: dict[str, Any]) -> bool:
    try:
        output_format(schema)
    except (ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class OutputSpec:
    schema: dict[str, Any]
    mode: Mode

    @classmethod
    def of(cls, c: OutputConfig, model: str) -> OutputSpec | None:
        """The agent's output_schema and the way it is asked for with its `model`
        (None: no schema)."""
        if c.output_schema is None:
            return None
        mode: Mode
        if c.output_mode == "auto":
            native = native_support(model) and _expressible(c.output_schema)
            mode = "native" if native else "tool"
        else:
            mode = c.output_mode
        return cls(c.output_schema, mode)


def _thinking(params: dict[str, Any] | None) -> bool:
    t = (params or {}).get("thinking")
    return isinstance(t, dict) and t.get("type") not in (None, "disabled")


class Output:
    """ModelWrapper, ToolProvider and AnswerCheck (agent/middleware.py)."""

    name = NAME

    def __init__(self, spec: OutputSpec) -> None:
        self.spec = spec
        schema = spec.schema
        self._wrapped = schema.get("type") != "object"
        self._format = output_format(schema) if spec.mode == "native" else None
        self._params: tuple[dict[str, Any] | None, dict[str, Any]] | None = None
        tool_schema = schema
        if self._wrapped:
            tool_schema = {
                "type": "object",
                "properties": {WRAP_KEY: schema},
                "required": [WRAP_KEY],
                "additionalProperties": False,
            }
        self._tools = (
            [Tool(TOOL_NAME, DESCRIPTION, tool_schema, self._not_alone, idempotent=True)]
            if spec.mode == "tool"
            else []
        )

    # -- asking for it -------------------------------------------------------------------

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        if self._format is not None:
            return await next(req.with_request(params=self._native_params(req.request.params)))
        if _thinking(req.request.params):  # the API forces no tool with thinking on
            return await next(req)
        choice = req.request.tool_choice
        if choice is None:
            return await next(req.with_request(tool_choice={"type": "any"}))
        if choice.get("type") == "none":  # the wind-up: the answer, through the tool
            return await next(req.with_request(tool_choice={"type": "tool", "name": TOOL_NAME}))
        return await next(req)

    def _native_params(self, params: dict[str, Any] | None) -> dict[str, Any]:
        """The agent's API parameters with output_config.format (computed once per run:
        the loop passes the same dict on every call)."""
        if self._params is not None and self._params[0] is params:
            return self._params[1]
        given = params or {}
        config = given.get("output_config")
        merged = {**given, "output_config": {**(config or {}), "format": self._format}}
        self._params = (params, merged)
        return merged

    def provide_tools(self, state: State) -> list[Tool]:
        return self._tools

    async def _not_alone(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """The final tool run as a tool: only when called beside other tools."""
        return ToolResult.error(ALONE)

    # -- checking it ---------------------------------------------------------------------

    def check_answer(self, state: State, resp: ModelResponse, last: bool) -> Answer | None:
        if resp.stop_reason not in _FINAL_STOPS:
            return None  # cut off, refused, paused: the loop's own handling
        uses = resp.message.tool_uses()
        if not uses:
            value, problem = parse_answer(resp.message.text())
            if problem is not None and self.spec.mode == "tool":
                problem = Violation("$", f"give your final answer by calling {TOOL_NAME}")
            return self._judge(state, value, problem, None, last)
        if self.spec.mode == "native" or len(uses) > 1 or uses[0].name != TOOL_NAME:
            return None  # a tool turn (a final call beside others is answered by the tool)
        call = uses[0]
        given: Any = call.input
        missing = None
        if self._wrapped:
            if WRAP_KEY in call.input:
                given = call.input[WRAP_KEY]
            else:
                missing = Violation("$", f"{TOOL_NAME}'s input has no {WRAP_KEY!r}")
        return self._judge(state, given, missing, call.id, last)

    def _judge(
        self,
        state: State,
        value: Any,
        problem: Violation | None,
        call_id: str | None,
        last: bool,
    ) -> Answer:
        problem = problem or violation(self.spec.schema, value)
        if problem is None:
            reply = None if call_id is None else _result(call_id, ACCEPTED, False)
            return Answer(reply=reply, accepted=True, output=value)
        st, _ = load_private(state, NAME, OutputState)
        st.violations += 1
        store_private(state, NAME, st)
        attempt = min(st.violations, MAX_VIOLATIONS)
        metrics.OUTPUT_INVALID.labels(str(attempt)).inc()
        middleware_event(
            "agent.output_invalid",
            NAME,
            problem.message,
            **{
                "hango.output.path": problem.path,
                "hango.output.attempt": st.violations,
                "hango.output.mode": self.spec.mode,
            },
        )
        told = (
            f"Your final answer does not match the required output schema at {problem.path}: "
            f"{problem.message}."
        )
        if st.violations >= MAX_VIOLATIONS or last:
            # the history ends with what was wrong, and `runs resume` starts the count again
            store_private(state, NAME, OutputState())
            reply = _text(told) if call_id is None else _result(call_id, told, True)
            error = {
                "type": ErrorType.OUTPUT_INVALID,
                "message": f"the final answer does not match output_schema at {problem.path}: "
                f"{problem.message}",
                "path": problem.path,
            }
            return Answer(reply=reply, error=error)
        if call_id is not None:
            again = f"{told} Call {TOOL_NAME} again, corrected."
            return Answer(reply=_result(call_id, again, True))
        return Answer(reply=_text(f"{told} Reply again with the whole answer, corrected."))


def _text(text: str) -> Message:
    return Message("user", [TextBlock(text=text)])


def _result(call_id: str, text: str, is_error: bool) -> Message:
    return Message("user", [ToolResultBlock(call_id, text, is_error=is_error)])


def build(ctx: StackContext) -> Output | None:
    """Only for agents with an output_schema (the final tool, in tool mode, is in the
    allowlist: agent/stack.py:StackConfig.for_agent)."""
    spec = OutputSpec.of(ctx.settings(OutputConfig), ctx.model)
    return None if spec is None else Output(spec)
