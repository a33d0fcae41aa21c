"""`runs approve|reject|answer`: a person's decision about the call a waiting run waits
on, or the answer to its question (store/decisions.py; docs/operations.md)."""

from __future__ import annotations

import argparse
import getpass
import json
from typing import Any

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import a_uuid, json_arg, text
from hango_worker.cli.runs import verbs
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings
from hango_worker.store import decisions, repo
from hango_worker.vocab import Decision


def register(sub: Subcommands) -> None:
    rs = verbs(sub)
    for verb, fn, h in (
        ("approve", cmd_runs_approve, "approve the call a waiting run waits on"),
        ("reject", cmd_runs_reject, "reject the call a waiting run waits on, with a reason"),
        ("answer", cmd_runs_answer, "answer the question a waiting run asks"),
    ):
        sp = command(rs, verb, fn, h, tenanted=True)
        sp.add_argument("run_id", type=a_uuid("a run id"))
        sp.add_argument("--call", type=text, metavar="CALL_ID", help="the call (default: pending)")
        sp.add_argument("--json", action="store_true")
        if verb == "approve":
            sp.add_argument(
                "--input", type=text, metavar="JSON", help="run it with these arguments"
            )
        if verb == "reject":
            sp.add_argument("--reason", type=text, required=True, help="told to the model")
        if verb == "answer":
            sp.add_argument("--text", type=text, required=True, help="the answer")


def _edited(raw: str | None) -> Any:
    if raw is None:
        return None
    value = json_arg(raw, "--input")
    if not isinstance(value, dict):
        raise CliError("--input must be a JSON object (the call's arguments)")
    return value


async def _decide(s: Settings, a: argparse.Namespace, d: Decision, **kw: Any) -> int:
    try:
        async with pool_for(s) as (_, pool):
            done = await decisions.decide(
                pool,
                await tenant_of(pool, a),
                a.run_id,
                d,
                call_id=a.call,
                decided_by=f"cli:{getpass.getuser()}",
                **kw,
            )
    except ValueError as e:
        if isinstance(e, repo.Conflict):
            raise
        raise CliError(str(e)) from None
    if a.json:
        print(json.dumps({**done, "status": "queued"}))
    else:
        print(f"{done['decision']} {done['tool_use_id']}: the run is queued again")
    return exits.OK


async def cmd_runs_approve(s: Settings, a: argparse.Namespace) -> int:
    return await _decide(s, a, Decision.APPROVE, edited=_edited(a.input))


async def cmd_runs_reject(s: Settings, a: argparse.Namespace) -> int:
    return await _decide(s, a, Decision.REJECT, text=a.reason)


async def cmd_runs_answer(s: Settings, a: argparse.Namespace) -> int:
    return await _decide(s, a, Decision.ANSWER, text=a.text)
