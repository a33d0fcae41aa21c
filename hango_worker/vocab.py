"""The project's vocabulary, defined once: run statuses, how an attempt ends, error
types and tool-call outcomes.

Everything that names one of these — the schema's check constraint, the SQL, the
CLI's choices, the client, metrics labels, the docs' tables — takes it from here;
`tests/test_vocab.py` checks that the SQL, the code and the docs use no other word.
A leaf: it imports nothing from the package, so every layer may use it.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """`runs.status`."""

    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"  # suspended for a person (approval, question): no lease, no slot
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
# How one attempt ends: a final status, or handed back to the queue at shutdown.
RELEASED = "released"
ATTEMPT_ENDS = (*FINISHED, RELEASED, RunStatus.WAITING)


class ErrorType(StrEnum):
    """`runs.error.type`: why a run failed."""

    # the run itself
    MAX_TURNS = "max_turns"
    MAX_INPUT_TOKENS = "max_input_tokens"
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    MAX_COST_USD = "max_cost_usd"
    MAX_TOOL_CALLS = "max_tool_calls"
    TOOL_CALL_LIMIT = "tool_call_limit"
    DEADLINE = "deadline"
    MAX_TOKENS = "max_tokens"
    MAX_ATTEMPTS = "max_attempts"
    INVALID_INPUT = "invalid_input"
    INVALID_STATE = "invalid_state"
    INVALID_AGENT = "invalid_agent"
    INVALID_HISTORY = "invalid_history"
    INVALID_TOOL_RESULT = "invalid_tool_result"
    INVALID_ROW = "invalid_row"
    AGENT_NOT_FOUND = "agent_not_found"
    APPROVAL_TIMEOUT = "approval_timeout"
    INTERNAL_ERROR = "internal_error"
    CONTEXT_WINDOW_TOO_SMALL = "context_window_too_small"
    RATE_LIMIT_TOO_SMALL = "rate_limit_too_small"
    OUTPUT_INVALID = "output_invalid"  # the final answer broke output_schema twice
    BUDGET_EXHAUSTED = "budget_exhausted"  # a spend budget with on_exhausted: fail is spent
    BUDGET_UNPRICED = "budget_unpriced"  # a run under a spend budget, its model unpriced
    # the model stopped
    REFUSAL = "refusal"
    MODEL_CONTEXT_WINDOW_EXCEEDED = "model_context_window_exceeded"
    # the provider failed (after our retries, when retryable)
    INVALID_REQUEST_ERROR = "invalid_request_error"
    AUTHENTICATION_ERROR = "authentication_error"
    PERMISSION_ERROR = "permission_error"
    NOT_FOUND_ERROR = "not_found_error"
    REQUEST_TOO_LARGE = "request_too_large"
    BILLING_ERROR = "billing_error"
    RATE_LIMIT_ERROR = "rate_limit_error"
    API_ERROR = "api_error"
    OVERLOADED_ERROR = "overloaded_error"
    API_CONNECTION_ERROR = "api_connection_error"
    API_TIMEOUT_ERROR = "api_timeout_error"
    MALFORMED_STREAM = "malformed_stream"
    SCRIPT_EXHAUSTED = "script_exhausted"


# Model errors that say the request itself is wrong: retrying cannot help, even when
# they arrive as an `error` event mid-stream.
FATAL_MODEL_ERROR_TYPES = frozenset(
    {
        ErrorType.INVALID_REQUEST_ERROR,
        ErrorType.AUTHENTICATION_ERROR,
        ErrorType.PERMISSION_ERROR,
        ErrorType.NOT_FOUND_ERROR,
        ErrorType.REQUEST_TOO_LARGE,
        ErrorType.BILLING_ERROR,
    }
)
MODEL_ERROR_TYPES = FATAL_MODEL_ERROR_TYPES | {
    ErrorType.RATE_LIMIT_ERROR,
    ErrorType.API_ERROR,
    ErrorType.OVERLOADED_ERROR,
    ErrorType.API_CONNECTION_ERROR,
    ErrorType.API_TIMEOUT_ERROR,
    ErrorType.MALFORMED_STREAM,
    ErrorType.SCRIPT_EXHAUSTED,
}
RUN_ERROR_TYPES = frozenset(ErrorType) - MODEL_ERROR_TYPES


class ToolOutcome(StrEnum):
    """How a tool call ended (`hango_tool_calls_total{outcome}`)."""

    OK = "ok"
    ERROR = "error"  # the tool answered with an error
    INVALID_ARGUMENTS = "invalid_arguments"
    CRASHED = "crashed"
    BAD_RESULT = "bad_result"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    DENIED = "denied"  # a middleware refused it by policy (e.g. the allowlist)


class RunLimit(StrEnum):
    """A limit that ends a run early (`runs.limit_reached`, `hango_run_limits_total{limit}`).

    Reaching one ends the run with a wind-up answer, or fails it with the error type
    of the same name (agent config `on_limit`)."""

    MAX_TURNS = "max_turns"
    MAX_INPUT_TOKENS = "max_input_tokens"  # input + cache read + cache write, whole run
    MAX_OUTPUT_TOKENS = "max_output_tokens"
    MAX_COST_USD = "max_cost_usd"  # the run's cost at the model's prices
    MAX_TOOL_CALLS = "max_tool_calls"
    TOOL_CALL_LIMIT = "tool_call_limit"  # a call of a tool over its own limit was refused
    DEADLINE = "deadline"  # wall clock: max_duration_s after the run started, or a deadline


class Decision(StrEnum):
    """What a person (or the approval timeout) decided about a waiting run's call
    (`run_decisions.decision`)."""

    APPROVE = "approve"
    REJECT = "reject"
    ANSWER = "answer"
    TIMEOUT = "timeout"
