"""`runs files|file`: the files a run's tools wrote (store/repo.py run_files, run_file)."""

from __future__ import annotations

import argparse

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.inputs import a_uuid, text
from hango_worker.cli.output import out
from hango_worker.cli.runs import verbs
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings
from hango_worker.render import safe
from hango_worker.store import repo


def register(sub: Subcommands) -> None:
    rs = verbs(sub)
    fl = command(
        rs,
        "files",
        cmd_runs_files,
        "the run's files: path, size, tool call, updated",
        tenanted=True,
    )
    fl.add_argument("run_id", type=a_uuid("a run id"))
    fl.add_argument("--json", action="store_true")
    f1 = command(
        rs,
        "file",
        cmd_runs_file,
        "print one of the run's files (control sequences removed)",
        tenanted=True,
    )
    f1.add_argument("run_id", type=a_uuid("a run id"))
    f1.add_argument("path", type=text, help="the file's path, as `runs files` lists it")
    f1.add_argument("--json", action="store_true", help="with size, tool call and times")


async def cmd_runs_files(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        files = await repo.run_files(pool, await tenant_of(pool, a), a.run_id)
    if a.json:
        out(files)
        return exits.OK
    for f in files:
        call = f["tool_use_id"] or "-"
        print(f"{safe(f['path'])}  {f['size']} bytes  {safe(call)}  {f['updated_at']}")
    return exits.OK


async def cmd_runs_file(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        f = await repo.run_file(pool, await tenant_of(pool, a), a.run_id, a.path)
    if a.json:
        out(f)
        return exits.OK
    content = safe(f["content"])
    print(content, end="" if content.endswith("\n") else "\n")
    return exits.OK
