"""The argument parser: every command, its options and their types.

Each cli module with commands exposes `register(sub)` and its handlers (`cmd_*`);
COMMANDS is the one list of them, in the order `hango-worker --help` shows them
(subcommands.py: `command`, `group`)."""

from __future__ import annotations

import argparse
from typing import NoReturn

from hango_worker import __version__
from hango_worker.cli import (
    agents,
    budgets,
    console,
    decide,
    demo,
    enqueue,
    exits,
    export,
    files,
    fork,
    gc,
    history,
    memory,
    migrating,
    purge,
    ratelimits,
    replay,
    retention,
    runs,
    skills,
    tenants,
    worker,
)

EXIT_CODES = (
    "exit codes: 0 ok; 1 the run did not succeed (demo, runs watch), a replay "
    "diverged; 2 usage or "
    "configuration error; 3 not found; 4 conflict; 5 database unavailable (unreachable, "
    "missing, credentials refused, not migrated or newer schema); 130 interrupted"
)

# `runs`' verbs: runs.py (list, show, watch, cancel, resume), then decide.py, fork.py,
# history.py, files.py and export.py add theirs to the same group (runs.verbs); purge.py
# adds `runs purge` and `tenants purge` after `tenants`' own verbs.
COMMANDS = (
    worker,
    migrating,
    demo,
    enqueue,
    agents,
    runs,
    decide,
    fork,
    history,
    files,
    export,
    replay,
    memory,
    skills,
    ratelimits,
    budgets,
    tenants,
    purge,
    console,
    gc,
    retention,
)


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(exits.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="hango-worker",
        description="Durable run-worker for LLM agents on Postgres. Configured by HANGO_* "
        "environment variables (see README).",
        epilog=EXIT_CODES,
    )
    p.add_argument("--version", action="version", version=f"hango-worker {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.register(sub)
    return p
