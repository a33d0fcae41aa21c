"""Skills: Agent Skills enabled for the agent, disclosed progressively (docs/design.md §5.3).

- `before_run` loads the latest version of each skill named in the agent's
  `config.skills` once per attempt, from the run's tenant only (its own child span
  of agent.before_run, event `agent.skills_loaded`);
- `system_blocks` contributes one block listing each loaded skill's name and
  description only, rendered once per attempt: Skills is outermost in
  `default_stack`, so the block sits before the cache breakpoint and must stay
  byte-stable for the attempt;
- a `load_skill` tool (offered only to agents that list it) returns a skill's body
  and the list of its files, or with `file` one of its files.

An enabled skill the tenant does not have does not fail the run (a skill may be
added after the agent): it is left out of the block, logged as a warning and named
on the span event (`hango.skills.missing`); `load_skill` on it is a tool error.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from opentelemetry import trace
from pydantic import BaseModel, Field, StringConstraints, model_validator

from hango_worker.agent.middleware import StackContext
from hango_worker.agent.ports import Skill, SkillStore
from hango_worker.agent.state import State
from hango_worker.provider.types import TextBlock
from hango_worker.telemetry import metrics
from hango_worker.telemetry.tracing import current_turn_span
from hango_worker.tool.types import Tool, ToolContext, ToolResult

log = logging.getLogger(__name__)

TOOL_NAME = "load_skill"
DESCRIPTION = """\
Load one of your skills (listed in the system prompt under "Skills"): returns the \
skill's full instructions (its SKILL.md) and the list of its other files. Load a skill \
as soon as a task matches its description, before you start the task. With "file" (a \
path as the list shows it), returns that one file of the skill instead."""
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "the skill's name"},
        "file": {"type": "string", "description": "one of the skill's files (optional)"},
    },
    "required": ["name"],
}


# a skill's name, as Anthropic's Agent Skills format allows it (store/skills.py checks it too)
SKILL_NAME = r"^[a-z0-9]+(-[a-z0-9]+)*$"


class SkillsConfig(BaseModel):
    """The agent's setting (`agents.config`, a section of AgentConfig): the Agent Skills
    enabled for it, by name; they need the `load_skill` tool in the agent's tools
    (agent/spec.py:skills_problem)."""

    skills: list[Annotated[str, StringConstraints(pattern=SKILL_NAME, max_length=64)]] = Field(
        default_factory=list, max_length=100
    )

    @model_validator(mode="after")
    def _skills_unique(self) -> SkillsConfig:
        if len(set(self.skills)) != len(self.skills):
            raise ValueError("skills lists a skill twice")
        return self


def render(skills: list[Skill]) -> str:
    """The block: names and descriptions only (the bodies stay behind load_skill)."""
    lines = [
        "Skills: folders of instructions and files for specialised tasks. Each is listed "
        "by name with a description of when to use it. When a task matches a skill, call "
        f"`{TOOL_NAME}` with its name to read its instructions before you start.",
    ]
    lines += [f"- {s.name}: {s.description}" for s in skills]
    return "\n".join(lines)


def _record(result: str, **attrs: Any) -> None:
    metrics.SKILL_LOADS.labels(result).inc()
    current_turn_span().add_event("agent.skill_used", {"hango.skill.result": result, **attrs})


class Skills:
    """RunHook + PromptContributor + ToolProvider over the agent's enabled skills."""

    name = "skills"

    def __init__(self, store: SkillStore, names: tuple[str, ...]) -> None:
        self.store = store
        self.names = names
        self._skills: dict[str, Skill] = {}
        self._text: str | None = None  # the block, rendered once per attempt
        self._bound: tuple[State, Tool] | None = None

    async def before_run(self, state: State) -> None:
        found = {s.name: s for s in await self.store.latest(state.tenant_id, list(self.names))}
        # in the agent's order (not the store's), so the block is the same at every attempt
        self._skills = {n: found[n] for n in self.names if n in found}
        missing = [n for n in self.names if n not in found]
        self._text = render(list(self._skills.values())) if self._skills else None
        trace.get_current_span().add_event(
            "agent.skills_loaded",
            {
                "hango.skills.count": len(self._skills),
                "hango.skills.missing": ",".join(missing),
                "hango.skills.bytes": len(self._text.encode()) if self._text else 0,
            },
        )
        if missing:
            log.warning(
                "skills enabled for the agent are not registered in its tenant: %s "
                "(add them with `hango-worker skills add`)",
                ", ".join(missing),
                extra={"run_id": state.run_id},
            )

    def system_blocks(self, state: State) -> list[TextBlock]:
        return [] if self._text is None else [TextBlock(text=self._text)]

    def provide_tools(self, state: State) -> list[Tool]:
        if self._bound is None or self._bound[0] is not state:

            async def call(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
                return self.load(args)

            tool = Tool(TOOL_NAME, DESCRIPTION, SCHEMA, call, idempotent=True)
            self._bound = (state, tool)
        return [self._bound[1]]

    def load(self, args: dict[str, Any]) -> ToolResult:
        name, file = args.get("name"), args.get("file")
        skill = self._skills.get(name) if isinstance(name, str) else None
        if skill is None:
            _record("unknown_skill")
            known = ", ".join(self._skills) or "none"
            return ToolResult.error(f"Unknown skill {name!r}. Your skills: {known}.")
        attrs = {"hango.skill.name": skill.name, "hango.skill.version": skill.version}
        if file is None:
            _record("body", **attrs)
            listing = "\n".join(f"- {p}" for p in sorted(skill.files)) or "(none)"
            return ToolResult(
                f'Skill "{skill.name}" (version {skill.version}):\n\n{skill.body}\n\n'
                f"Files of this skill (read one with {TOOL_NAME} and file=PATH):\n{listing}"
            )
        text = skill.files.get(file) if isinstance(file, str) else None
        if text is None:
            _record("unknown_file", **attrs)
            listing = ", ".join(sorted(skill.files)) or "none"
            return ToolResult.error(
                f"Skill {skill.name!r} has no file {file!r}. Its files: {listing}."
            )
        _record("file", **attrs)
        return ToolResult(text)


def build(ctx: StackContext) -> Skills | None:
    """Only for agents that enable some (others: no load, no block)."""
    names = tuple(ctx.settings(SkillsConfig).skills)
    if not names:
        return None
    if ctx.skills is None:
        raise ValueError("the agent enables skills but the stack has no skill store")
    return Skills(ctx.skills, names)
