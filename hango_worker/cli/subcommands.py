"""How a cli module adds its commands: each one with commands exposes
`register(sub)` (`sub`: the top-level subparsers), and parser.py calls every
module's `register` from its one list, COMMANDS. `command` adds one command and
its handler, `group` a command holding subcommands (`runs`, `agents`, …)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TypeAlias

from hango_worker.cli import inputs
from hango_worker.config import Settings

Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def command(
    sub: Subcommands, name: str, fn: Handler, help: str, *, tenanted: bool
) -> argparse.ArgumentParser:
    """The command `name`, run by `fn`; `tenanted`: it takes `--tenant` (first option)."""
    sp = sub.add_parser(name, help=help, description=help)
    sp.set_defaults(fn=fn)
    if tenanted:
        tenant_option(sp)
    return sp


def group(sub: Subcommands, name: str, help: str, description: str | None = None) -> Subcommands:
    """The subcommands of the command `name` (added on first use): `hango-worker NAME …`."""
    if name in sub.choices:
        parser = sub.choices[name]
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return found[0]
    parser = sub.add_parser(name, help=help, description=description)
    return parser.add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")


def tenant_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--tenant",
        dest="tenant_name",
        type=inputs.name,
        metavar="TENANT",
        help="the tenant's name or id (default: the default tenant)",
    )
