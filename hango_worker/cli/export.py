"""`runs export` and `runs import`: a run as a self-contained JSON file, and such a
file as a finished run of this database (run/export.py; docs/operations.md, "Runs as
fixtures")."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import a_uuid, text
from hango_worker.cli.runs import verbs
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings


def register(sub: Subcommands) -> None:
    rs = verbs(sub)
    ex = command(
        rs,
        "export",
        cmd_runs_export,
        "write a run as one self-contained JSON file (its agent, input, history, "
        "recorded responses, tool results, events and stored blocks)",
        tenanted=True,
    )
    ex.add_argument("run_id", type=a_uuid("a run id"))
    ex.add_argument(
        "--redact",
        type=text,
        action="append",
        default=[],
        metavar="REGEX",
        help="replace every match in the file's text with [redacted] (repeatable)",
    )
    ex.add_argument("--output", "-o", type=text, metavar="FILE", help="default: stdout")
    im = command(
        rs,
        "import",
        cmd_runs_import,
        "load an exported run as a finished run (agent <name>-imported, a new session)",
        tenanted=True,
    )
    im.add_argument("file", type=text, metavar="FILE", help="an export ('-': read stdin)")
    im.add_argument("--json", action="store_true")


async def cmd_runs_export(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.run.export import ExportError, compile_patterns, export_run
    from hango_worker.tool.registry import Registry

    try:
        compile_patterns(a.redact)
    except ExportError as e:
        raise CliError(str(e)) from None
    registry = Registry.default(modules=s.tool_modules)
    async with pool_for(s) as (_, pool):
        tenant = await tenant_of(pool, a)
        doc = await export_run(pool, tenant, a.run_id, a.redact, registry)
    body = json.dumps(doc, ensure_ascii=False, default=str)
    if a.output is None:
        print(body)
    else:
        _write(a.output, body + "\n")
    return exits.OK


async def cmd_runs_import(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.run.export import ExportError, import_run, read_export

    raw = _read(a.file)
    try:
        doc = read_export(raw)
        async with pool_for(s) as (_, pool):
            ids = await import_run(pool, await tenant_of(pool, a), doc)
    except ExportError as e:
        raise CliError(f"{a.file}: {e}") from None
    print(json.dumps(ids) if a.json else ids["run_id"])
    return exits.OK


def _write(path: str, body: str) -> None:
    try:
        Path(path).write_text(body)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror}") from None


def _read(path: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror}") from None
