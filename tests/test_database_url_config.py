"""Database URL parameters checked before connecting (docs/operations.md "Database URLs"):
a bad sslmode, a missing sslrootcert or a bad target_session_attrs is one configuration
line with the password masked. Against a real TLS server: tests/tls/ (`make test-tls`).
"""

from __future__ import annotations

import contextlib
import subprocess

import pytest

from hango_worker.cli import exits
from hango_worker.config import asyncpg_dsn
from tests.test_cli import cli

PASSWORD = "s3cret-pw"


def one_line(p: subprocess.CompletedProcess[str], code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr and PASSWORD not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("query", "expect"),
    [
        ("sslmode=verify_full", "sslmode='verify_full' is not one of disable, allow, prefer"),
        ("sslmode=require&sslrootcert=/nonexistent/ca.crt", "sslrootcert='/nonexistent/ca.crt'"),
        ("target_session_attrs=primary-ish", "target_session_attrs='primary-ish' is not one of"),
    ],
)
def test_a_bad_parameter_is_a_configuration_error(query: str, expect: str) -> None:
    url = f"postgresql://postgres:{PASSWORD}@127.0.0.1:1/postgres?{query}"
    for command in (("migrate",), ("run", "--until-idle")):
        line = one_line(cli(url, *command, ok=False), exits.USAGE)
        assert line.startswith("hango-worker: configuration error: HANGO_DATABASE_URL="), line
        assert expect in line and "postgres:***@" in line, line


def test_the_driver_url_keeps_what_the_user_wrote() -> None:
    url = "postgresql+asyncpg://u:p@[::1]:5/d?sslmode=require&target_session_attrs=read-write"
    assert asyncpg_dsn(url) == url.replace("+asyncpg", "")
    with contextlib.suppress(ValueError):
        asyncpg_dsn("mysql://x")
        pytest.fail("a mysql URL was taken")
