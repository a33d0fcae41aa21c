"""`agents create|list|limit`: the tenant's agents (their model, prompts, tools and
config) and each one's max_running (store/repo.py, store/tenants.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import ValidationError

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import check_tools, int_between, json_arg, name, new_name, text
from hango_worker.cli.output import out
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.store import repo
from hango_worker.store import tenants as t

_N = int_between(0, t.MAX_RUNNING)


def register(sub: Subcommands) -> None:
    ag = group(sub, "agents", "create and list agents")
    c_ = command(ag, "create", cmd_agents_create, "create an agent; prints its id", tenanted=True)
    c_.add_argument(
        "--name", required=True, type=new_name, help="1-200 printable characters, not a UUID"
    )
    c_.add_argument("--model", required=True, type=name, help="e.g. claude-sonnet-4-6")
    c_.add_argument("--system", action="append", type=text, help="a system prompt block")
    c_.add_argument(
        "--tool", action="append", type=text, help="an allowed tool (repeatable; none = no tools)"
    )
    c_.add_argument("--config", default="{}", type=text, help='JSON, e.g. {"max_turns": 20}')
    c_.add_argument("--json", action="store_true")
    ls = command(ag, "list", cmd_agents_list, "list agents", tenanted=True)
    ls.add_argument("--json", action="store_true")
    al = command(
        ag, "limit", cmd_agents_limit, "set or remove an agent's max_running", tenanted=True
    )
    al.add_argument("agent", type=name, help="agent name or id")
    lim = al.add_mutually_exclusive_group(required=True)
    lim.add_argument("--max-running", type=_N, help="its runs running at once, fleet-wide")
    lim.add_argument("--no-limit", action="store_true", help="remove its max_running")


def known_tools(settings: Settings) -> list[str]:
    """The registry's tools plus those middlewares provide (e.g. write_todos)."""
    from hango_worker.agent.stack import PROVIDED_TOOLS, StackConfig, default_stack
    from hango_worker.agent.state import State
    from hango_worker.tool.registry import Registry

    names = Registry.default(modules=settings.tool_modules).names()
    probe = State(run_id="", session_id="", agent_id="", tenant_id="")
    for mw in default_stack(StackConfig(allowlist=())):
        provide = getattr(mw, "provide_tools", None)
        if provide is not None:
            names += [t.name for t in provide(probe) if t.name not in names]
    return names + [t for t in PROVIDED_TOOLS if t not in names]


async def cmd_agents_create(s: Settings, a: argparse.Namespace) -> int:
    from hango_worker.agent.spec import AgentConfig, skills_problem

    try:
        cfg = AgentConfig.model_validate(json_arg(a.config, "--config")).model_dump(
            exclude_none=True
        )
    except ValidationError as e:
        why = "; ".join(
            f"{'.'.join(map(str, x['loc'])) or 'value'}: {x['msg']}" for x in e.errors()
        )
        raise CliError(f"--config is not a valid agent config: {why}") from None
    except (ValueError, TypeError) as e:
        raise CliError(f"--config is not valid JSON: {e}") from None
    from hango_worker.tool.mcp_config import mcp_problem, server_of

    mcp_names = [t for t in a.tool or [] if server_of(t)]  # an MCP server's, listed per attempt
    tools = check_tools(a.tool or [], known_tools(s) + mcp_names)
    config = AgentConfig.model_validate(cfg)
    if problem := skills_problem(tools, config):
        raise CliError(f"--config: {problem} (add --tool load_skill)")
    if problem := mcp_problem(tools, config.mcp_servers):
        raise CliError(f"--config: {problem}")
    if problem := _fleet_platform_problem(s, config):
        raise CliError(f"--config: {problem} (the fleet's HANGO_PLATFORM)")
    async with pool_for(s) as (_, pool):
        tenant = await tenant_of(pool, a)
        agent_id = await repo.create_agent(
            pool,
            tenant_id=tenant,
            name=a.name,
            model=a.model,
            system=a.system or [],
            tools=tools,
            config=cfg,
        )
    print(json.dumps({"agent_id": agent_id}) if a.json else agent_id)
    return exits.OK


def _fleet_platform_problem(s: Settings, config: Any) -> str | None:
    """What the fleet's platform lacks, for an agent that leaves its platform to the
    fleet (its own `platform` is checked by AgentConfig: provider/platforms.py)."""
    from hango_worker.provider.platforms import platform_problem

    if config.platform is not None:
        return None
    return platform_problem(
        s.platform,
        files_api=config.files_api,
        server_tools=config.server_tools,
        params=config.api_params(),
    )


async def cmd_agents_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        agents = await repo.list_agents(pool, await tenant_of(pool, a))
    if a.json:
        out(agents)
        return exits.OK
    for ag in agents:
        print(f"{ag['id']}  {ag['name']:<20} {ag['model']:<28} tools={','.join(ag['tools'])}")
    return exits.OK


async def cmd_agents_limit(s: Settings, a: argparse.Namespace) -> int:
    n = None if a.no_limit else a.max_running
    async with pool_for(s) as (_, pool):
        await t.set_agent_max_running(pool, await tenant_of(pool, a), a.agent, n)
    print(f"{a.agent}: max_running={'-' if n is None else n}")
    return exits.OK
