"""Small builders shared by tests."""

from __future__ import annotations

from typing import Any

from hango_worker.agent.spec import AgentConfig, AgentSpec
from hango_worker.provider.scripted import ScriptedProvider
from hango_worker.tool.types import Tool, ToolContext, ToolResult


def agent(tools: list[str] | None = None, **config: Any) -> AgentSpec:
    return AgentSpec(
        id="agent-1",
        name="tester",
        model="claude-test",
        system=["You are a test agent."],
        tools=tools if tools is not None else ["calculator", "current_time"],
        config=AgentConfig(**config),
    )


def scripted(*turns: dict[str, Any]) -> ScriptedProvider:
    return ScriptedProvider(list(turns))


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "input": args}


def recording_tool(
    name: str = "echo", *, idempotent: bool = False
) -> tuple[Tool, list[dict[str, Any]]]:
    """A tool that echoes its text and records every real execution."""
    calls: list[dict[str, Any]] = []

    async def fn(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        calls.append(args)
        return ToolResult(f"echo: {args['text']}")

    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    return Tool(name, "Echoes its text.", schema, fn, idempotent=idempotent), calls
