"""A run's own Messages API parameters: `hango_api.enqueue(..., config => {"params": {...}})`.

Revision ID: 0015_run_params
Revises: 0012_names_and_trees

`hango_run_input` takes a third key in `config`, `params` (a JSON object), stored as
`runs.input.params` beside `limits` and `memory_key`. The worker lays them over the
agent's config for every model call of the run and checks them there with the same
rules as the agent config (provider/params.py); the CLI and the Python client check
them before they enqueue (docs/producers.md).

Compatible both ways: same signatures, grants and search paths (CREATE OR REPLACE of an
internal function); code at 0012 never writes `params` and ignores it when it reads
`runs.input`. Downgrading restores 0009's function.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0015_run_params"
down_revision = "0012_names_and_trees"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"


def _v1() -> ModuleType:
    """0009_producer_api's module: the function text this revision changes."""
    path = Path(__file__).with_name("0009_producer_api.py")
    spec = importlib.util.spec_from_file_location("hango_migration_0009", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"0015: 0009's function text changed; not found: {old!r}")
    return text.replace(old, new)


def _run_input(v1: ModuleType) -> str:
    text = _replace(v1.RUN_INPUT, "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    text = _replace(text, "(limits and '\n", "(limits, params and '\n")
    text = _replace(
        text,
        """    IF config - 'limits' - 'memory_key' <> '{}'::jsonb THEN
        SELECT min(x) INTO k FROM jsonb_object_keys(config - 'limits' - 'memory_key') x;
        RAISE EXCEPTION 'config has an unknown key %: it takes "limits" and "memory_key"',""",
        """    IF config - 'limits' - 'memory_key' - 'params' <> '{}'::jsonb THEN
        SELECT min(x) INTO k FROM jsonb_object_keys(config - 'limits' - 'memory_key' - 'params') x;
        RAISE EXCEPTION 'config has an unknown key %: it takes "limits", "memory_key" and '
            '"params"',""",
    )
    return _replace(
        text,
        "    mk := config->'memory_key';",
        """    IF config ? 'params' AND jsonb_typeof(config->'params') <> 'object' THEN
        RAISE EXCEPTION 'config.params must be a JSON object of Messages API parameters'
            USING ERRCODE = 'QH003', HINT = 'docs/producers.md, "Per-run parameters"';
    END IF;
    mk := config->'memory_key';""",
    )


def upgrade() -> None:
    op.execute(_run_input(_v1()))


def downgrade() -> None:
    op.execute(_replace(_v1().RUN_INPUT, "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"))
