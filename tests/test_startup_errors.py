"""`run` and `migrate` when the database cannot be used: one line naming the cause and
what to do, exit code 5, no traceback; `/healthz` answers before the database does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.conftest import with_database
from tests.test_cli import cli
from tests.test_cli_errors import one_line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_user(dsn: str, user: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, f"{user}:secret-pw@{host}", parts.path, parts.query, ""))


@pytest.fixture
def script(tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "s.json"
    path.write_text('[{"text": "hi"}]')
    return {"HANGO_MODEL_PROVIDER": "scripted", "HANGO_SCRIPT": str(path)}


def bad_dsns(admin: str) -> Iterator[tuple[str, str, tuple[str, ...]]]:
    port = free_port()  # nothing listens there once the probe socket is closed
    yield "unreachable", f"postgresql://u:pw@127.0.0.1:{port}/hango", ("cannot connect",)
    yield "missing", with_database(admin, "no_such_db_here"), ("does not exist", "createdb")
    yield "credentials", as_user(admin, "no_such_role"), ("refused the credentials",)


@pytest.mark.parametrize("command", ["run", "migrate"])
def test_unusable_database_is_one_line_exit_5(
    pg_admin_dsn: str, script: dict[str, str], command: str
) -> None:
    for label, dsn, expect in bad_dsns(pg_admin_dsn):
        args = (command, "--until-idle") if command == "run" else (command,)
        p = cli(dsn, *args, env=script, ok=False)
        line = one_line(p, 5, "database unavailable", *expect)
        assert "secret-pw" not in line and ":pw@" not in line, (label, line)


def test_run_on_an_unmigrated_database_exits_at_once(
    empty_dsn: str, script: dict[str, str]
) -> None:
    p = cli(empty_dsn, "run", "--until-idle", env=script, ok=False)
    one_line(p, 5, "not migrated", "run `hango-worker migrate`")
    p = cli(empty_dsn, "run", env=script, ok=False)  # the service, too: no retry loop
    one_line(p, 5, "not migrated")


def _status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


async def test_healthz_answers_before_the_database_does(script: dict[str, str]) -> None:
    """A database that accepts TCP but never answers: the worker is alive, not ready."""
    silent = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    db_port = silent.sockets[0].getsockname()[1]
    metrics_port = free_port()
    env = {
        **os.environ,
        **script,
        "HANGO_DATABASE_URL": f"postgresql://u@127.0.0.1:{db_port}/hango",
        "HANGO_METRICS_PORT": str(metrics_port),
        "HANGO_METRICS_HOST": "127.0.0.1",
        "HANGO_LOG_LEVEL": "WARNING",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hango_worker.cli", "run", env=env, stderr=subprocess.PIPE
    )
    try:
        health = None
        for _ in range(600):
            health = await asyncio.to_thread(_status, metrics_port, "/healthz")
            if health is not None or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert health == 200
        assert await asyncio.to_thread(_status, metrics_port, "/readyz") == 503
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await asyncio.wait_for(proc.wait(), 10)
        silent.close()
