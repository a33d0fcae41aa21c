"""Tool and ToolResult."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from hango_worker.provider.types import ToolResultBlock, ToolSpec


@dataclass(slots=True, frozen=True)
class ToolResult:
    content: str
    is_error: bool = False

    @classmethod
    def error(cls, message: str) -> ToolResult:
        return cls(content=message, is_error=True)

    def to_block(self, tool_use_id: str) -> ToolResultBlock:
        return ToolResultBlock(
            tool_use_id=tool_use_id, content=self.content, is_error=self.is_error
        )

    def to_dict(self) -> dict[str, Any]:
        return {"content": self.content, "is_error": self.is_error}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ToolResult:
        return cls(content=str(d.get("content", "")), is_error=bool(d.get("is_error", False)))


@dataclass(slots=True, frozen=True)
class ToolContext:
    """What a tool knows about the call it serves (ids for idempotency keys, logging)."""

    run_id: str
    tenant_id: str
    tool_use_id: str


ToolFn = Callable[[dict[str, Any], ToolContext], Awaitable["ToolResult | str"]]


@dataclass(slots=True)
class Tool:
    """A callable tool. `idempotent` tools may be re-executed after a crash;
    others never are (their interrupted calls are repaired instead)."""

    name: str
    description: str
    input_schema: dict[str, Any]
    call: ToolFn
    idempotent: bool = False
    _validator: Any = field(default=None, init=False, repr=False)

    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.input_schema)

    def validate(self, args: Any) -> str | None:
        """None when `args` satisfies the input schema, else a message for the model."""
        if self._validator is None:
            cls = jsonschema.validators.validator_for(self.input_schema)
            self._validator = cls(self.input_schema)
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.path))
        if not errors:
            return None
        parts = []
        for e in errors[:3]:
            where = "/".join(str(p) for p in e.absolute_path) or "(root)"
            parts.append(f"{where}: {e.message}")
        return f"invalid arguments for tool '{self.name}': " + "; ".join(parts)

    async def invoke(self, args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Validate, then call. Never raises: failures become error results."""
        problem = self.validate(args)
        if problem is not None:
            return ToolResult.error(problem)
        try:
            out = await self.call(args, ctx)
        except Exception as e:  # a tool's bug must not take the run down
            return ToolResult.error(f"tool '{self.name}' failed: {type(e).__name__}: {e}")
        return out if isinstance(out, ToolResult) else ToolResult(content=str(out))
