"""A skill folder is stored from its own files only (store/skills.py): symbolic links
anywhere are refused naming the file, deep trees and odd names are one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hango_worker.store.skills import MAX_DEPTH, SkillError, read_folder

SKILL = "---\nname: demo\ndescription: A demo skill.\n---\nDo the thing.\n"


def skill(tmp_path: Path) -> Path:
    root = tmp_path / "demo"
    root.mkdir()
    (root / "SKILL.md").write_text(SKILL)
    return root


def test_a_plain_folder_is_read(tmp_path: Path) -> None:
    root = skill(tmp_path)
    (root / "ref").mkdir()
    (root / "ref" / "notes.md").write_text("notes")
    assert read_folder(root).files == {"ref/notes.md": "notes"}


def test_a_symlinked_skill_md_is_refused(tmp_path: Path) -> None:
    """Proves: SKILL.md pointing outside the folder is never read."""
    secret = tmp_path / "secret.md"
    secret.write_text(SKILL.replace("Do the thing.", "the secret"))
    root = tmp_path / "demo"
    root.mkdir()
    (root / "SKILL.md").symlink_to(secret)
    with pytest.raises(SkillError, match=r"^SKILL\.md is a symbolic link"):
        read_folder(root)


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_symlink_inside_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    """Proves: a link to a file or a folder outside is refused, not followed and not
    skipped silently (a linked folder used to vanish from the stored skill)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "key.pem").write_text("private")
    root = skill(tmp_path)
    target = outside / "key.pem" if kind == "file" else outside
    (root / "linked").symlink_to(target)
    with pytest.raises(SkillError, match=r"^linked is a symbolic link"):
        read_folder(root)


def test_a_deep_tree_is_one_line_not_a_recursion_error(tmp_path: Path) -> None:
    root = skill(tmp_path)
    deep = root
    for i in range(MAX_DEPTH + 5):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    with pytest.raises(SkillError, match=f"more than {MAX_DEPTH} folders deep"):
        read_folder(root)


def test_names_that_are_not_utf8_or_hold_escapes_are_quoted(tmp_path: Path) -> None:
    root = skill(tmp_path)
    raw = os.fsencode(root) + b"/bad\xff.md"
    with open(raw, "wb") as f:
        f.write(b"x")
    with pytest.raises(SkillError) as e:
        read_folder(root)
    assert "not UTF-8" in str(e.value) and "\\udcff" in str(e.value)
    os.remove(raw)
    (root / "\x1b[31mred.md").write_bytes(b"\x00binary")
    with pytest.raises(SkillError) as e:
        read_folder(root)
    assert "\x1b" not in str(e.value) and "\\x1b[31mred.md" in str(e.value)
