"""A malformed HANGO_DATABASE_URL is one line naming the variable, exit code 2, never a
traceback, and its password is not printed (config.py); a malformed DSN handed to the
store in code is `Unavailable` in one line (store/db.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hango_worker.store import db


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u:s3cret@[::1:5432/db", "Invalid IPv6 URL"),
        ("postgresql://u:s3cret@[::1]:99999/db", "Port out of range"),
        ("postgresql://u:s3cret@db.internal:abc/db", "Port could not be cast"),
    ],
)
@pytest.mark.parametrize("command", [["runs", "list"], ["migrate"], ["run"]])
def test_a_malformed_database_url_is_one_line_and_exit_2(
    url: str, says: str, command: list[str]
) -> None:
    """Proves: before, urllib's ValueError ended the CLI in a traceback."""
    p = subprocess.run(
        [sys.executable, "-m", "hango_worker.cli", *command],
        capture_output=True,
        text=True,
        timeout=60,
        env={"HANGO_DATABASE_URL": url, "PATH": "", "HANGO_METRICS_PORT": "0"},
    )
    assert p.returncode == 2, p.stderr
    (line,) = p.stderr.strip().splitlines()
    assert "HANGO_DATABASE_URL=" in line and says in line, line
    assert "s3cret" not in line and "u:***@" in line


async def test_a_malformed_dsn_in_code_is_unavailable_in_one_line() -> None:
    with pytest.raises(db.Unavailable, match="Invalid IPv6 URL") as e:
        await db.open_pool("postgresql://u@[::1:5432/db")
    assert "\n" not in str(e.value)
