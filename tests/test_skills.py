"""Skills: Agent Skills folders registered per tenant, disclosed progressively.

In memory (the harness and its in-memory store) for the block and the tool; the
parser on its own; the CLI as an operator drives it; on Postgres (the real worker)
for tenants and versions.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from hango_worker.agent.spec import AgentSpec, AgentSpecError
from hango_worker.store import repo
from hango_worker.store import skills as sk
from hango_worker.testing.inmem import InMemorySkillStore, run_agent
from tests.helpers import agent, call, scripted
from tests.test_chain import CapturingProvider
from tests.test_cli import cli
from tests.worker_helpers import details, make_agent, run_until_idle

PDF_MD = """---
name: pdf-forms
description: Fill in PDF forms. Use when the user gives a PDF form to complete.
license: Apache-2.0
---
# Filling PDF forms

1. Read reference/fields.md first.
"""


def load(name: str, file: str | None = None) -> dict[str, Any]:
    args = {"name": name} if file is None else {"name": name, "file": file}
    return {"name": "load_skill", "input": args}


def loads(result: str) -> float:
    return REGISTRY.get_sample_value("hango_skill_loads_total", {"result": result}) or 0.0


def tool_results(io: Any) -> list[Any]:
    return list(io.tool_results.values())


def skill_folder(root: Path, skill_md: str, files: dict[str, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "SKILL.md").write_text(skill_md)
    for rel, text in (files or {}).items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


# -- in memory: the block, the tool ------------------------------------------------------------


async def test_blocks_carry_names_and_descriptions_only_and_load_skill_returns_the_body(
    spans: Any,
) -> None:
    store = InMemorySkillStore()
    store.add("tenant-1", "pdf-forms", "Fill in PDF forms.", "SECRET BODY", {"ref/f.md": "FIELDS"})
    store.add("tenant-1", "csv", "Clean CSV files.", "CSV BODY")
    a = agent(tools=["load_skill", "write_todos"], skills=["csv", "pdf-forms"])
    a = a.model_copy(update={"system": ["Agent block one.", "Agent block two."]})
    provider = CapturingProvider(
        scripted(
            {"tool_calls": [call("write_todos", todos=[{"content": "x", "status": "pending"}])]},
            {"tool_calls": [load("pdf-forms")]},
            {"tool_calls": [load("pdf-forms", "ref/f.md")]},
            {"text": "done"},
        )
    )
    before = (loads("body"), loads("file"))
    out, _, io = await run_agent(a, provider, skills=store)
    assert out.status == "succeeded"
    system = [b.text for b in provider.requests[0].system]
    assert system[:2] == ["Agent block one.", "Agent block two."]
    block = system[2]  # right after the agent's blocks: Skills is the outermost contributor
    assert "- csv: Clean CSV files.\n- pdf-forms: Fill in PDF forms." in block
    assert not any("BODY" in t or "FIELDS" in t for t in system)  # names and descriptions only
    last = provider.requests[-1].system
    assert last[3].text.startswith("Current todo list")  # Todo's plan comes after it
    for req in provider.requests:  # byte-stable for the attempt
        assert req.system[2].text == block
    body, file = tool_results(io)[1:]
    assert not body.is_error and "SECRET BODY" in body.content and "- ref/f.md" in body.content
    assert not file.is_error and file.content == "FIELDS"
    assert (loads("body"), loads("file")) == (before[0] + 1, before[1] + 1)
    (hook,) = spans.named("agent.before_run skills")
    (event,) = hook.events
    assert event.name == "agent.skills_loaded"
    assert event.attributes["hango.skills.count"] == 2
    used = spans.events("agent.skill_used")
    assert [e.attributes["hango.skill.result"] for e in used] == ["body", "file"]


async def test_unknown_skill_file_and_missing_skill_are_clear(spans: Any) -> None:
    """A skill enabled but not registered is left out of the block and named on the
    span event; load_skill on it, or on a file the skill lacks, is a tool error."""
    store = InMemorySkillStore()
    store.add("tenant-1", "csv", "Clean CSV files.", "CSV BODY")
    a = agent(tools=["load_skill"], skills=["csv", "not-there"])
    provider = CapturingProvider(
        scripted(
            {"tool_calls": [load("not-there")]},
            {"tool_calls": [load("csv", "nope.md")]},
            {"text": "done"},
        )
    )
    before = (loads("unknown_skill"), loads("unknown_file"))
    out, _, io = await run_agent(a, provider, skills=store)
    assert out.status == "succeeded"
    assert "not-there" not in provider.requests[0].system[1].text
    unknown, no_file = tool_results(io)
    assert unknown.is_error and unknown.content == "Unknown skill 'not-there'. Your skills: csv."
    assert no_file.is_error and "has no file 'nope.md'" in no_file.content
    assert (loads("unknown_skill"), loads("unknown_file")) == (before[0] + 1, before[1] + 1)
    (event,) = spans.events("agent.skills_loaded")
    assert event.attributes["hango.skills.missing"] == "not-there"


async def test_an_agent_without_skills_gets_no_block_and_no_tool() -> None:
    provider = CapturingProvider(scripted({"text": "ok"}))
    await run_agent(agent(tools=["load_skill", "calculator"]), provider)
    assert [t.name for t in provider.requests[0].tools] == ["calculator"]
    assert len(provider.requests[0].system) == 1


def test_skills_need_the_load_skill_tool() -> None:
    row = {"id": "1", "name": "a", "model": "m", "tools": [], "config": {"skills": ["csv"]}}
    with pytest.raises(AgentSpecError, match="do not include 'load_skill'"):
        AgentSpec.from_row(row)


# -- the parser ---------------------------------------------------------------------------------


def test_a_skill_folder_is_parsed(tmp_path: Path) -> None:
    folder = skill_folder(tmp_path / "pdf", PDF_MD, {"reference/fields.md": "name: text field"})
    s = sk.read_folder(folder)
    assert (s.name, s.description) == (
        "pdf-forms",
        "Fill in PDF forms. Use when the user gives a PDF form to complete.",
    )
    assert s.body.startswith("# Filling PDF forms") and "---" not in s.body
    assert s.files == {"reference/fields.md": "name: text field"}


@pytest.mark.parametrize(
    ("skill_md", "problem"),
    [
        ("# no front matter\n", "has no front matter"),
        ("---\ndescription: d\n---\nbody\n", "has no 'name'"),
        ("---\nname: PDF Forms\ndescription: d\n---\nbody\n", "name 'PDF Forms' is not valid"),
        ("---\nname: pdf\n---\nbody\n", "has no 'description'"),
        ("---\nname: pdf\ndescription: d\nbody\n", "is not closed"),
        (f"---\nname: {'a' * 65}\ndescription: d\n---\nbody\n", "is not valid"),
        ("---\nname: pdf\ndescription: >\n  folded\n---\nbody\n", "does not support"),
    ],
)
def test_a_malformed_skill_md_is_refused_with_its_problem(
    tmp_path: Path, skill_md: str, problem: str
) -> None:
    with pytest.raises(sk.SkillError, match=problem):
        sk.read_folder(skill_folder(tmp_path / "s", skill_md))


def test_binary_files_and_quoted_values(tmp_path: Path) -> None:
    md = "---\nname: 'pdf'\ndescription: \"Forms: fill them\"\n---\nbody\n"
    folder = skill_folder(tmp_path / "s", md)
    assert sk.read_folder(folder).description == "Forms: fill them"
    (folder / "logo.png").write_bytes(b"\x89PNG\x00\x01")
    with pytest.raises(sk.SkillError, match=r"logo\.png is a binary file"):
        sk.read_folder(folder)
    (folder / "logo.png").unlink()
    (folder / "big.md").write_text("x" * (sk.MAX_FILE_BYTES + 1))
    with pytest.raises(sk.SkillError, match=r"big\.md is 262145 bytes; at most 262144"):
        sk.read_folder(folder)


# -- the CLI ------------------------------------------------------------------------------------


async def _count(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM skills"))
    finally:
        await conn.close()


async def test_skills_add_list_show_and_malformed_folders(dsn: str, tmp_path: Path) -> None:
    for i, bad in enumerate(("# none\n", "---\ndescription: d\n---\nb\n", "---\nname: X\n---\n")):
        p = cli(dsn, "skills", "add", str(skill_folder(tmp_path / f"bad{i}", bad)), ok=False)
        assert p.returncode == 2, p.stderr
        assert "not a valid skill: SKILL.md" in p.stderr and "Traceback" not in p.stderr
    missing = cli(dsn, "skills", "add", str(tmp_path / "nowhere"), ok=False)
    assert missing.returncode == 2 and "is not a folder" in missing.stderr
    assert await _count(dsn) == 0  # nothing stored
    good = skill_folder(tmp_path / "pdf", PDF_MD, {"ref.md": "R"})
    assert cli(dsn, "skills", "add", str(good)).stdout == "pdf-forms version 1\n"
    (good / "SKILL.md").write_text(PDF_MD.replace("Fill in", "Complete"))
    assert cli(dsn, "skills", "add", str(good)).stdout == "pdf-forms version 2\n"
    listed = cli(dsn, "skills", "list").stdout
    assert listed.split()[:3] == ["pdf-forms", "v2", "Complete"]
    shown = cli(dsn, "skills", "show", "pdf-forms").stdout
    assert shown.startswith("pdf-forms version 2: Complete") and "file: ref.md" in shown
    assert "Fill in" in cli(dsn, "skills", "show", "pdf-forms", "--version", "1").stdout
    nothing = cli(dsn, "skills", "show", "nope", ok=False)
    assert nothing.returncode == 3 and "no skill 'nope'" in nothing.stderr
    create = ("agents", "create", "--name", "clerk", "--model", "m")
    skills = ("--config", '{"skills": ["pdf-forms"]}')
    refused = cli(dsn, *create, *skills, ok=False)
    assert refused.returncode == 2 and "add --tool load_skill" in refused.stderr
    cli(dsn, *create, *skills, "--tool", "load_skill")


# -- on Postgres: tenants and versions ------------------------------------------------------


async def test_latest_version_of_the_runs_tenant_only(pool: asyncpg.Pool, dsn: str) -> None:
    tenant = await repo.ensure_default_tenant(pool)
    v1 = sk.SkillFolder("pdf-forms", "Old forms.", "OLD BODY")
    assert await sk.add_skill(pool, tenant, v1) == 1
    v2 = sk.SkillFolder("pdf-forms", "New forms.", "NEW BODY", {"a.md": "A"})
    assert await sk.add_skill(pool, tenant, v2) == 2
    t2 = str(uuid.uuid4())
    await pool.execute("INSERT INTO tenants (id, name) VALUES ($1, 'second')", t2)
    await sk.add_skill(pool, t2, sk.SkillFolder("secret", "Another tenant's.", "HIDDEN"))
    await make_agent(
        pool, name="sk", tools=["load_skill"], config={"skills": ["pdf-forms", "secret"]}
    )
    r = await repo.enqueue_run(pool, tenant_id=tenant, agent="sk", input_text="go")
    provider = CapturingProvider(
        scripted(
            {"tool_calls": [load("pdf-forms")]},
            {"tool_calls": [load("secret")]},
            {"text": "done"},
        )
    )
    await run_until_idle(dsn, provider)
    run = await details(pool, r.run_id)
    assert run["status"] == "succeeded"
    block = provider.requests[0].system[1].text
    assert "- pdf-forms: New forms." in block and "Old" not in block and "secret" not in block
    body, hidden = [e["payload"] for e in run["events"] if e["type"] == "tool_result"]
    assert "NEW BODY" in body["content"] and "version 2" in body["content"]
    assert hidden["is_error"] and "Unknown skill 'secret'" in hidden["content"]
