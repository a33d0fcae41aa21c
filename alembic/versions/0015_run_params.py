"""A run's own Messages API parameters: `hango_api.enqueue(..., config => {"params": {...}})`.

Revision ID: 0015_run_params
Revises: 0014_budgets

`hango_run_input` takes a third key in `config`, `params` (a JSON object), stored as
`runs.input.params` beside `limits` and `memory_key`. The worker lays them over the
agent's config for every model call of the run and checks them there with the same
rules as the agent config (provider/params.py); the CLI and the Python client check
them before they enqueue (docs/producers.md).

Compatible both ways: same signatures, grants and search paths (CREATE OR REPLACE of an
internal function); code at 0012 never writes `params` and ignores it when it reads
`runs.input`. Downgrading restores 0013's function.
"""

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0015_run_params"
down_revision = "0014_budgets"
branch_labels = None
depends_on = None
serves_code_since = "0009_producer_api"


def _module(file: str) -> ModuleType:
    """An earlier revision's module: the function texts this revision builds on."""
    path = Path(__file__).with_name(file)
    spec = importlib.util.spec_from_file_location(f"hango_migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _replace(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"0015: an earlier function text changed; not found: {old!r}")
    return text.replace(old, new)


def _previous() -> str:
    """0013's text of hango_run_input (0009's, with the nesting check)."""
    return str(_module("0013_nesting_and_agent_ids.py")._run_input(_module("0009_producer_api.py")))


def _run_input(previous: str) -> str:
    text = previous
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
    op.execute(_run_input(_previous()))


def downgrade() -> None:
    op.execute(_previous())
