"""Initial schema: tenants, agents, sessions, runs, messages, tool_calls, run_events.

Revision ID: 0001_initial
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None
# schema compatibility (docs/operations.md): the oldest code this schema serves
serves_code_since = "0001_initial"

UUID = pg.UUID(as_uuid=False)


def _created() -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
    )


def upgrade() -> None:
    _tenants_agents_sessions()
    _runs()
    _history()


def _tenants_agents_sessions() -> None:
    op.create_table(
        "tenants",
        sa.Column("id", UUID, primary_key=True),
        sa.Column("name", sa.Text, nullable=False, unique=True),
        _created(),
    )
    op.create_table(
        "agents",
        sa.Column("id", UUID, primary_key=True),
        sa.Column("tenant_id", UUID, sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("model", sa.Text, nullable=False),
        sa.Column("system", pg.JSONB, nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column(
            "tools", pg.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{}'::text[]")
        ),
        sa.Column("config", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        _created(),
        sa.UniqueConstraint("tenant_id", "name", name="agents_tenant_name_key"),
    )
    op.create_table(
        "sessions",
        sa.Column("id", UUID, primary_key=True),
        sa.Column("tenant_id", UUID, sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("agent_id", UUID, sa.ForeignKey("agents.id"), nullable=False),
        _created(),
    )


def _runs() -> None:
    op.create_table(
        "runs",
        sa.Column("id", UUID, primary_key=True),
        sa.Column("tenant_id", UUID, sa.ForeignKey("tenants.id"), nullable=False),
        sa.Column("session_id", UUID, sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("agent_id", UUID, sa.ForeignKey("agents.id"), nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'queued'")),
        sa.Column("input", pg.JSONB, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("lost_count", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.Column("lease_owner", sa.Text),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True)),
        sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.text("false")),
        sa.Column("error", pg.JSONB),
        sa.Column("usage", pg.JSONB),
        sa.Column("trace_parent", sa.Text),
        _created(),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name="runs_status_check",
        ),
    )
    op.create_index(
        "runs_queued_idx", "runs", ["created_at"], postgresql_where=sa.text("status = 'queued'")
    )
    op.create_index(
        "runs_lease_idx",
        "runs",
        ["lease_expires_at"],
        postgresql_where=sa.text("status = 'running'"),
    )
    op.create_index("runs_session_idx", "runs", ["session_id"])
    op.create_index("runs_tenant_created_idx", "runs", ["tenant_id", "created_at"])


def _history() -> None:
    op.create_table(
        "messages",
        sa.Column("session_id", UUID, sa.ForeignKey("sessions.id"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("run_id", UUID, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("content", pg.JSONB, nullable=False),
        _created(),
    )
    op.create_index("messages_run_idx", "messages", ["run_id"])
    op.create_table(
        "tool_calls",
        sa.Column("run_id", UUID, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("tool_use_id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("result", pg.JSONB, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        _created(),
    )
    op.create_table(
        "run_events",
        sa.Column("run_id", UUID, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("type", sa.Text, nullable=False),
        sa.Column("payload", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("worker_id", sa.Text),
        sa.Column("attempt", sa.Integer),
        _created(),
    )


def downgrade() -> None:
    for table in ("run_events", "tool_calls", "messages", "runs", "sessions", "agents", "tenants"):
        op.drop_table(table)
