"""Prometheus metrics. Names follow Prometheus conventions; labels are bounded."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

# GenAI semantic-convention bucket boundaries.
TOKEN_BUCKETS = [float(4**i) for i in range(14)]  # 1, 4, 16, ... 67108864
DURATION_BUCKETS = [0.01 * 2**i for i in range(14)]  # 0.01 ... 81.92 s

MW_BEFORE_RUN = Histogram(
    "hango_middleware_before_run_duration_seconds",
    "Time spent in each middleware's before_run hook.",
    ["middleware"],
)
MW_SHORT_CIRCUITS = Counter(
    "hango_middleware_tool_short_circuits_total",
    "Tool calls answered by a middleware without executing the tool.",
    ["middleware"],
)
MW_REPEAT_BLOCKED = Counter(
    "hango_middleware_repeat_blocked_total",
    "Identical tool calls blocked by the repeat-call middleware.",
    ["gen_ai_tool_name"],
)
RUNS_CLAIMED = Counter("hango_runs_claimed_total", "Runs claimed by this worker.")
RUNS_FINISHED = Counter(
    "hango_runs_finished_total", "Run attempts ended, by final status.", ["status"]
)
RUN_DURATION = Histogram(
    "hango_run_duration_seconds",
    "Wall time of one run attempt, claim to end.",
    ["status"],
    buckets=DURATION_BUCKETS,
)
LEASE_RECLAIMS = Counter(
    "hango_lease_reclaims_total", "Runs whose lease expired and were put back in the queue."
)
LEASE_LOST = Counter(
    "hango_lease_lost_total", "Run attempts abandoned because another worker took the lease."
)
QUEUE_DEPTH = Gauge("hango_queue_depth", "Runs waiting in status queued.")
QUEUE_OLDEST_AGE = Gauge(
    "hango_queue_oldest_age_seconds",
    "How long the oldest queued run has waited since it was (re)queued.",
)
QUEUE_WAIT_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600]
QUEUE_WAIT = Histogram(
    "hango_queue_wait_seconds",
    "Time a run waited in the queue, from enqueue (or resume, release, reclaim) to claim.",
    buckets=[*QUEUE_WAIT_BUCKETS, 7200, 21600],
)
RUNS_IN_FLIGHT = Gauge("hango_runs_in_flight", "Runs this worker is executing now.")
MODEL_RETRIES = Counter(
    "hango_model_retries_total", "Model calls retried after a retryable error.", ["error_type"]
)
TOOL_CALLS = Counter(
    "hango_tool_calls_total", "Tool calls completed, by outcome.", ["gen_ai_tool_name", "outcome"]
)
GENAI_DURATION = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "GenAI operation duration.",
    ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "error_type"],
    buckets=DURATION_BUCKETS,
)
GENAI_TOKENS = Histogram(
    "gen_ai_client_token_usage",
    "Tokens used per GenAI operation.",
    ["gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_token_type"],
    buckets=TOKEN_BUCKETS,
)
MODEL_TOKENS = Counter(
    "hango_model_tokens_total",
    "Model tokens by type (input excludes cache; cache hit ratio = cache_read / all input).",
    ["type"],
)
RUNS_FAILED = Counter(
    "hango_runs_failed_total", "Runs that ended failed, by error type.", ["error_type"]
)

# error types are bounded: known ones keep their name, anything else is "other"
KNOWN_ERROR_TYPES = frozenset(
    {
        "max_turns",
        "max_tokens",
        "max_attempts",
        "invalid_state",
        "invalid_agent",
        "invalid_history",
        "invalid_input",
        "invalid_tool_result",
        "invalid_row",
        "agent_not_found",
        "internal_error",
        "refusal",
        "model_context_window_exceeded",
        "script_exhausted",
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
        "connection_error",
        "timeout_error",
    }
)


def error_type_label(error_type: object) -> str:
    return str(error_type) if error_type in KNOWN_ERROR_TYPES else "other"
