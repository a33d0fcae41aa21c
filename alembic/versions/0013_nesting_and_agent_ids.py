"""The producer API refuses deeply nested JSON; an agent argument is an id or a name, never both.

Revision ID: 0013_nesting_and_agent_ids
Revises: 0012_names_and_trees

- `hango_run_input` (behind `hango_api.enqueue` and the Python client) refuses `input` or
  `config` nested more than 64 levels deep with QH003, before anything is written (the
  same depth as the CLI and the Client, store/json_limits.py). Before, a `config.limits`
  value could nest as deep as Postgres parses; the run was queued and failed at load.
  JSON deeper than Postgres itself parses (thousands of levels) is refused by Postgres
  when the argument is read: SQLSTATE 54001, before the call.
- `hango_enqueue_run` reads a UUID-shaped `agent` as an agent's id only and anything else
  as a name only, like `hango_tenant_id` since 0012. Before, a name was tried first, then
  an id: an agent named like another agent's id (possible before 0012's check) took its
  enqueues.

Compatible both ways: the functions keep their signatures and grants; code at 0009 reads
nothing this changes. Downgrading restores 0010's and 0009's function texts.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0013_nesting_and_agent_ids"
down_revision = "0012_names_and_trees"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"

UUID_SHAPED = "'^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'"
MAX_JSON_DEPTH = 64  # store/json_limits.py: the root is level 1


def _module(file: str) -> ModuleType:
    """An earlier revision's module: the function texts this revision changes."""
    path = Path(__file__).with_name(file)
    spec = importlib.util.spec_from_file_location(f"hango_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"0013: an earlier function text changed; not found: {old!r}")
    return text.replace(old, new)


def _or_replace(text: str) -> str:
    return _replace(text, "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


# jsonpath's `.**{n}` is every item at level n below the root (the root is level 0): an
# item there means a depth over MAX_JSON_DEPTH. Linear in the value's size, in C.
_DEPTH_CHECK = f"""BEGIN
    IF jsonb_path_exists(input, 'strict $.**{{{MAX_JSON_DEPTH}}}') THEN
        RAISE EXCEPTION 'input is nested more than {MAX_JSON_DEPTH} levels deep'
            USING ERRCODE = 'QH003';
    END IF;
    IF jsonb_path_exists(config, 'strict $.**{{{MAX_JSON_DEPTH}}}') THEN
        RAISE EXCEPTION 'config is nested more than {MAX_JSON_DEPTH} levels deep'
            USING ERRCODE = 'QH003';
    END IF;
    IF input IS NULL"""


def _run_input(v1: ModuleType) -> str:
    return _replace(_or_replace(v1.RUN_INPUT), "BEGIN\n    IF input IS NULL", _DEPTH_CHECK)


def _enqueue_run(v2_run: str) -> str:
    return _replace(
        _or_replace(v2_run),
        "    SELECT x.id INTO a FROM agents x WHERE x.tenant_id = t"
        " AND (x.name = agent OR x.id::text = agent)\n"
        "        ORDER BY x.name = agent DESC LIMIT 1;",
        f"""    IF agent ~ {UUID_SHAPED} THEN  -- an id, never a name (no name looks like one)
        SELECT x.id INTO a FROM agents x WHERE x.tenant_id = t AND x.id = agent::uuid;
    ELSE
        SELECT x.id INTO a FROM agents x WHERE x.tenant_id = t AND x.name = agent;
    END IF;""",
    )


def upgrade() -> None:
    v1 = _module("0009_producer_api.py")
    v2_run, _ = _module("0010_tenants.py")._enqueue_v2(v1)
    op.execute(_run_input(v1))
    op.execute(_enqueue_run(v2_run))
    op.execute(v1.PIN_SEARCH_PATH)


def downgrade() -> None:
    v1 = _module("0009_producer_api.py")
    v2_run, _ = _module("0010_tenants.py")._enqueue_v2(v1)
    op.execute(_or_replace(v2_run))
    op.execute(_or_replace(v1.RUN_INPUT))
    op.execute(v1.PIN_SEARCH_PATH)
