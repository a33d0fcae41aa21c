"""Secrets from files (`NAME_FILE`) as well as the environment: docs/operations.md
"Secrets from files". The deploy files mount the Secret and set the `_FILE` variables
(tests/test_deploy_platform.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hango_worker.config import SECRET_VARIABLES, ConfigError, load_secret_files, load_settings
from hango_worker.run.providers import make_provider
from hango_worker.store import db, migrate


def test_a_file_gives_the_value_and_one_trailing_newline_goes(tmp_path: Path) -> None:
    (tmp_path / "url").write_text("postgresql://u:p@db:5432/app\n")
    (tmp_path / "tokens").write_text('{\n  "x": 1\n}\n')
    env = {
        "HANGO_DATABASE_URL_FILE": str(tmp_path / "url"),
        "HANGO_CONSOLE_TOKENS_FILE": str(tmp_path / "tokens"),
    }
    load_secret_files(env)
    assert env == {
        "HANGO_DATABASE_URL": "postgresql://u:p@db:5432/app",
        "HANGO_CONSOLE_TOKENS": '{\n  "x": 1\n}',
    }
    load_secret_files(env)  # again: nothing left to read, nothing changes
    assert "HANGO_DATABASE_URL_FILE" not in env


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "cannot be read: No such file or directory"),
        ("folder", "cannot be read: Is a directory"),
        ("empty", "is empty"),
        ("nul", "holds a NUL character"),
        ("binary", "is not UTF-8 text"),
        ("both", "both ANTHROPIC_API_KEY and ANTHROPIC_API_KEY_FILE are set; set only one"),
    ],
)
def test_a_bad_secret_file_is_one_line(tmp_path: Path, setup: str, message: str) -> None:
    path = tmp_path / "key"
    env = {"ANTHROPIC_API_KEY_FILE": str(path)}
    if setup == "folder":
        path.mkdir()
    elif setup == "empty":
        path.write_text("\n")
    elif setup == "nul":
        path.write_text("sk-\x00x")
    elif setup == "binary":
        path.write_bytes(b"\xff\xfe")
    elif setup == "both":
        path.write_text("sk-file")
        env["ANTHROPIC_API_KEY"] = "sk-env"
    with pytest.raises(ConfigError) as e:
        load_secret_files(env)
    assert message in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("configuration error: ") and "ANTHROPIC_API_KEY" in str(e.value)
    assert "sk-" not in str(e.value), "a secret's value never appears in the message"


def test_the_anthropic_client_gets_its_key_from_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "key").write_text("sk-ant-from-a-file\n")
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY_FILE", str(tmp_path / "key"))
    monkeypatch.setenv("HANGO_MODEL_PROVIDER", "anthropic")
    provider = make_provider(load_settings())
    assert provider.client.api_key == "sk-ant-from-a-file"  # type: ignore[attr-defined]
    assert "ANTHROPIC_API_KEY_FILE" not in os.environ


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HANGO_") and k not in SECRET_VARIABLES
    }
    return subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


async def test_migrate_reads_the_database_url_from_a_file(empty_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "url").write_text(empty_dsn + "\n")
    p = cli({"HANGO_DATABASE_URL_FILE": str(tmp_path / "url")}, "migrate")
    assert p.returncode == 0, p.stderr
    assert await db.schema_revision(empty_dsn) == migrate.head_revision()
    both = cli(
        {"HANGO_DATABASE_URL_FILE": str(tmp_path / "url"), "HANGO_DATABASE_URL": empty_dsn},
        "migrate",
    )
    assert both.returncode == 2
    assert both.stderr == (
        "hango-worker: configuration error: both HANGO_DATABASE_URL and "
        "HANGO_DATABASE_URL_FILE are set; set only one\n"
    )
    gone = cli({"HANGO_DATABASE_URL_FILE": str(tmp_path / "nope")}, "runs", "list")
    assert gone.returncode == 2 and gone.stderr.count("\n") == 1, gone.stderr
    assert "HANGO_DATABASE_URL_FILE=" in gone.stderr and "cannot be read" in gone.stderr
