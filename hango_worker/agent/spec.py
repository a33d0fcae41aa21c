"""What the loop needs to know about an agent (the `agents` row, typed)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hango_worker.provider.types import TextBlock


class AgentConfig(BaseModel):
    """`agents.config`. Unknown keys are rejected so a typo is not silently ignored."""

    model_config = ConfigDict(extra="forbid")
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    max_tokens: int = Field(default=4096, ge=1, le=128_000)
    repeat_call_threshold: int | None = Field(default=None, ge=2, le=1000)
    temperature: float | None = Field(default=None, ge=0, le=1)
    # prompt-cache TTL of the stable prefix (tools + system); see agent/mw_prompt_cache.py
    cache_ttl: Literal["5m", "1h"] = "5m"


class AgentSpecError(ValueError):
    pass


class AgentSpec(BaseModel):
    model_config = ConfigDict(frozen=True)
    id: str
    name: str
    model: str
    system: list[str] = Field(default_factory=list)
    tools: list[str] = Field(default_factory=list)
    config: AgentConfig = Field(default_factory=AgentConfig)

    def system_blocks(self) -> list[TextBlock]:
        return [TextBlock(text=s) for s in self.system]

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> AgentSpec:
        try:
            system = row.get("system") or []
            if isinstance(system, list):
                system = [b["text"] if isinstance(b, dict) else str(b) for b in system]
            return cls(
                id=str(row["id"]),
                name=row["name"],
                model=row["model"],
                system=system,
                tools=list(row.get("tools") or []),
                config=AgentConfig.model_validate(row.get("config") or {}),
            )
        except (ValidationError, KeyError, TypeError) as e:
            raise AgentSpecError(
                f"agent {row.get('name')!r} has an invalid definition: {e}"
            ) from None
