"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from alembic import op
import sqlalchemy as sa
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None
# schema compatibility (docs/operations.md "Upgrades and rollback"): the oldest code
# revision that still works on this schema. Additive (expand) → the previous revision;
# dropping or renaming what older code uses (contract) → this revision.
serves_code_since = ${repr(up_revision)}


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
