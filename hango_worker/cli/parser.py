"""The argument parser: every command, its options and their types."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

from hango_worker import __version__
from hango_worker.cli import commands as c
from hango_worker.cli import exits, migrating, tenants
from hango_worker.cli.inputs import (
    MAX_BATCH_SIZE,
    MAX_LIMIT,
    STATUSES,
    a_uuid,
    int_between,
    memory_key,
    memory_path,
    name,
    new_name,
    text,
)
from hango_worker.config import Settings
from hango_worker.store.repo import MAX_PRIORITY

Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]

EXIT_CODES = (
    "exit codes: 0 ok; 1 the run did not succeed (demo, runs watch); 2 usage or "
    "configuration error; 3 not found; 4 conflict; 5 database unavailable (unreachable, "
    "missing, credentials refused, not migrated or newer schema); 130 interrupted"
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

    def cmd(
        name: str, fn: Handler, help: str, parent: Any = sub, tenanted: bool = True
    ) -> argparse.ArgumentParser:
        sp: argparse.ArgumentParser = parent.add_parser(name, help=help, description=help)
        sp.set_defaults(fn=fn)
        if tenanted and parent is not sub:  # every command on runs, agents, memory, skills
            _tenant_option(sp)
        return sp

    r = cmd("run", c.cmd_run, "run the worker service")
    r.add_argument("--until-idle", action="store_true", help="exit once nothing is queued")
    m = cmd("migrate", c.cmd_migrate, "migrate the database to the latest schema")
    migrating.add_options(m)
    cmd("demo", c.cmd_demo, "start an embedded Postgres and run a demo agent end to end")
    _enqueue(cmd)
    _agents(sub, cmd)
    _runs(sub, cmd)
    _memory(sub, cmd)
    _skills(sub, cmd)
    tenants.add_commands(sub, cmd)
    _console(sub, cmd)

    g = cmd(
        "gc", c.cmd_gc, "delete finished runs' events (and with --runs the runs) older than AGE"
    )
    g.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 45m")
    g.add_argument("--runs", action="store_true", help="also delete the runs themselves")
    g.add_argument(
        "--batch-size",
        type=int_between(1, MAX_BATCH_SIZE),
        default=1000,
        help=f"rows per short transaction (1-{MAX_BATCH_SIZE})",
    )
    g.add_argument("--tenant", type=a_uuid("a tenant id"), help="only this tenant (default: all)")
    g.add_argument("--json", action="store_true", help="(the summary is always JSON)")
    return p


def _enqueue(cmd: Callable[..., argparse.ArgumentParser]) -> None:
    e = cmd("enqueue", c.cmd_enqueue, "queue a run; prints its id")
    _tenant_option(e)
    e.add_argument(
        "--priority",
        type=int_between(0, MAX_PRIORITY),
        default=0,
        help=f"0-{MAX_PRIORITY} (default 0); within the tenant, higher is claimed first",
    )
    e.add_argument("--agent", required=True, type=text, help="agent name or id")
    given = e.add_mutually_exclusive_group()
    given.add_argument("--input", type=text, help="the user's message ('-': read stdin)")
    given.add_argument("--input-file", type=text, metavar="PATH", help="read it from a file")
    e.add_argument(
        "--attach",
        action="append",
        type=text,
        metavar="PATH",
        help="an image (PNG, JPEG, GIF, WebP) or PDF beside the message; repeatable",
    )
    e.add_argument(
        "--input-json",
        type=text,
        metavar="FILE",
        help="content blocks as JSON (a list, or {\"content\": [...]}; '-': stdin)",
    )
    e.add_argument("--session", type=a_uuid("a session id"), help="continue its history")
    e.add_argument(
        "--limits",
        type=text,
        metavar="JSON",
        help='this run\'s own limits, e.g. {"max_turns": 10, "max_output_tokens": 20000}',
    )
    e.add_argument(
        "--params",
        type=text,
        metavar="JSON",
        help="Messages API parameters for this run, over the agent's config, e.g. "
        '{"thinking": {"type": "enabled", "budget_tokens": 2048}}',
    )
    e.add_argument(
        "--memory-key",
        type=memory_key,
        help="whose memory the run uses when its agent's memory_scope is 'key' (e.g. a user id)",
    )
    e.add_argument("--json", action="store_true")


def _tenant_option(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--tenant",
        dest="tenant_name",
        type=name,
        metavar="TENANT",
        help="the tenant's name or id (default: the default tenant)",
    )


def _console(sub: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    from hango_worker.cli.console import cmd_console

    cmd(
        "console",
        cmd_console,
        "serve the run console (web pages) on HANGO_CONSOLE_HOST:HANGO_CONSOLE_PORT; needs "
        "HANGO_CONSOLE_TOKENS or HANGO_CONSOLE_PROXY_HEADER",
    )


def _agents(sub: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    ag = sub.add_parser("agents", help="create and list agents").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    c_ = cmd("create", c.cmd_agents_create, "create an agent; prints its id", ag)
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
    cmd("list", c.cmd_agents_list, "list agents", ag).add_argument("--json", action="store_true")
    tenants.add_agent_limit(ag, cmd)


def _runs(sub: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    rs = sub.add_parser("runs", help="inspect and control runs").add_subparsers(
        dest="sub", required=True, metavar="SUBCOMMAND"
    )
    ls = cmd("list", c.cmd_runs_list, "recent runs", rs)
    ls.add_argument("--status", choices=STATUSES)
    ls.add_argument(
        "--limit", type=int_between(1, MAX_LIMIT), default=50, help=f"1-{MAX_LIMIT} (default 50)"
    )
    ls.add_argument("--json", action="store_true")
    for verb, fn, h in (
        ("show", c.cmd_runs_show, "status, attempt, transcript, state, events, error"),
        ("watch", c.cmd_runs_watch, "follow a run live until it ends"),
        ("cancel", c.cmd_runs_cancel, "cancel a run (at its next turn boundary)"),
        ("resume", c.cmd_runs_resume, "re-queue a cancelled or failed run from its checkpoint"),
    ):
        sp = cmd(verb, fn, h, rs)
        sp.add_argument("run_id", type=a_uuid("a run id"))
        sp.add_argument("--json", action="store_true")
    _decisions(rs, cmd)


def _decisions(rs: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    from hango_worker.cli import decide as d

    for verb, fn, h in (
        ("approve", d.cmd_runs_approve, "approve the call a waiting run waits on"),
        ("reject", d.cmd_runs_reject, "reject the call a waiting run waits on, with a reason"),
        ("answer", d.cmd_runs_answer, "answer the question a waiting run asks"),
    ):
        sp = cmd(verb, fn, h, rs)
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
    fk = cmd("fork", d.cmd_runs_fork, "a new run from the end of one of this run's turns", rs)
    fk.add_argument("run_id", type=a_uuid("a run id"))
    fk.add_argument(
        "--at-turn", type=int_between(0, 1_000_000), required=True, help="0: before turn 1"
    )
    given = fk.add_mutually_exclusive_group()
    given.add_argument("--input", type=text, help="the user's next message ('-': read stdin)")
    given.add_argument("--input-file", type=text, metavar="PATH", help="read it from a file")
    fk.add_argument("--json", action="store_true")
    tr = cmd("tree", d.cmd_runs_tree, "the run and its child runs (subagents), with statuses", rs)
    tr.add_argument("run_id", type=a_uuid("a run id"))
    tr.add_argument("--json", action="store_true")
    hs = cmd("history", d.cmd_runs_history, "the run's turns: time, tools, state changed", rs)
    hs.add_argument("run_id", type=a_uuid("a run id"))
    hs.add_argument("--json", action="store_true")
    fl = cmd("files", c.cmd_runs_files, "the run's files: path, size, tool call, updated", rs)
    fl.add_argument("run_id", type=a_uuid("a run id"))
    fl.add_argument("--json", action="store_true")
    f1 = cmd(
        "file", c.cmd_runs_file, "print one of the run's files (control sequences removed)", rs
    )
    f1.add_argument("run_id", type=a_uuid("a run id"))
    f1.add_argument("path", type=text, help="the file's path, as `runs files` lists it")
    f1.add_argument("--json", action="store_true", help="with size, tool call and times")


def _memory(sub: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    mem = sub.add_parser(
        "memory",
        help="inspect and remove agents' long-term memory files",
        description="Memory files of this tenant. Scope: an agent's own memory, or with "
        "--session one session's, or with --key one caller's (memory_scope 'key').",
    ).add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")

    def scoped(sp: argparse.ArgumentParser, agent_required: bool) -> None:
        sp.add_argument("--agent", required=agent_required, type=text, help="agent name or id")
        which = sp.add_mutually_exclusive_group()
        which.add_argument("--session", type=a_uuid("a session id"), help="a session's memory")
        which.add_argument("--key", type=memory_key, help="a caller's memory (its memory key)")
        sp.add_argument("--json", action="store_true")

    ls = cmd("ls", c.cmd_memory_ls, "list memory files (path, scope, size, version)", mem)
    scoped(ls, agent_required=False)
    ls.add_argument("--limit", type=int_between(1, MAX_LIMIT), default=1000, help=f"1-{MAX_LIMIT}")
    for verb, fn, h in (
        ("show", c.cmd_memory_show, "print one memory file"),
        ("rm", c.cmd_memory_rm, "delete one memory file"),
    ):
        sp = cmd(verb, fn, h, mem)
        sp.add_argument("path", type=memory_path, help="e.g. /memories/notes.md")
        scoped(sp, agent_required=True)


def _skills(sub: Any, cmd: Callable[..., argparse.ArgumentParser]) -> None:
    from hango_worker.cli import skills as s

    sk = sub.add_parser(
        "skills",
        help="register and inspect Agent Skills (enabled per agent by config.skills)",
    ).add_subparsers(dest="sub", required=True, metavar="SUBCOMMAND")
    add = cmd("add", s.cmd_skills_add, "store a skill folder (SKILL.md) as a new version", sk)
    add.add_argument("path", type=text, help="the skill's folder (holding SKILL.md)")
    add.add_argument("--json", action="store_true")
    ls = cmd("list", s.cmd_skills_list, "skills: name, latest version, description", sk)
    ls.add_argument("--json", action="store_true")
    sh = cmd("show", s.cmd_skills_show, "a skill's description, body and files", sk)
    sh.add_argument("name", type=text)
    sh.add_argument("--version", type=int_between(1, 1_000_000_000), help="default: latest")
    sh.add_argument("--json", action="store_true")
