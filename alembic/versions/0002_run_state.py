"""runs.state_json: the run's typed state (todos, middleware private state).

Revision ID: 0002_run_state
Revises: 0001_initial

Holds Todos and serialisable middleware state so a resumed run keeps its plan.
Downgrading this one step drops it.
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0002_run_state"
down_revision = "0001_initial"
branch_labels = None
depends_on = None
# schema compatibility (docs/operations.md): additive, so code at 0001_initial (which never
# reads runs.state_json; its inserts get the default) still runs on it
serves_code_since = "0001_initial"


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column("state_json", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    )


def downgrade() -> None:
    op.drop_column("runs", "state_json")
