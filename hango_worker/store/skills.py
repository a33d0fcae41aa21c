"""Agent Skills registered per tenant (`hango-worker skills add|list|show`): cold path.

A skill is a folder in Anthropic's Agent Skills format: `SKILL.md` starts with YAML
front matter between two `---` lines holding `name` (lowercase letters, digits and
hyphens, at most 64 characters) and `description` (non-empty, at most 1024
characters); the rest of SKILL.md is the body. The folder's other files are stored
with it (text only, bounded in count and size).

The front matter is read by a minimal parser, not a YAML library (none is a runtime
dependency): one `key: value` per line, the value optionally in single or double
quotes; indented lines continue the previous value (folded with a space), `#` lines
are comments. Keys other than `name` and `description` (e.g. `license`,
`allowed-tools`, `metadata`) are accepted and ignored. A front matter this parser
cannot read is refused with the line it stopped at, never guessed at.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

SKILL_FILE = "SKILL.md"
NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_BODY_BYTES = 256 * 1024
# the folder's other files: at most this many, each at most this size
MAX_FILES = 50
MAX_FILE_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 2 * 1024 * 1024
SKIPPED_DIRS = frozenset({".git", "__pycache__", "node_modules"})


class SkillError(ValueError):
    """The folder is not a valid skill: the message names the problem."""


@dataclass(frozen=True, slots=True)
class SkillFolder:
    name: str
    description: str
    body: str
    files: dict[str, str] = field(default_factory=dict)


def _unquote(value: str, lineno: int) -> str:
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        inner = v[1:-1]
        return inner.replace("''", "'") if v[0] == "'" else inner.replace('\\"', '"')
    if v[:1] in ("'", '"', "|", ">", "[", "{", "&", "*", "!"):
        raise SkillError(
            f"{SKILL_FILE} front matter line {lineno}: value {v!r} uses YAML this reader does "
            "not support (write it as plain text on one line, or in matching quotes)"
        )
    return v


def front_matter(text: str) -> tuple[dict[str, str], str]:
    """(the front matter's `key: value` pairs, the body) of SKILL.md's text."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        raise SkillError(
            f"{SKILL_FILE} has no front matter: it must start with a line '---', then "
            "'name: ...' and 'description: ...', then a line '---'"
        )
    end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
    if end is None:
        raise SkillError(f"{SKILL_FILE} front matter is not closed by a line '---'")
    fields: dict[str, str] = {}
    last: str | None = None
    for i in range(1, end):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line[:1] in (" ", "\t"):
            if last is None or last not in ("name", "description"):
                continue  # a nested value of a key we ignore (e.g. metadata)
            fields[last] = f"{fields[last]} {line.strip()}".strip()
            continue
        key, sep, value = line.partition(":")
        if not sep or not key.strip():
            raise SkillError(f"{SKILL_FILE} front matter line {i + 1} is not 'key: value'")
        last = key.strip()
        fields[last] = _unquote(value, i + 1) if last in ("name", "description") else value
    body = "\n".join(lines[end + 1 :]).strip("\n")
    return fields, body


def check_fields(fields: dict[str, str]) -> tuple[str, str]:
    name, description = fields.get("name", "").strip(), fields.get("description", "").strip()
    if not name:
        raise SkillError(f"{SKILL_FILE} front matter has no 'name'")
    if len(name) > MAX_NAME_CHARS or not NAME.match(name):
        raise SkillError(
            f"{SKILL_FILE} name {name!r} is not valid: use lowercase letters, digits and "
            f"single hyphens (e.g. pdf-forms), at most {MAX_NAME_CHARS} characters"
        )
    if not description:
        raise SkillError(f"{SKILL_FILE} front matter has no 'description' (or it is empty)")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise SkillError(
            f"{SKILL_FILE} description is {len(description)} characters long; at most "
            f"{MAX_DESCRIPTION_CHARS}"
        )
    return name, description


def _read_text(path: Path, rel: str, limit: int) -> str:
    size = path.stat().st_size  # checked before reading: a huge file is never loaded
    if size > limit:
        raise SkillError(f"{rel} is {size} bytes; at most {limit} bytes per file")
    data = path.read_bytes()
    if b"\x00" in data:
        raise SkillError(f"{rel} is a binary file; a skill holds text files only")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SkillError(f"{rel} is not UTF-8 text; a skill holds text files only") from None


MAX_DEPTH = 16  # folders below the skill's own
MAX_ENTRIES = 10_000  # directory entries looked at, skipped ones included


def shown(rel: str) -> str:
    """A path for a message: as it is when every character is printable, else quoted with
    control characters and bytes that are not UTF-8 escaped (never raw to a terminal)."""
    return rel if rel.isprintable() else ascii(rel)


