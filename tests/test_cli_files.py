"""`runs files ID` and `runs file ID PATH`: a run's files from the command line."""

from __future__ import annotations

import json
import uuid

import asyncpg

from hango_worker.provider.scripted import ScriptedProvider
from tests.helpers import call
from tests.test_cli import cli
from tests.test_cli_errors import one_line
from tests.worker_helpers import enqueue, make_agent, run_until_idle


async def test_runs_files_and_runs_file(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=["write_file"])
    content = "\x1b]0;owned\x07# Report\n\x1b[31mall good\x1b[0m\n"
    provider = ScriptedProvider(
        [
            {"tool_calls": [call("write_file", path="/out/report.md", content=content)]},
            {"tool_calls": [call("write_file", path="/a.txt", content="no newline")]},
            {"text": "written"},
        ]
    )
    run_id = await enqueue(pool)
    await run_until_idle(dsn, provider)

    listed = cli(dsn, "runs", "files", run_id).stdout.splitlines()
    assert [line.split("  ")[:3] for line in listed] == [
        ["/a.txt", "10 bytes", "toolu_s0001_0"],
        ["/out/report.md", f"{len(content)} bytes", "toolu_s0000_0"],
    ]
    as_json = json.loads(cli(dsn, "runs", "files", run_id, "--json").stdout)
    assert [(f["path"], f["size"], f["tool_use_id"]) for f in as_json] == [
        ("/a.txt", 10, "toolu_s0001_0"),
        ("/out/report.md", len(content), "toolu_s0000_0"),
    ]
    # printed with terminal control sequences removed; the stored text is untouched
    assert cli(dsn, "runs", "file", run_id, "/out/report.md").stdout == "# Report\nall good\n"
    assert cli(dsn, "runs", "file", run_id, "/a.txt").stdout == "no newline\n"
    shown = json.loads(cli(dsn, "runs", "file", run_id, "/out/report.md", "--json").stdout)
    assert shown["content"] == content

    missing = cli(dsn, "runs", "file", run_id, "/nope\x1b[2J", ok=False)
    line = one_line(missing, 3, f"run {run_id} has no file '/nope\\x1b[2J'")
    assert "\x1b" not in line
    other = str(uuid.uuid4())
    one_line(cli(dsn, "runs", "files", other, ok=False), 3, f"no run {other}")
    one_line(cli(dsn, "runs", "file", other, "/a.txt", ok=False), 3, f"no run {other}")
    one_line(cli(dsn, "runs", "files", "nope", ok=False), 2, "is not a run id")
