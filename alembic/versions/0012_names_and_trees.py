"""Names and ids never mix; run trees are cycle-safe.

Revision ID: 0012_names_and_trees
Revises: 0011_messages_session_fk

- A tenant or an agent may not be named like a UUID (`tenants_name_not_uuid`,
  `agents_name_not_uuid`: CHECK ... NOT VALID, so a database that already holds such a
  name still migrates; `hango-worker migrate` then lists them), and
  `hango_tenant_id(tenant)` reads a UUID-shaped argument as an id only and anything else
  as a name only. Before, a name was tried first: a tenant named like another tenant's
  id took over every call that named that tenant by its id.
- `hango_api.cancel` walks the run tree with cycle detection: a parent cycle (possible
  only through SQL) made it recurse forever.

Compatible both ways: the functions keep their signatures and grants; code at 0009 reads
nothing this changes. Downgrading restores 0009's functions and drops the checks.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0012_names_and_trees"
down_revision = "0011_messages_session_fk"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"

UUID_SHAPED = "'^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'"


def _v1() -> ModuleType:
    """0009_producer_api's module: the function texts this revision changes."""
    path = Path(__file__).with_name("0009_producer_api.py")
    spec = importlib.util.spec_from_file_location("hango_migration_0009", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"0012: 0009's function text changed; not found: {old!r}")
    return text.replace(old, new)


def _or_replace(text: str) -> str:
    return _replace(text, "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


def _tenant_id(v1: ModuleType) -> str:
    return _replace(
        _or_replace(v1.TENANT_ID),
        """    SELECT x.id INTO t FROM tenants x WHERE x.name = tenant OR x.id::text = lower(tenant)
        ORDER BY x.name = tenant DESC LIMIT 1;""",
        f"""    IF tenant ~ {UUID_SHAPED} THEN  -- an id, never a name (no name looks like one)
        SELECT x.id INTO t FROM tenants x WHERE x.id = tenant::uuid;
    ELSE
        SELECT x.id INTO t FROM tenants x WHERE x.name = tenant;
    END IF;""",
    )


def _cancel(v1: ModuleType) -> str:
    text = _replace(
        _or_replace(v1.API_CANCEL),
        "UNION ALL SELECT x.id, tr.lvl + 1 FROM runs x JOIN tree tr ON x.parent_run_id = tr.id\n"
        "        ), now_ AS (",
        "UNION ALL SELECT x.id, tr.lvl + 1 FROM runs x JOIN tree tr ON x.parent_run_id = tr.id\n"
        "        ) CYCLE id SET in_cycle USING path, now_ AS (",
    )
    return _replace(
        text,
        "FROM runs x JOIN tree tr ON tr.id = x.id",
        "FROM runs x JOIN tree tr ON tr.id = x.id AND NOT tr.in_cycle",
    )


def upgrade() -> None:
    v1 = _v1()
    for table in ("tenants", "agents"):
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {table}_name_not_uuid "
            f"CHECK (name !~ {UUID_SHAPED}) NOT VALID"
        )
    op.execute(_tenant_id(v1))
    op.execute(_cancel(v1))
    op.execute(v1.PIN_SEARCH_PATH)  # CREATE OR REPLACE resets a function's search_path


def downgrade() -> None:
    v1 = _v1()
    op.execute(_or_replace(v1.API_CANCEL))
    op.execute(_or_replace(v1.TENANT_ID))
    op.execute(v1.PIN_SEARCH_PATH)
    for table in ("tenants", "agents"):
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {table}_name_not_uuid")
