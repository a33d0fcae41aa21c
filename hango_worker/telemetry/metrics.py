"""Prometheus metrics. Names follow Prometheus conventions; labels are bounded."""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from prometheus_client import Counter, Gauge, Histogram

from hango_worker.vocab import (
    ATTEMPT_ENDS,
    MODEL_ERROR_TYPES,
    RUN_ERROR_TYPES,
    Decision,
    RunLimit,
    ToolOutcome,
)

# GenAI semantic-convention bucket boundaries.
TOKEN_BUCKETS = [float(4**i) for i in range(14)]  # 1, 4, 16, ... 67108864
DURATION_BUCKETS = [0.01 * 2**i for i in range(14)]  # 0.01 ... 81.92 s
# A run is many model calls and tools: seconds to hours.
RUN_DURATION_BUCKETS = [1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0]
RUN_DURATION_BUCKETS += [3600.0, 7200.0, 14400.0, 28800.0, 86400.0]

# How a worker reports an attempt's end, and tool-call outcomes (hango_worker/vocab.py).
RUN_STATUSES = tuple(str(s) for s in ATTEMPT_ENDS)
TOOL_OUTCOMES = tuple(str(o) for o in ToolOutcome)

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
OFFLOADED_BYTES = Counter(
    "hango_offloaded_bytes_total",
    "UTF-8 bytes of tool results offloaded to run files by the filesystem middleware.",
)
# Memory writes (agent/middlewares/memory.py): command is one of the memory tool's five write
# commands; result ok | conflict (a newer version won) | rejected (a bad command: path,
# size, missing file…) | fenced (the worker lost the run's lease: nothing written) |
# failed (the store raised, e.g. the database went away: outcome unknown).
MEMORY_COMMANDS = ("create", "str_replace", "insert", "delete", "rename")
MEMORY_RESULTS = ("ok", "conflict", "rejected", "fenced", "failed")
MEMORY_WRITES = Counter(
    "hango_memory_writes_total",
    "Memory tool writes, by command and result.",
    ["command", "result"],
)
# load_skill calls (agent/middlewares/skills.py): result body (a skill's SKILL.md) | file (one of
# its files) | unknown_skill | unknown_file (a tool error). Skill names are not labels.
SKILL_LOAD_RESULTS = ("body", "file", "unknown_skill", "unknown_file")
# Content blocks stored once (run/blobs.py): blobs inlined when a run attempt loads.
BLOBS_LOADED = Counter(
    "hango_content_blobs_loaded_total", "Stored content blocks inlined when a run attempt loads."
)
BLOB_BYTES_LOADED = Counter(
    "hango_content_blob_bytes_loaded_total",
    "Bytes of stored content blocks read when run attempts load (once per attempt).",
)
BLOB_BYTES_STORED = Counter(
    "hango_content_blob_bytes_stored_total",
    "Bytes of tool results' large blocks (images, PDFs) stored once, by reference.",
)
# The Files API (provider/files.py): a stored block's file uploaded, an id reused, or a
# file the API no longer had uploaded again.
FILES_UPLOADED = Counter(
    "hango_files_uploaded_total",
    "Stored content blocks sent as Files API files, by outcome (uploaded, reused, reuploaded).",
    ["outcome"],
)
# MCP tool calls (tool/mcp_client.py), by server (an agent's configured name) and outcome:
# ok, error (the tool answered is_error), timeout, unavailable, failed (a protocol error).
MCP_CALLS = Counter(
    "hango_mcp_calls_total", "Calls to MCP servers' tools, by outcome.", ["server", "outcome"]
)
SKILL_LOADS = Counter("hango_skill_loads_total", "load_skill tool calls, by result.", ["result"])
# Compaction (agent/middlewares/summarize.py): rungs applied, and each request's size.
COMPACTION_RUNGS = ("clear_tool_results", "sliding_window", "summary")
COMPACTIONS = Counter(
    "hango_compactions_total", "Compaction rungs applied to a model request.", ["rung"]
)
CONTEXT_FRACTION_BUCKETS = [0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5]
CONTEXT_TOKENS = Histogram(
    "hango_context_tokens",
    "Input tokens of each model request as a fraction of the model's context window.",
    buckets=CONTEXT_FRACTION_BUCKETS,
)
TOOL_PARALLEL_CALLS = Histogram(
    "hango_tool_parallel_calls",
    "Tool calls run side by side in one group of a response's batch (groups of two or more).",
    buckets=[2, 3, 4, 6, 8, 12, 16, 24, 32, 64],
)
# Structured final answers (agent/middlewares/output.py): answers that broke the agent's
# output_schema, by which violation it was (1: told to the model, 2: the run failed).
OUTPUT_INVALID = Counter(
    "hango_output_invalid_total",
    "Final answers that did not match the agent's output_schema, by attempt (1 or 2).",
    ["attempt"],
)
RUNS_CLAIMED = Counter("hango_runs_claimed_total", "Runs claimed by this worker.")
RUNS_FINISHED = Counter(
    "hango_runs_finished_total", "Run attempts ended, by final status.", ["status"]
)
RUN_DURATION = Histogram(
    "hango_run_duration_seconds",
    "Wall time of one run attempt, claim to end.",
    ["status"],
    buckets=RUN_DURATION_BUCKETS,
)
LEASE_RECLAIMS = Counter(
    "hango_lease_reclaims_total", "Runs whose lease expired and were put back in the queue."
)
LEASE_LOST = Counter(
    "hango_lease_lost_total", "Run attempts abandoned because another worker took the lease."
)
STREAM_UNKNOWN_DELTAS = Counter(
    "hango_stream_unknown_deltas_total",
    "Stream deltas of a type this worker does not know, merged into their block by the "
    "rule every known delta follows (provider/accumulate.py).",
)
CANCEL_HINTS = Counter(
    "hango_cancel_hints_total",
    "hango_cancel notifications about a run this worker holds, by what the run's row "
    "said: acted (cancel_requested was set), ignored (it was not: a NOTIFY alone "
    "carries no authority), unchecked (the database did not answer).",
    ["result"],
)
RUNS_HANDED_BACK = Counter(
    "hango_runs_handed_back_total",
    "Runs a stopping worker cancelled mid-turn (past the shutdown grace) and handed back "
    "to the queue at once instead of letting their lease expire.",
)
RETENTION_ROWS_REMOVED = Counter(
    "hango_retention_rows_removed_total",
    "Rows the retention passes of this worker deleted, by table.",
    ["table"],
)
RETENTION_OLDEST_RUN = Gauge(
    "hango_retention_oldest_run_seconds",
    "Age of the oldest finished run kept, after this worker's last retention pass.",
)
QUEUE_DEPTH = Gauge("hango_queue_depth", "Runs waiting in status queued.")
QUEUE_CLAIMABLE = Gauge(
    "hango_queue_claimable",
    "Queued runs a worker could claim now: the claim's rules, within tenant and agent "
    "max_running (not waiting runs, runs of a tenant at its limit, runs of a busy session).",
)
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
CHECKPOINT_BATCH = Histogram(
    "hango_checkpoint_batch_size",
    "Fenced writes (checkpoints, finishes, tool results) per group commit: one transaction.",
    buckets=[1, 2, 4, 8, 16, 32, 64],
)
CHECKPOINTS_MERGED = Counter(
    "hango_checkpoints_merged_total",
    "Checkpoints that shared one statement with other runs' in a group commit.",
)
GROUP_COMMIT_SPLITS = Counter(
    "hango_group_commit_splits_total",
    "Group commits rolled back by one statement's error and sent again one write each.",
)
RUNS_IN_FLIGHT = Gauge("hango_runs_in_flight", "Runs this worker is executing now.")
WORKER_SLOTS = Gauge(
    "hango_worker_slots",
    "Run slots of this worker: state=total (HANGO_WORKER_CONCURRENCY) and state=used.",
    ["state"],
)
SCHEMA_SERVED = Gauge(
    "hango_schema_served",
    "1 while the database's schema serves this worker's code; 0: it claims nothing "
    "(the reason is /readyz's body and a log line a minute).",
)
BUILD_INFO = Gauge("hango_build_info", "Always 1; the running version in its label.", ["version"])
MODEL_RETRIES = Counter(
    "hango_model_retries_total",
    "Model call attempts that failed with a retryable error and were retried.",
    ["error_type"],
)
MODEL_SDK_RETRIES = Counter(
    "hango_model_sdk_retries_total",
    "HTTP attempts the anthropic SDK retried by itself within one model call "
    "(408/409/429/5xx, connection failures), by the failed attempt's error type.",
    ["error_type"],
)
MODEL_FAILURES = Counter(
    "hango_model_failures_total",
    "Model calls that failed for good: not retryable, or still failing after every retry.",
    ["error_type"],
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
RUNS_WAITING = Gauge(
    "hango_runs_waiting", "Runs waiting for a person (approval or answer); global."
)
WAITING_OLDEST = Gauge(
    "hango_runs_waiting_oldest_seconds",
    "How long the longest-waiting run has waited for a decision; global.",
)
RUNS_SUSPENDED = Counter(
    "hango_runs_suspended_total",
    "Attempts that ended waiting for a person, by what they wait for.",
    ["reason"],
)
HITL_DECISIONS = Counter(
    "hango_hitl_decisions_total",
    "Decisions applied to a resumed run's call: approve, reject, answer, timeout.",
    ["decision"],
)
APPROVAL_TIMEOUTS = Counter(
    "hango_approval_timeouts_total",
    "Waiting runs past their approval timeout, by what followed: queued (the call "
    "rejected) or failed.",
    ["status"],
)
RUN_LIMITS = Counter(
    "hango_run_limits_total",
    "Runs that reached a limit (max_turns, …), by limit and by what followed: "
    "answer (one last tool-free call) or fail.",
    ["limit", "on_limit"],
)
MODEL_COST = Counter(
    "hango_model_cost_usd",
    "Model spend in USD at list prices (HANGO_MODEL_PRICES), per response.",
    ["gen_ai_request_model"],
)
MODEL_PRICE_UNKNOWN = Counter(
    "hango_model_price_unknown",
    "Run attempts whose model has no price: their cost is unknown, not counted above.",
    ["gen_ai_request_model"],
)
MODEL_UNPRICED_UNITS = Counter(
    "hango_model_unpriced_units",
    "Responses with a unit that has no price (unit: service_tier=priority, "
    "server_tool_use.<counter>, …): their run's cost is unknown, not counted above.",
    ["gen_ai_request_model", "unit"],
)
SERVER_TOOL_UNITS = Counter(
    "hango_model_server_tool_units",
    "Server-tool units the API reported (usage.server_tool_use), by counter.",
    ["gen_ai_request_model", "unit"],
)
MODEL_RESPONSES_BY_TIER = Counter(
    "hango_model_responses_by_tier",
    "Responses by the service tier the API reported (usage.service_tier).",
    ["gen_ai_request_model", "service_tier"],
)
MODEL_STOPS = Counter(
    "hango_model_stops",
    "Responses that stopped for a reason the loop handles apart (pause_turn, refusal, "
    "max_tokens mid-tool call, model_context_window_exceeded), by what followed.",
    ["stop_reason", "then"],
)
RUNS_FAILED = Counter(
    "hango_runs_failed_total", "Runs that ended failed, by error type.", ["error_type"]
)

# Error types are bounded: known ones (hango_worker/vocab.py ErrorType) keep their name,
# anything else is "other".
KNOWN_ERROR_TYPES = MODEL_ERROR_TYPES | RUN_ERROR_TYPES

# The run console (`hango-worker console`, its own process and /metrics).
CONSOLE_REQUESTS = Counter(
    "hango_console_requests_total",
    "Console requests, by route (its template) and status code.",
    ["route", "code"],
)
CONSOLE_DECISIONS = Counter(
    "hango_console_decisions_total",
    "Decisions made in the console and recorded (approve, reject, answer).",
    ["decision"],
)


M = TypeVar("M", Counter, Gauge, Histogram)
_children: dict[tuple[int, tuple[str, ...]], Any] = {}


def child(metric: M, *labels: str) -> M:
    """`metric.labels(*labels)`, looked up once per label set (prometheus_client's
    `labels` validates the values and takes a lock on every call; the hot path calls it
    about 15 times per run). Label sets are bounded, so is this cache."""
    key = (id(metric), labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


def error_type_label(error_type: object) -> str:
    return str(error_type) if error_type in KNOWN_ERROR_TYPES else "other"


def set_slots(used: int, total: int) -> None:
    RUNS_IN_FLIGHT.set(used)
    _slots_used.set(used)
    _slots_total.set(total)


_slots_used = WORKER_SLOTS.labels("used")
_slots_total = WORKER_SLOTS.labels("total")


def init_tool_series(tool_names: Iterable[str]) -> None:
    """Tool-call series at 0 for every registered tool (a worker calls this at start)."""
    for name in tool_names:
        for outcome in TOOL_OUTCOMES:
            TOOL_CALLS.labels(name, outcome)


def _package_version() -> str:
    try:
        return version("hango-worker")
    except PackageNotFoundError:
        return "unknown"


def _initialise() -> None:
    """Every known label value exists at 0 from the start: panels show 0, not "No data",
    and ratio alerts see their denominators before the first event."""
    BUILD_INFO.labels(_package_version()).set(1)
    for status in RUN_STATUSES:
        RUNS_FINISHED.labels(status)
        RUN_DURATION.labels(status)
    for etype in sorted(KNOWN_ERROR_TYPES | {"other"}):
        RUNS_FAILED.labels(etype)
    for etype in sorted(MODEL_ERROR_TYPES | {"other"}):
        MODEL_RETRIES.labels(etype)
        MODEL_SDK_RETRIES.labels(etype)
        MODEL_FAILURES.labels(etype)
    for state in ("used", "total"):
        WORKER_SLOTS.labels(state)
    for reason in ("approval", "question", "children", "budget"):
        RUNS_SUSPENDED.labels(reason)
    for decision in Decision:
        HITL_DECISIONS.labels(decision)
    for status in ("queued", "failed"):
        APPROVAL_TIMEOUTS.labels(status)
    for limit in RunLimit:
        for then in ("answer", "fail"):
            RUN_LIMITS.labels(limit, then)
    for command in MEMORY_COMMANDS:
        for result in MEMORY_RESULTS:
            MEMORY_WRITES.labels(command, result)
    for rung in COMPACTION_RUNGS:
        COMPACTIONS.labels(rung)
    for result in SKILL_LOAD_RESULTS:
        SKILL_LOADS.labels(result)


_initialise()

# Tenants and fleet-wide rate limits (docs/operations.md "Tenants, fairness and limits").
# Labels: a tenant's name, a rate_limits key: both set by the operator, so bounded.
TENANT_RUNNING = Gauge(
    "hango_tenant_running_runs",
    "Runs running now, per tenant, fleet-wide (refreshed by each worker's sweep).",
    ["tenant"],
)
RATE_LIMIT_WAIT_BUCKETS = [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
RATE_LIMIT_WAIT = Histogram(
    "hango_rate_limit_wait_seconds",
    "Time a model call waited for the fleet-wide rate limit, per rate_limits key.",
    ["key"],
    buckets=RATE_LIMIT_WAIT_BUCKETS,
)
RATE_LIMIT_INVALID = Counter(
    "hango_rate_limit_invalid_total",
    "Model calls that found their rate_limits row unusable (hand-edited), per key.",
    ["key"],
)
RATE_LIMIT_TOO_SMALL = Counter(
    "hango_rate_limit_too_small_total",
    "Runs failed because a call needed more input tokens than the key's whole bucket.",
    ["key"],
)
RATE_LIMITED_CALLS = Counter(
    "hango_rate_limited_calls_total",
    "Model calls the provider answered 429 despite the fleet-wide limiter, per key.",
    ["key"],
)

# Spend budgets (run/budget.py; docs/operations.md "Spend budgets"). Labels: the tenant's
# and agent's names ("" for a tenant-wide budget) and the period: set by the operator.
BUDGET_LABELS = ["tenant", "agent", "period"]
BUDGET_LIMIT = Gauge(
    "hango_budget_limit_usd", "A spend budget's limit in USD (sweep).", BUDGET_LABELS
)
BUDGET_SPENT = Gauge(
    "hango_budget_spent_usd",
    "USD a budget spent in its current window (UTC day or month; sweep).",
    BUDGET_LABELS,
)
BUDGET_RESERVED = Gauge(
    "hango_budget_reserved_usd",
    "USD the model calls in flight hold on a budget (their worst case; sweep).",
    BUDGET_LABELS,
)
BUDGET_WAITING = Gauge(
    "hango_budget_waiting_runs", "Runs waiting for a budget to have room (sweep).", BUDGET_LABELS
)
BUDGET_EXHAUSTED = Counter(
    "hango_budget_exhausted_total",
    "Model calls refused by a spent budget, per tenant and what the run did (wait | fail).",
    ["tenant", "action"],
)
BUDGET_HOLDS_RELEASED = Counter(
    "hango_budget_holds_released_total",
    "Reservations of calls whose attempt no longer runs, given back by the sweep.",
)
