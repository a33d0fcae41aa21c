"""Bad input at the command line: one precise line, a documented exit code, nothing stored."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.test_cli import cli

CONSOLE_SCRIPT = Path(sys.executable).with_name("hango-worker")


def one_line(p: subprocess.CompletedProcess[str], code: int, *expect: str) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == code, p.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    for e in expect:
        assert e in lines[0], lines[0]
    return lines[0]


def raw_cli(dsn: str, *args: bytes) -> subprocess.CompletedProcess[str]:
    """The CLI with argv bytes as the OS hands them over (may be invalid UTF-8)."""
    env = {**os.environ, "HANGO_DATABASE_URL": dsn, "HANGO_LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [sys.executable.encode(), b"-m", b"hango_worker.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def run(argv: list[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
    return subprocess.run(argv, capture_output="stdout" not in kw, timeout=60, **kw)


async def count(dsn: str, table: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await conn.close()


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("runs", "list", "--limit", "-1"), "argument --limit: -1 is out of range: must be 1-"),
        (("runs", "list", "--limit", "many"), "'many' is not a whole number"),
        (("gc", "--older-than", "30d", "--batch-size", "0"), "--batch-size: 0 is out of range"),
        (("gc", "--older-than", "30d", "--tenant", "not-a-uuid"), "is not a tenant id (a UUID)"),
        (("agents", "create", "--name", "", "--model", "m"), "--name: must not be empty"),
        (("agents", "create", "--name", "a", "--model", " "), "--model: must not be empty"),
        (("agents", "create", "--name", "a\x1b[2J", "--model", "m"), "non-printable"),
        (("agents", "create", "--name", "n" * 100_000, "--model", "m"), "at most 200"),
        (("enqueue", "--agent", "a", "--input", " "), "--input: must not be empty"),
        (("enqueue", "--agent", "a"), "give --input, --input-file, --attach or --input-json"),
        (("runs", "show", "not-a-run"), "argument run_id: 'not-a-run' is not a run id"),
        (("runs", "list", "--bogus"), "unrecognized arguments: --bogus"),
        (("agents", "create", "--name", "a", "--model", "m", "--config", "{"), "not valid JSON"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (
            ("enqueue", "--agent", "a", "--input", "x", "--limits", '{"max_turns": 0}'),
            "--limits: limits are invalid at max_turns: Input should be greater than or equal to 1",
        ),
        (("enqueue", "--agent", "a", "--input", "x", "--limits", "{"), "--limits: Expecting"),
    ],
)
async def test_usage_errors_are_one_line_with_code_2(
    dsn: str, args: tuple[str, ...], expect: str
) -> None:
    one_line(cli(dsn, *args, ok=False), 2, expect)
    assert await count(dsn, "agents") == 0 and await count(dsn, "runs") == 0


@pytest.mark.parametrize(
    "args",
    [
        (b"agents", b"create", b"--name", b"caf\xe9", b"--model", b"m"),
        (b"enqueue", b"--agent", b"a", b"--input", b"\xff\xfe broken"),
    ],
)
async def test_invalid_utf8_in_argv_is_refused(dsn: str, args: tuple[bytes, ...]) -> None:
    line = one_line(raw_cli(dsn, *args), 2, "is not valid UTF-8 (byte 0x")
    assert "\\udc" not in line
    assert await count(dsn, "agents") == 0 and await count(dsn, "runs") == 0


async def test_unknown_tool_is_refused_listing_the_known_ones(dsn: str) -> None:
    p = cli(
        dsn, "agents", "create", "--name", "a", "--model", "m", "--tool", "calculater", ok=False
    )
    line = one_line(p, 2, "--tool 'calculater' is not a known tool", "calculator", "write_todos")
    assert "current_time" in line
    assert await count(dsn, "agents") == 0
    ok = cli(dsn, "agents", "create", "--name", "a", "--model", "m", "--tool", "write_todos")
    assert len(ok.stdout.strip()) == 36
    p = cli(dsn, "agents", "create", "--name", "a", "--model", "m", ok=False)
    one_line(p, 4, "already exists")


async def test_long_input_from_a_file_or_stdin(dsn: str, tmp_path: Path) -> None:
    cli(dsn, "agents", "create", "--name", "a", "--model", "m")
    big = "Привет, мир! " * 20_000  # ~ 480 KB of UTF-8: over the OS argument limit
    path = tmp_path / "input.txt"
    path.write_text(big, encoding="utf-8")
    from_file = cli(dsn, "enqueue", "--agent", "a", "--input-file", str(path)).stdout.strip()
    env = {**os.environ, "HANGO_DATABASE_URL": dsn}
    piped = run(
        [sys.executable, "-m", "hango_worker.cli", "enqueue", "--agent", "a", "--input", "-"],
        input=big.encode(),
        env=env,
    )
    assert piped.returncode == 0, piped.stderr
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT id::text, input->>'text' AS t FROM runs")
    finally:
        await conn.close()
    stored = {r["id"]: r["t"] for r in rows}
    assert stored == {from_file: big, piped.stdout.decode().strip(): big}
    (tmp_path / "bad.txt").write_bytes(b"ok \xc3\x28")
    p = cli(dsn, "enqueue", "--agent", "a", "--input-file", str(tmp_path / "bad.txt"), ok=False)
    one_line(p, 2, "not valid UTF-8 (byte 0xc3 at 3)")
    p = cli(dsn, "enqueue", "--agent", "a", "--input-file", str(tmp_path / "nope"), ok=False)
    one_line(p, 2, "cannot read it")
    assert await count(dsn, "runs") == 2


async def test_runs_show_marks_a_malformed_message_and_shows_the_rest(dsn: str) -> None:
    cli(dsn, "agents", "create", "--name", "a", "--model", "m")
    run_id = cli(dsn, "enqueue", "--agent", "a", "--input", "hello there").stdout.strip()
    conn = await asyncpg.connect(dsn)
    try:
        session = await conn.fetchval("SELECT session_id FROM runs WHERE id = $1", run_id)
        for seq, content in ((1, '[{"type": "text", "text": "first words"}]'), (2, "[1]")):
            await conn.execute(
                "INSERT INTO messages (session_id, run_id, seq, role, content) "
                "VALUES ($1, $2, $3, 'user', $4::jsonb)",
                session,
                run_id,
                seq,
                content,
            )
        await conn.execute("UPDATE runs SET state_json = '[1, 2]'::jsonb WHERE id = $1", run_id)
    finally:
        await conn.close()
    p = cli(dsn, "runs", "show", run_id)
    assert "first words" in p.stdout and "malformed message #2" in p.stdout
    assert "queued" in p.stdout and "Traceback" not in p.stderr
    assert "message #2: a content block is int" in p.stderr and "state_json is list" in p.stderr
    shown = json.loads(cli(dsn, "runs", "show", run_id, "--json").stdout)
    assert shown["transcript"][1]["content"] == [1]


async def test_migrate_against_a_newer_database_says_so(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE alembic_version SET version_num = '0099_from_the_future'")
    finally:
        await conn.close()
    p = cli(dsn, "migrate", ok=False)
    one_line(p, 5, "'0099_from_the_future'", "does not know", "newer hango-worker")


def test_metrics_port_in_use_is_one_line(dsn: str, tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text('[{"text": "hi"}]')
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {
            "HANGO_METRICS_PORT": str(port),
            "HANGO_METRICS_HOST": "127.0.0.1",
            "HANGO_MODEL_PROVIDER": "scripted",
            "HANGO_SCRIPT": str(script),
        }
        p = cli(dsn, "run", "--until-idle", env=env, ok=False)
    one_line(p, 2, f"cannot listen on 127.0.0.1:{port}", "HANGO_METRICS_PORT")


def test_version_and_help_name_the_exit_codes() -> None:
    p = subprocess.run(
        [str(CONSOLE_SCRIPT), "--version"], capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and p.stdout.strip().startswith("hango-worker 0.")
    h = subprocess.run([str(CONSOLE_SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert "3 not found; 4 conflict; 5 database unavailable" in " ".join(h.stdout.split())


async def test_read_commands_speak_json(dsn: str) -> None:
    agent = json.loads(cli(dsn, "agents", "create", "--name", "a", "--model", "m", "--json").stdout)
    ids = json.loads(cli(dsn, "enqueue", "--agent", "a", "--input", "hi", "--json").stdout)
    run_id = ids["run_id"]
    listed = json.loads(cli(dsn, "runs", "list", "--json").stdout)
    assert [r["id"] for r in listed] == [run_id]
    assert json.loads(cli(dsn, "agents", "list", "--json").stdout)[0]["id"] == agent["agent_id"]
    shown = json.loads(cli(dsn, "runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "queued"
    cancel = json.loads(cli(dsn, "runs", "cancel", run_id, "--json").stdout)
    assert cancel == {"run_id": run_id, "status": "cancelled"}
    resume = json.loads(cli(dsn, "runs", "resume", run_id, "--json").stdout)
    assert resume == {"run_id": run_id, "status": "queued"}
    migrated = json.loads(cli(dsn, "migrate", "--json").stdout)
    assert migrated["from"] == migrated["to"]
    p = cli(dsn, "runs", "resume", run_id, ok=False)
    one_line(p, 4, "is not cancelled or failed")
    cli(dsn, "runs", "cancel", run_id)
    watched = cli(dsn, "runs", "watch", run_id, "--json", ok=False)
    assert watched.returncode == 1  # the run did not succeed
    lines = [json.loads(line) for line in watched.stdout.splitlines()]
    assert lines[-1]["type"] == "run" and lines[-1]["status"] == "cancelled"


async def test_a_closed_stdout_is_not_a_traceback(dsn: str) -> None:
    """`hango-worker runs list | head`: the console script, with the reader gone."""
    cli(dsn, "agents", "create", "--name", "a", "--model", "m")
    for _ in range(3):
        cli(dsn, "enqueue", "--agent", "a", "--input", "hi")
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader at all: the first write gets EPIPE
    try:
        p = run(
            [str(CONSOLE_SCRIPT), "runs", "list"],
            env={**os.environ, "HANGO_DATABASE_URL": dsn},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)
    assert p.returncode == 141 and p.stderr == "", p.stderr


def test_the_fake_anthropic_server_is_not_a_production_subcommand(tmp_path: Path) -> None:
    p = run([str(CONSOLE_SCRIPT), "fake-anthropic", "--script", "x.json"], text=True)
    assert p.returncode == 2 and "invalid choice: 'fake-anthropic'" in p.stderr
    # no console script of its own (the image leaves the fakes out): `python -m`
    assert not CONSOLE_SCRIPT.with_name("hango-fake-anthropic").exists()
    fake = [sys.executable, "-m", "hango_worker.testing.fake_anthropic"]
    (tmp_path / "bad.json").write_text("{")
    p = run([*fake, "--script", str(tmp_path / "bad.json"), "--port", "0"], text=True)
    assert (
        p.returncode == 2
        and p.stderr.startswith("fake-anthropic: ")
        and "Traceback" not in p.stderr
    )


def test_without_a_database_url_the_cli_says_it_uses_the_embedded_database(
    tmp_path: Path,
) -> None:
    """HANGO_DATABASE_URL unset: one line names the embedded development database and where,
    so nobody mistakes it for the real one."""
    env = {k: v for k, v in os.environ.items() if k != "HANGO_DATABASE_URL"}
    env["HANGO_DATA_DIR"] = str(tmp_path / "dev")
    p = run([sys.executable, "-m", "hango_worker.cli", "migrate"], env=env, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    line = f"using an embedded development database in {tmp_path / 'dev'}"
    assert line in p.stderr, p.stderr[-2000:]
    # it is really there, and stops with the command
    assert (tmp_path / "dev" / "pgdata").is_dir()
