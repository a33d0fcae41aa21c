"""`hango-worker replay`: a recorded run driven again by the current code, with no model
call and nothing written, compared request by request (run/replay.py;
docs/operations.md, "Change agents safely")."""

from __future__ import annotations

import argparse
import json

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import a_uuid, json_arg, name, text
from hango_worker.cli.subcommands import Subcommands, command
from hango_worker.config import Settings


def register(sub: Subcommands) -> None:
    r = command(
        sub,
        "replay",
        cmd_replay,
        "drive a recorded run again with the current code (no model call, nothing "
        "written) and compare each request with the recorded one; exit 0 identical, "
        "1 diverged, 2 error",
        tenanted=True,
    )
    r.add_argument("run_id", type=a_uuid("a run id"))
    which = r.add_mutually_exclusive_group()
    which.add_argument("--agent", type=name, metavar="NAME", help="another agent (name or id)")
    which.add_argument(
        "--config",
        type=text,
        metavar="JSON",
        help="the run's agent with these fields changed: model, system, tools, config "
        '(its keys laid over the agent\'s), e.g. {"system": ["Be terse."]}',
    )
    r.add_argument(
        "--live-tools", action="store_true", help="run the tools instead of their recorded results"
    )
    r.add_argument("--json", action="store_true")


async def cmd_replay(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.render import safe
    from hango_worker.run.execute import assembly_settings
    from hango_worker.run.replay import ReplayError, replay
    from hango_worker.store.repo import NotFound
    from hango_worker.tool.registry import Registry

    config = json_arg(a.config, "--config") if a.config is not None else None
    if config is not None and not isinstance(config, dict):
        raise CliError("--config must be a JSON object")
    registry = Registry.default(modules=s.tool_modules)
    try:
        async with pool_for(s) as (_, pool):
            report = await replay(
                pool,
                await tenant_of(pool, a),
                a.run_id,
                registry=registry,
                settings=assembly_settings(s),
                agent=a.agent,
                config=config,
                live_tools=a.live_tools,
            )
    except (ReplayError, NotFound) as e:
        raise CliError(str(e), exits.USAGE) from None
    if a.json:
        print(json.dumps(report.to_dict()))
    elif report.divergence is None:
        print(f"identical ({report.requests} requests)")
        if report.note:
            print(report.note)
    else:
        d = report.divergence
        print(f"diverged at request {d.request}: {d.field}")
        for part in (d.note, d.diff):
            if part:
                print(safe(part))
    return exits.OK if report.identical else exits.FAILED