def _entries(root: Path) -> list[tuple[str, os.DirEntry[str]]]:
    """Every entry below `root` (relative path, entry), walked iteratively (a deep tree is
    an error naming the limit, never a RecursionError), skipped folders left out. A
    symbolic link anywhere, to a file or a folder, is refused naming it: a skill is
    stored from its own files only, never from outside its folder."""
    out: list[tuple[str, os.DirEntry[str]]] = []
    stack: list[tuple[Path, tuple[str, ...]]] = [(root, ())]
    seen = 0
    while stack:
        folder, parts = stack.pop()
        with os.scandir(folder) as it:
            for entry in sorted(it, key=lambda e: e.name):
                seen += 1
                if seen > MAX_ENTRIES:
                    raise SkillError(f"the skill folder has more than {MAX_ENTRIES} entries")
                rel_parts = (*parts, entry.name)
                rel = "/".join(rel_parts)
                try:
                    rel.encode("utf-8")
                except UnicodeEncodeError:
                    raise SkillError(f"{shown(rel)}: the file name is not UTF-8") from None
                if entry.is_symlink():
                    raise SkillError(
                        f"{shown(rel)} is a symbolic link; copy what it points to into the "
                        "skill instead"
                    )
                if entry.is_dir(follow_symlinks=False):
                    if entry.name in SKIPPED_DIRS:
                        continue
                    if len(rel_parts) > MAX_DEPTH:
                        raise SkillError(f"{shown(rel)} is more than {MAX_DEPTH} folders deep")
                    stack.append((Path(entry.path), rel_parts))
                elif entry.is_file(follow_symlinks=False):
                    out.append((rel, entry))
    return sorted(out, key=lambda x: x[0])


def _other_files(root: Path) -> dict[str, str]:
    files: dict[str, str] = {}
    total = 0
    for rel, entry in _entries(root):
        if rel == SKILL_FILE:
            continue
        if len(files) >= MAX_FILES:
            raise SkillError(f"the skill has more than {MAX_FILES} files besides {SKILL_FILE}")
        files[rel] = _read_text(Path(entry.path), shown(rel), MAX_FILE_BYTES)
        total += len(files[rel].encode())
        if total > MAX_TOTAL_BYTES:
            raise SkillError(f"the skill's files add up to more than {MAX_TOTAL_BYTES} bytes")
    return files


def read_folder(path: str | Path) -> SkillFolder:
    """The skill in folder `path` (or the folder of a SKILL.md given directly)."""
    root = Path(path)
    if root.is_file() and root.name == SKILL_FILE:
        root = root.parent
    if not root.is_dir():
        raise SkillError(
            f"{shown(str(path))} is not a folder (a skill is a folder holding {SKILL_FILE})"
        )
    skill_md = root / SKILL_FILE
    if skill_md.is_symlink():
        raise SkillError(
            f"{SKILL_FILE} is a symbolic link; copy what it points to into the skill instead"
        )
    if not skill_md.is_file():
        raise SkillError(f"{shown(str(path))} has no {SKILL_FILE}")
    text = _read_text(skill_md, SKILL_FILE, MAX_BODY_BYTES)
    fields, body = front_matter(text)
    name, description = check_fields(fields)
    if not body.strip():
        raise SkillError(f"{SKILL_FILE} has no body after its front matter (the instructions)")
    return SkillFolder(name, description, body, _other_files(root))


# -- the skills table -------------------------------------------------------------------


async def add_skill(db: asyncpg.Pool, tenant_id: str, skill: SkillFolder) -> int:
    """Store the skill as a new version (1 for a new name); returns the version."""
    async with db.acquire() as conn, conn.transaction():
        # one add at a time per (tenant, name), so two adds never pick the same version
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtext($1::text || '/' || $2::text))",
            tenant_id,
            skill.name,
        )
        version = await conn.fetchval(
            "INSERT INTO skills (tenant_id, name, version, description, body, files) "
            "SELECT $1, $2, coalesce(max(version), 0) + 1, $3, $4, $5 FROM skills "
            "WHERE tenant_id = $1 AND name = $2 RETURNING version",
            tenant_id,
            skill.name,
            skill.description,
            skill.body,
            skill.files,
        )
    return int(version)


async def list_skills(db: asyncpg.Pool, tenant_id: str) -> list[dict[str, Any]]:
    """Each skill of the tenant at its latest version (no body, no file contents)."""
    rows = await db.fetch(
        "SELECT DISTINCT ON (name) name, version, description, created_at, "
        "(SELECT count(*) FROM jsonb_object_keys(files)) AS files FROM skills "
        "WHERE tenant_id = $1 ORDER BY name, version DESC",
        tenant_id,
    )
    return [dict(r) for r in rows]


async def get_skill(
    db: asyncpg.Pool, tenant_id: str, name: str, version: int | None = None
) -> dict[str, Any] | None:
    """One skill (latest version unless `version`), with body and files; None if absent."""
    row = await db.fetchrow(
        "SELECT name, version, description, body, files, created_at FROM skills "
        "WHERE tenant_id = $1 AND name = $2 AND ($3::int IS NULL OR version = $3) "
        "ORDER BY version DESC LIMIT 1",
        tenant_id,
        name,
        version,
    )
    return None if row is None else dict(row)
