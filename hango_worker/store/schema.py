"""The schema's single source: SQLAlchemy Core metadata.

Alembic migrates the database to it and tests/test_migrations.py checks that
`alembic upgrade head` leaves no difference. The hot path does not query
through SQLAlchemy (see store/sql.py for why).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Float,
    ForeignKey,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID

from hango_worker.vocab import Decision, RunStatus

# Not tables, so not in this metadata: the producer SQL API (schema hango_api, its
# functions and view, the functions hango_enqueue_run / hango_run_input /
# hango_tenant_id, the role hango_producer) is created by migration 0009_producer_api
# (docs/producers.md); tests/test_producer_api.py pins its signatures and columns.
metadata = MetaData()

RUN_STATUSES = tuple(str(s) for s in RunStatus)


def _now() -> Column[object]:
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now())


_H = "[0-9a-fA-F]"
NOT_UUID = f"^{_H}{{8}}-{_H}{{4}}-{_H}{{4}}-{_H}{{4}}-{_H}{{12}}$"  # the shape of a UUID

tenants = Table(
    "tenants",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("name", Text, nullable=False, unique=True),
    _now(),
    # fair claiming and limits (docs/operations.md "Tenants, fairness and limits"):
    # the tenant's share of each claim, and its runs running at once (NULL: no limit)
    Column("weight", Integer, nullable=False, server_default=text("1")),
    Column("max_running", Integer),
    CheckConstraint("weight BETWEEN 1 AND 1000", name="tenants_weight_check"),
    CheckConstraint("max_running >= 0", name="tenants_max_running_check"),
    # names and ids never mix (migration 0012; NOT VALID there: old rows are kept)
    CheckConstraint(f"name !~ '{NOT_UUID}'", name="tenants_name_not_uuid"),
)

agents = Table(
    "agents",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), ForeignKey("tenants.id"), nullable=False),
    Column("name", Text, nullable=False),
    Column("model", Text, nullable=False),
    Column("system", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("tools", ARRAY(Text), nullable=False, server_default=text("'{}'::text[]")),
    Column("config", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _now(),
    UniqueConstraint("tenant_id", "name", name="agents_tenant_name_key"),
    # the agent's runs running at once, fleet-wide (NULL: no limit)
    Column("max_running", Integer),
    CheckConstraint("max_running >= 0", name="agents_max_running_check"),
    CheckConstraint(f"name !~ '{NOT_UUID}'", name="agents_name_not_uuid"),
)

sessions = Table(
    "sessions",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), ForeignKey("tenants.id"), nullable=False),
    Column("agent_id", UUID(as_uuid=False), ForeignKey("agents.id"), nullable=False),
    _now(),
)

runs = Table(
    "runs",
    metadata,
    Column("id", UUID(as_uuid=False), primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), ForeignKey("tenants.id"), nullable=False),
    Column("session_id", UUID(as_uuid=False), ForeignKey("sessions.id"), nullable=False),
    Column("agent_id", UUID(as_uuid=False), ForeignKey("agents.id"), nullable=False),
    Column("status", Text, nullable=False, server_default=text("'queued'")),
    Column("input", JSONB, nullable=False),
    Column("state_json", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("attempt", Integer, nullable=False, server_default=text("0")),
    # lease expiries (worker lost) since the run last made progress (a model turn
    # committed); reset by resume
    Column("lost_count", Integer, nullable=False, server_default=text("0")),
    Column("lease_owner", Text),
    Column("lease_expires_at", DateTime(timezone=True)),
    Column("cancel_requested", Boolean, nullable=False, server_default=text("false")),
    Column("error", JSONB),
    Column("usage", JSONB),
    Column("trace_parent", Text),
    _now(),
    # when the run last entered the queue (enqueue, resume, release, reclaim): queue age
    # and queue wait are measured from it, not from created_at
    Column("queued_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    # a producer's key: a second enqueue with the same key (same tenant) returns the first run
    Column("idempotency_key", Text),
    Column("started_at", DateTime(timezone=True)),
    Column("finished_at", DateTime(timezone=True)),
    # which limit ended the run with a wind-up answer (e.g. 'max_turns'); NULL otherwise
    Column("limit_reached", Text),
    # a waiting run (suspended for a person): the call it waits on, the calls of its
    # batch not started yet, the timeout rule; since when, and until when (timeout)
    Column("waiting_for", JSONB),
    Column("waiting_since", DateTime(timezone=True)),
    Column("waiting_until", DateTime(timezone=True)),
    # a child run (a subagent): its parent and the parent's `task` call; depth 0 for
    # a run a producer enqueued
    Column("parent_run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="SET NULL")),
    Column("parent_tool_use_id", Text),
    Column("depth", Integer, nullable=False, server_default=text("0")),
    # within its tenant, a run of higher priority is claimed first (then the oldest)
    Column("priority", Integer, nullable=False, server_default=text("0")),
    # a run of an agent with an output_schema: its final answer, parsed and validated
    # (agent/middlewares/output.py); NULL otherwise
    Column("output", JSONB),
    # claims that ended in a hand-back by a stopping worker (not lost, not a failure):
    # the attempts that count are attempt - handed_back (migration 0018)
    Column("handed_back", Integer, nullable=False, server_default=text("0")),
    CheckConstraint("priority BETWEEN 0 AND 1000", name="runs_priority_check"),
    CheckConstraint(
        "status IN (" + ", ".join(f"'{s}'" for s in RUN_STATUSES) + ")",
        name="runs_status_check",
    ),
    Index("runs_queued_idx", "created_at", postgresql_where=text("status = 'queued'")),
    Index("runs_lease_idx", "lease_expires_at", postgresql_where=text("status = 'running'")),
    Index("runs_session_idx", "session_id"),
    Index(
        "runs_parent_call_idx",
        "parent_run_id",
        "parent_tool_use_id",
        unique=True,
        postgresql_where=text("parent_run_id IS NOT NULL"),
    ),
    Index("runs_waiting_idx", "waiting_until", postgresql_where=text("status = 'waiting'")),
    Index("runs_tenant_created_idx", "tenant_id", "created_at"),
    Index(
        "runs_idempotency_key_idx",
        "tenant_id",
        "idempotency_key",
        unique=True,
        postgresql_where=text("idempotency_key IS NOT NULL"),
    ),
)

# The claim's indexes (store/sql.py CLAIM): each tenant's head of queue, and a limited
# tenant's (agent's) running runs.
Index(
    "runs_tenant_queue_idx",
    runs.c.tenant_id,
    runs.c.priority.desc(),
    runs.c.created_at,
    postgresql_where=text("status = 'queued'"),
)
Index(
    "runs_tenant_running_idx",
    runs.c.tenant_id,
    runs.c.agent_id,
    postgresql_where=text("status = 'running'"),
)

messages = Table(
    "messages",
    metadata,
    # the run's session (no foreign key of its own since 0011: run_id's implies it)
    Column("session_id", UUID(as_uuid=False), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    ),
    Column("role", Text, nullable=False),
    Column("content", JSONB, nullable=False),
    _now(),
    Index("messages_run_idx", "run_id"),
)

tool_calls = Table(
    "tool_calls",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("tool_use_id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("result", JSONB, nullable=False),
    Column("attempt", Integer, nullable=False),
    _now(),
    # the seq of the assistant message that made the call. A model may reuse a
    # tool_use id in a later turn: the row is a resume journal, so the later call's
    # result replaces it, and a resume uses a row only for the very turn that made
    # it. NULL: written by code older than this column (matches any turn).
    Column("message_seq", Integer),
)

run_events = Table(
    "run_events",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("seq", Integer, primary_key=True),
    Column("type", Text, nullable=False),
    Column("payload", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    Column("worker_id", Text),
    Column("attempt", Integer),
    _now(),
)

# Files of a run (docs/design.md §12): tool results offloaded by the Filesystem
# middleware and files the agent writes, each written inside the fenced commit of
# the tool result that produced it; removed with the run.
run_files = Table(
    "run_files",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("path", Text, primary_key=True),
    Column("content", Text, nullable=False),
    Column("size", Integer, nullable=False),  # bytes of content in UTF-8
    Column("tool_use_id", Text),  # the call whose result (or write) produced it
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# A person's decision about a waiting run's call (or the approval timeout's), for the
# pending turn (`message_seq`, the assistant message that made the call).
run_decisions = Table(
    "run_decisions",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("message_seq", Integer, primary_key=True),
    Column("tool_use_id", Text, primary_key=True),
    Column("decision", Text, nullable=False),
    Column("input", JSONB),  # approve with edited arguments
    Column("text", Text),  # a reject's reason or an answer
    Column("decided_by", Text),
    _now(),
    CheckConstraint(
        "decision IN (" + ", ".join(f"'{d}'" for d in Decision) + ")",
        name="run_decisions_decision_check",
    ),
)

# Long-term memory (docs/design.md §12): files under /memories that outlive runs,
# scoped within the tenant to an agent: the whole agent (scope 'agent', scope_key ''),
# one session ('session', the session id) or a caller-given key ('key', e.g. an end
# user). `version` is optimistic concurrency: every write names the version it read.
# Each write is its own fenced statement (store/sql.py MEMORY_*); `run_id` and
# `tool_use_id` name the last writer (provenance; the run may since be gc'd).
MEMORY_SCOPES = ("agent", "session", "key")

memories = Table(
    "memories",
    metadata,
    Column("tenant_id", UUID(as_uuid=False), ForeignKey("tenants.id"), primary_key=True),
    Column("agent_id", UUID(as_uuid=False), ForeignKey("agents.id"), primary_key=True),
    Column("scope", Text, primary_key=True),
    Column("scope_key", Text, primary_key=True),
    Column("path", Text, primary_key=True),
    Column("content", Text, nullable=False),
    Column("size", Integer, nullable=False),  # bytes of content in UTF-8
    Column("version", Integer, nullable=False, server_default=text("1")),
    Column("run_id", UUID(as_uuid=False)),
    Column("tool_use_id", Text),
    _now(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(
        "scope IN (" + ", ".join(f"'{s}'" for s in MEMORY_SCOPES) + ")",
        name="memories_scope_check",
    ),
)

# The run's state_json at the end of a turn (after its tool calls), kept only when it
# changed since the last one kept, written in the turn's checkpoint: what a fork
# from that turn starts with (store/fork.py).
run_states = Table(
    "run_states",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("turn", Integer, primary_key=True),
    Column("state_json", JSONB, nullable=False),
    _now(),
)

# Agent Skills registered per tenant (`hango-worker skills add PATH`): SKILL.md's front
# matter (name, description) and body, its other files; a new add is a new version.
skills = Table(
    "skills",
    metadata,
    Column("tenant_id", UUID(as_uuid=False), ForeignKey("tenants.id"), primary_key=True),
    Column("name", Text, primary_key=True),
    Column("version", Integer, primary_key=True),
    Column("description", Text, nullable=False),
    Column("body", Text, nullable=False),
    Column("files", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    _now(),
)

# Fleet-wide model rate limits (run/ratelimit.py): one token bucket per provider key or
# model. A NULL limit is no limit; the buckets refill continuously; `blocked_until` is
# set from the provider's retry-after when a 429 gets through anyway.
rate_limits = Table(
    "rate_limits",
    metadata,
    Column("key", Text, primary_key=True),
    Column("requests_per_minute", Integer),
    Column("input_tokens_per_minute", Integer),
    Column("output_tokens_per_minute", Integer),
    # a bucket holds at most `limit * window_s / 60` (60: a minute's worth, like the API)
    Column("window_s", Float, nullable=False, server_default=text("60")),
    Column("requests", Float, nullable=False, server_default=text("0")),
    Column("input_tokens", Float, nullable=False, server_default=text("0")),
    Column("output_tokens", Float, nullable=False, server_default=text("0")),
    Column("refilled_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("blocked_until", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(
        "requests_per_minute > 0 AND input_tokens_per_minute > 0 "
        "AND output_tokens_per_minute > 0 AND window_s > 0",
        name="rate_limits_positive_check",
    ),
)

# Spend budgets (run/budget.py, store/budgets.py): USD per tenant (agent_id NULL) or
# agent, per UTC day or month; `reserved_usd` is what calls in flight hold (one
# budget_holds row per call, released by the sweep once its attempt no longer runs).
budgets = Table(
    "budgets",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column(
        "tenant_id",
        UUID(as_uuid=False),
        ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("agent_id", UUID(as_uuid=False), ForeignKey("agents.id", ondelete="CASCADE")),
    Column("period", Text, nullable=False),
    Column("limit_usd", Float, nullable=False),
    Column("on_exhausted", Text, nullable=False, server_default=text("'wait'")),
    Column("window_start", DateTime(timezone=True), nullable=False),
    Column("spent_usd", Float, nullable=False, server_default=text("0")),
    Column("reserved_usd", Float, nullable=False, server_default=text("0")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("period IN ('day', 'month')", name="budgets_period_check"),
    CheckConstraint("on_exhausted IN ('wait', 'fail')", name="budgets_on_exhausted_check"),
    CheckConstraint(
        "limit_usd >= 0 AND limit_usd < 'Infinity'::float8", name="budgets_limit_check"
    ),
    # the workers' bookkeeping: finite and not negative (a hand edit to NaN would stall waits)
    CheckConstraint(
        "spent_usd >= 0 AND spent_usd < 'Infinity'::float8 "
        "AND reserved_usd >= 0 AND reserved_usd < 'Infinity'::float8",
        name="budgets_levels_check",
    ),
)
Index(
    "budgets_scope_idx",
    budgets.c.tenant_id,
    text("coalesce(agent_id, '00000000-0000-0000-0000-000000000000'::uuid)"),
    budgets.c.period,
    unique=True,
)

budget_holds = Table(
    "budget_holds",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("run_id", UUID(as_uuid=False), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("budget_ids", ARRAY(BigInteger), nullable=False),
    Column("amount_usd", Float, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

# Content blocks stored once (migration 0016, docs/inputs-and-outputs.md): the bytes of a
# large base64 source (an image, a PDF) by tenant and sha256; history holds a reference
# (`source.hango_blob`). `run_blobs` says which runs refer to which blobs: a fork copies
# these rows, never the bytes; gc deletes a blob when no run refers to it any more.
blobs = Table(
    "blobs",
    metadata,
    Column("tenant_id", UUID(as_uuid=False), primary_key=True),
    Column("sha256", LargeBinary, primary_key=True),
    Column("media_type", Text, nullable=False),
    Column("size", Integer, nullable=False),
    Column("data", LargeBinary, nullable=False),
    _now(),
)

run_blobs = Table(
    "run_blobs",
    metadata,
    Column(
        "run_id", UUID(as_uuid=False), ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
    ),
    Column("sha256", LargeBinary, primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), nullable=False),
    ForeignKeyConstraint(
        ["tenant_id", "sha256"], ["blobs.tenant_id", "blobs.sha256"], name="run_blobs_blob_fkey"
    ),
    Index("run_blobs_blob_idx", "tenant_id", "sha256"),
)

# The Files API file a stored block was uploaded as (migration 0019, docs/inputs-and-
# outputs.md "Files API"), per tenant, sha256 and account (a digest of the endpoint and
# API key it was uploaded with); it goes with its blob.
blob_files = Table(
    "blob_files",
    metadata,
    Column("tenant_id", UUID(as_uuid=False), primary_key=True),
    Column("sha256", LargeBinary, primary_key=True),
    Column("account", Text, primary_key=True),
    Column("file_id", Text, nullable=False),
    Column("uploaded_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    ForeignKeyConstraint(
        ["tenant_id", "sha256"],
        ["blobs.tenant_id", "blobs.sha256"],
        name="blob_files_blob_fkey",
        ondelete="CASCADE",
    ),
)

# Retention policies (migration 0020, store/retention.py): the fleet default (tenant_id
# and agent_id NULL), a tenant's, or an agent's override. Durations in seconds; NULL
# falls through to the wider scope, and NULL everywhere keeps that kind forever.
_ZERO = "'00000000-0000-0000-0000-000000000000'::uuid"
RETENTION_KINDS = ("runs", "events", "files", "sessions", "memories")

retention = Table(
    "retention",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("tenant_id", UUID(as_uuid=False), ForeignKey("tenants.id", ondelete="CASCADE")),
    Column("agent_id", UUID(as_uuid=False), ForeignKey("agents.id", ondelete="CASCADE")),
    *(Column(f"{k}_s", BigInteger) for k in RETENTION_KINDS),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint(
        " AND ".join(f"({k}_s IS NULL OR {k}_s >= 0)" for k in RETENTION_KINDS),
        name="retention_durations_check",
    ),
    CheckConstraint(
        "agent_id IS NULL OR tenant_id IS NOT NULL", name="retention_agent_tenant_check"
    ),
    Index(
        "retention_scope_idx",
        text(f"coalesce(tenant_id, {_ZERO})"),
        text(f"coalesce(agent_id, {_ZERO})"),
        unique=True,
    ),
)
