"""Run state: what a run carries between turns and across resumes.

`runs.state_json` is a plain serialisation of State minus `messages` (stored
append-only in the `messages` table), `scratch` (per tool batch, never
persisted) and `file_writes` (the outbox of run files, flushed by the durability
port inside the fenced commit of the tool result that produced them). Middlewares
keep their own typed state in `private[name]` and go through `load_private` /
`store_private`, never the dict itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hango_worker.provider.types import Message
from hango_worker.telemetry.tracing import state_missing

STATE_VERSION = 1


class Todo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str = Field(min_length=1)
    status: Literal["pending", "in_progress", "completed"]


@dataclass(frozen=True, slots=True)
class FileWrite:
    """One pending write of a run file (`run_files`): stored by `RunIO` in the same
    fenced statement as the tool result that produced it, then dropped from the outbox.
    `size` is the content's length in UTF-8 bytes."""

    path: str
    content: str
    size: int
    tool_use_id: str | None = None


class StateError(ValueError):
    """`runs.state_json` (or one middleware's part of it) cannot be read."""


@dataclass(slots=True)
class State:
    run_id: str
    session_id: str
    agent_id: str
    tenant_id: str
    messages: list[Message] = field(default_factory=list)
    todos: list[Todo] = field(default_factory=list)
    private: dict[str, Any] = field(default_factory=dict)
    scratch: dict[str, Any] = field(default_factory=dict)
    # outbox of run files, never persisted in state_json (see FileWrite)
    file_writes: list[FileWrite] = field(default_factory=list)


def dump_state(state: State) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "todos": [t.model_dump() for t in state.todos],
        "private": state.private,
    }


def load_state(
    raw: Any,
    *,
    run_id: str,
    session_id: str,
    agent_id: str,
    tenant_id: str,
    messages: list[Message] | None = None,
) -> State:
    """Rebuild typed state from `runs.state_json`; StateError names what is wrong."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise StateError(f"state_json must be a JSON object, got {type(raw).__name__}")
    version = raw.get("version", STATE_VERSION)
    if version != STATE_VERSION:
        raise StateError(f"state_json version {version!r} is not supported (expected 1)")
    unknown = set(raw) - {"version", "todos", "private"}
    if unknown:
        raise StateError(f"state_json has unknown keys: {sorted(unknown)}")
    todos_raw = raw.get("todos", [])
    if not isinstance(todos_raw, list):
        raise StateError("state_json.todos must be a list")
    try:
        todos = [Todo.model_validate(t) for t in todos_raw]
    except ValidationError as e:
        err = e.errors()[0]
        raise StateError(f"state_json.todos is malformed: {err['loc']}: {err['msg']}") from None
    private = raw.get("private", {})
    if not isinstance(private, dict):
        raise StateError("state_json.private must be an object keyed by middleware name")
    return State(
        run_id=run_id,
        session_id=session_id,
        agent_id=agent_id,
        tenant_id=tenant_id,
        messages=list(messages or []),
        todos=todos,
        private=dict(private),
    )


M = TypeVar("M", bound=BaseModel)


def load_private(state: State, name: str, model: type[M]) -> tuple[M, bool]:
    """Typed private state of middleware `name`.

    Missing → `(model(), False)`, i.e. the model's documented defaults, and a
    `middleware.state_missing` span event. Present but malformed → StateError
    naming the middleware: never a silent default.
    """
    raw = state.private.get(name)
    if raw is None:
        state_missing(name)
        return model(), False
    try:
        return model.model_validate(raw), True
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        raise StateError(
            f"private state of middleware {name!r} is malformed at {loc}: {err['msg']}"
        ) from None


def store_private(state: State, name: str, value: BaseModel) -> None:
    state.private[name] = value.model_dump(mode="json")
