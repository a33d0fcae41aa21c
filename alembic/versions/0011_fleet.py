"""A fleet on one database: runs_running_session_idx for the claim's one-run-per-session check.

Revision ID: 0011_fleet
Revises: 0010_tenants

The claim skips a queued run whose session already has a running run. Without an
index on (session_id) of running runs, that check read every running run (through
runs_lease_idx) once per candidate: O(running) per candidate (docs/scaling.md).

Additive: code at 0010_tenants never relies on it. Downgrading drops it.
"""

import sqlalchemy as sa
from alembic import op

revision = "0011_fleet"
down_revision = "0010_tenants"
branch_labels = None
depends_on = None
serves_code_since = "0010_tenants"


def upgrade() -> None:
    op.create_index(
        "runs_running_session_idx",
        "runs",
        ["session_id"],
        postgresql_where=sa.text("status = 'running'"),
    )


def downgrade() -> None:
    op.drop_index("runs_running_session_idx", table_name="runs")
