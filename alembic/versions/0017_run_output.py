"""Structured final answers: runs.output, and the producer view shows it.

Revision ID: 0017_run_output
Revises: 0016_content_blobs

- runs.output (jsonb, NULL): the final answer of a run whose agent has an
  `output_schema`, parsed and validated (agent/middlewares/output.py; docs/structured-output.md),
  written by the checkpoint that ends the run.
- hango_api.runs gains the column `output` at its end (docs/producers.md: within
  version 1 the view only grows at its end; CREATE OR REPLACE VIEW keeps its grants).

Both steps are catalog changes (a nullable column without a default rewrites nothing):
the lock on runs is held for an instant. Code at 0009 and later never reads the column
and its checkpoints leave it as it is, so it still runs on this schema. Downgrading puts
0009's view back (with its grant) and drops the column.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0017_run_output"
down_revision = "0016_content_blobs"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"


def _v1() -> ModuleType:
    """0009_producer_api's module: the view text this revision extends."""
    path = Path(__file__).with_name("0009_producer_api.py")
    spec = importlib.util.spec_from_file_location("hango_migration_0009", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"0017: 0009's view text changed; not found: {old!r}")
    return text.replace(old, new)


def _view_with_output(v1: ModuleType) -> str:
    text = _replace(v1.RUNS_VIEW, "CREATE VIEW", "CREATE OR REPLACE VIEW")
    return _replace(
        text, "    r.parent_run_id\nFROM runs r", "    r.parent_run_id,\n    r.output\nFROM runs r"
    )


def upgrade() -> None:
    op.add_column("runs", sa.Column("output", pg.JSONB))
    op.execute(_view_with_output(_v1()))


def downgrade() -> None:
    v1 = _v1()
    op.execute("DROP VIEW hango_api.runs")  # a view's columns cannot be dropped in place
    op.execute(v1.RUNS_VIEW)
    op.execute(v1.if_role(f"GRANT SELECT ON hango_api.runs TO {v1.ROLE}"))
    op.drop_column("runs", "output")
