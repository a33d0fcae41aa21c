"""`skills add|list|show`: Agent Skills registered in the tenant (store/skills.py)."""

from __future__ import annotations

import argparse
import json

from hango_worker.cli import exits
from hango_worker.cli.database import pool_for, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.cli.inputs import int_between, text
from hango_worker.cli.output import out, print_rows
from hango_worker.cli.subcommands import Subcommands, command, group
from hango_worker.config import Settings
from hango_worker.render import safe
from hango_worker.store import skills as sk


def register(sub: Subcommands) -> None:
    g = group(
        sub, "skills", "register and inspect Agent Skills (enabled per agent by config.skills)"
    )
    add = command(
        g, "add", cmd_skills_add, "store a skill folder (SKILL.md) as a new version", tenanted=True
    )
    add.add_argument("path", type=text, help="the skill's folder (holding SKILL.md)")
    add.add_argument("--json", action="store_true")
    ls = command(
        g, "list", cmd_skills_list, "skills: name, latest version, description", tenanted=True
    )
    ls.add_argument("--json", action="store_true")
    sh = command(g, "show", cmd_skills_show, "a skill's description, body and files", tenanted=True)
    sh.add_argument("name", type=text)
    sh.add_argument("--version", type=int_between(1, 1_000_000_000), help="default: latest")
    sh.add_argument("--json", action="store_true")


async def cmd_skills_add(s: Settings, a: argparse.Namespace) -> int:
    try:
        skill = sk.read_folder(a.path)  # read and checked before the database is touched
    except sk.SkillError as e:
        raise CliError(f"{a.path}: not a valid skill: {e}") from None
    except OSError as e:
        raise CliError(f"{a.path}: cannot be read: {e.strerror or e}") from None
    async with pool_for(s) as (_, pool):
        tenant = await tenant_of(pool, a)
        version = await sk.add_skill(pool, tenant, skill)
    added = {"name": skill.name, "version": version, "files": len(skill.files)}
    print(json.dumps(added) if a.json else f"{skill.name} version {version}")
    return exits.OK


async def cmd_skills_list(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        rows = await sk.list_skills(pool, await tenant_of(pool, a))
    return print_rows(
        rows, a.json, lambda r: safe(f"{r['name']:<24} v{r['version']:<4} {r['description']}")
    )


async def cmd_skills_show(s: Settings, a: argparse.Namespace) -> int:
    async with pool_for(s) as (_, pool):
        row = await sk.get_skill(pool, await tenant_of(pool, a), a.name, a.version)
    if row is None:
        which = "" if a.version is None else f" version {a.version}"
        raise CliError(
            f"no skill {a.name!r}{which} in this tenant (`hango-worker skills list` lists them)",
            exits.NOT_FOUND,
        )
    if a.json:
        out(row)
        return exits.OK
    print(safe(f"{row['name']} version {row['version']}: {row['description']}"))
    print(safe(row["body"]))
    for path in sorted(row["files"]):
        print(safe(f"file: {path}"))
    return exits.OK
