"""Every size and limit is checked where it is given (the CLI's inputs): one line,
exit code 2, nothing queued, nothing read without end."""

from __future__ import annotations

import subprocess
import sys

import pytest

ENV = {"HANGO_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none", "PATH": ""}


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def test_an_endless_input_file_is_refused_not_read_forever() -> None:
    """Proves: --input-file /dev/zero stops at the input limit (before: read until the
    memory ran out)."""
    p = cli("enqueue", "--agent", "a", "--input-file", "/dev/zero")
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "--input-file /dev/zero: larger than 10 MiB, the input limit" in line


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        ('{"max_cost_usd": Infinity}', "max_cost_usd: Input should be a finite number"),
        ('{"tool_call_limits": {"x": -1}}', "tool_call_limits.x: Input should be greater"),
        ('{"max_turns": true}', "max_turns: Input should be a valid integer"),
        ('{"max_duration_s": NaN}', "max_duration_s: Input should be a finite number"),
    ],
)
def test_limits_that_cannot_work_are_refused_in_one_line(limits: str, says: str) -> None:
    p = cli("enqueue", "--agent", "a", "--input", "hi", "--limits", limits)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert says in line and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["enqueue", "--agent", "a", "--input", "x", "--limits", "[" * 20_000 + "]" * 20_000],
            "--limits: nested more than 64 levels deep",
        ),
        (
            [
                "agents",
                "create",
                "--name",
                "a",
                "--model",
                "m",
                "--config",
                '{"a": ' * 70 + "1" + "}" * 70,
            ],
            "--config: nested more than 64 levels deep",
        ),
        (
            [
                "runs",
                "approve",
                "00000000-0000-4000-8000-000000000001",
                "--input",
                '{"text": "a\\u0000b"}',
            ],
            "--input: holds a NUL character",
        ),
    ],
)
def test_deep_or_unstorable_json_arguments_are_one_line(args: list[str], says: str) -> None:
    """Proves: a JSON argument nested 20,000 deep is not a RecursionError traceback,
    and one holding a NUL is refused before Postgres would refuse it."""
    p = cli(*args)
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert says in line and "Traceback" not in p.stderr
