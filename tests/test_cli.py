"""The CLI as a user drives it: migrate → agents create → enqueue → run → runs show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hango_worker.store.migrate import head_revision


def cli(
    dsn: str, *args: str, env: dict[str, str] | None = None, ok: bool = True
) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "HANGO_DATABASE_URL": dsn,
        "HANGO_LOG_LEVEL": "WARNING",
        "HANGO_METRICS_PORT": "0",
        **(env or {}),
    }
    p = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if ok:
        assert p.returncode == 0, f"{args}: {p.stderr[-2000:]}"
    return p


def test_migrate_create_enqueue_run_show(empty_dsn: str, tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(
        json.dumps(
            [
                {
                    "text": "Let me add.",
                    "tool_calls": [{"name": "calculator", "input": {"expression": "40+2"}}],
                },
                {"text": "The answer is 42."},
            ]
        )
    )
    assert f"migrated to {head_revision()}" in cli(empty_dsn, "migrate").stdout
    cli(empty_dsn, "migrate")  # idempotent
    agent_id = cli(
        empty_dsn,
        "agents",
        "create",
        "--name",
        "calc",
        "--model",
        "claude-test",
        "--system",
        "Be exact.",
        "--tool",
        "calculator",
    ).stdout.strip()
    assert len(agent_id) == 36
    listed = json.loads(cli(empty_dsn, "agents", "list", "--json").stdout)
    assert [a["name"] for a in listed] == ["calc"] and listed[0]["tools"] == ["calculator"]
    run_id = cli(empty_dsn, "enqueue", "--agent", "calc", "--input", "what is 40+2?").stdout.strip()
    env = {"HANGO_MODEL_PROVIDER": "scripted", "HANGO_SCRIPT": str(script)}
    cli(empty_dsn, "run", "--until-idle", env=env)
    shown: dict[str, Any] = json.loads(cli(empty_dsn, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "succeeded" and shown["attempt"] == 1
    assert shown["transcript"][-1]["content"][0]["text"] == "The answer is 42."
    assert [e["type"] for e in shown["events"]][-1] == "run_finished"
    human = cli(empty_dsn, "runs", "show", run_id).stdout
    assert "succeeded" in human and "The answer is 42." in human and "calculator" in human
    listing = cli(empty_dsn, "runs", "list").stdout
    assert run_id in listing and "succeeded" in listing


@pytest.mark.parametrize(
    ("args", "message", "code"),
    [
        (("runs", "show", "not-a-uuid"), "'not-a-uuid' is not a run id", 2),
        (("runs", "show", "00000000-0000-0000-0000-0000000000ff"), "no run 00000000", 3),
        (("enqueue", "--agent", "ghost", "--input", "x"), "no agent 'ghost'", 3),
        (
            ("agents", "create", "--name", "x", "--model", "m", "--config", '{"max_turn": 3}'),
            "--config is not a valid agent config",
            2,
        ),
        (("runs", "cancel", "00000000-0000-0000-0000-0000000000ff"), "no run 00000000", 3),
    ],
)
def test_bad_input_gets_one_clear_line(
    dsn: str, args: tuple[str, ...], message: str, code: int
) -> None:
    p = cli(dsn, *args, ok=False)
    assert p.returncode == code, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], p.stderr


def test_unmigrated_database_says_so(empty_dsn: str) -> None:
    p = cli(empty_dsn, "runs", "list", ok=False)
    assert p.returncode == 5 and "not migrated" in p.stderr and "hango-worker migrate" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("var", "value", "expect"),
    [
        ("HANGO_WORKER_CONCURRENCY", "zero", "HANGO_WORKER_CONCURRENCY='zero' is not valid"),
        ("HANGO_WORKER_CONCURRENCY", "0", "greater than or equal to 1"),
        ("HANGO_POLL_INTERVAL_S", "-1", "HANGO_POLL_INTERVAL_S='-1'"),
        ("HANGO_MODEL_PROVIDER", "gpt", "'scripted', 'anthropic' or 'auto'"),
        ("HANGO_DATABASE_URL", "mysql://x", "must start with postgresql://"),
    ],
)
def test_bad_configuration_stops_start_up_with_one_line(var: str, value: str, expect: str) -> None:
    env = {**os.environ, var: value}
    p = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", "run", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and expect in lines[0] and var in lines[0], p.stderr


def test_run_refuses_to_guess_a_provider(dsn: str) -> None:
    p = cli(dsn, "run", "--until-idle", env={"HANGO_MODEL_PROVIDER": "anthropic"}, ok=False)
    assert p.returncode == 2 and "ANTHROPIC_API_KEY is not set" in p.stderr
    p = cli(dsn, "run", "--until-idle", env={"HANGO_MODEL_PROVIDER": "scripted"}, ok=False)
    assert p.returncode == 2 and "needs HANGO_SCRIPT" in p.stderr
