"""`skills add|list|show`: Agent Skills registered in the tenant (store/skills.py)."""

from __future__ import annotations

import argparse
import json

from hango_worker.cli import exits
from hango_worker.cli.commands import out, pool_for, print_rows, tenant_of
from hango_worker.cli.exits import CliError
from hango_worker.config import Settings
from hango_worker.render import safe
from hango_worker.store import skills as sk


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
