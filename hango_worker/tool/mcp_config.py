"""`mcp_servers`: an agent's MCP servers, a config section of `agents.config`
(agent/spec.py composes it), and their secret references (docs/operations.md,
"MCP tools"). The client is tool/mcp_client.py."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# `mcp__<server>__<tool>`: the name the model sees (it must match tool/types.py TOOL_NAME)
PREFIX = "mcp__"
SEPARATOR = "__"
SERVER_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9-]{0,31}$")  # no "_": the name splits once
# headers and env variables whose value is a credential: only a secret reference
SENSITIVE = re.compile(r"auth|token|secret|key|password|cookie|credential", re.IGNORECASE)


def tool_name(server: str, tool: str) -> str:
    return f"{PREFIX}{server}{SEPARATOR}{tool}"


def server_of(name: str) -> str | None:
    """The server an `mcp__<server>__<tool>` name names (None: not an MCP tool name)."""
    if not name.startswith(PREFIX):
        return None
    server, sep, _ = name[len(PREFIX) :].partition(SEPARATOR)
    return server if sep else None


class SecretRef(BaseModel):
    """A value read from the worker's environment at attempt start: `{"env": NAME}` or
    `{"file": path}` (the file's text, stripped: a mounted secret)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError('a secret reference is {"env": NAME} or {"file": path}')
        return self

    def resolve(self, environ: Mapping[str, str]) -> str:
        """The value; SecretError (one line, naming the reference, never the value)."""
        if self.env is not None:
            value = environ.get(self.env)
            if value is None:
                raise SecretError(f"environment variable {self.env} is not set")
            return value
        assert self.file is not None
        try:
            return Path(self.file).read_text(encoding="utf-8").strip()
        except OSError as e:
            raise SecretError(f"secret file {self.file}: {e.strerror or e}") from None


class SecretError(ValueError):
    """A secret reference could not be resolved."""


Value = str | SecretRef


def _no_literal_secrets(values: Mapping[str, Value], what: str) -> None:
    for key, value in values.items():
        if isinstance(value, str) and SENSITIVE.search(key):
            raise ValueError(
                f"{what} {key!r} holds a literal value: a credential goes in a secret "
                f'reference, {{"env": NAME}} or {{"file": path}}, never in the agent\'s config'
            )


class McpServer(BaseModel):
    """One MCP server: streamable HTTP (`url`, `headers`) or stdio (`command`, `args`,
    `env`). `tools`: the server's tools offered to the model by their own names ("*":
    every tool it lists) beside those the agent's `tools` names as `mcp__<name>__<tool>`.
    `timeout_s` bounds one call, `open_timeout_s` opening the session and listing its
    tools; at most `max_concurrency` calls to it at once."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    url: str | None = None
    headers: dict[str, Value] = Field(default_factory=dict)
    command: str | None = None
    args: list[str] = Field(default_factory=list, max_length=64)
    env: dict[str, Value] = Field(default_factory=dict)
    tools: list[str] = Field(default_factory=list, max_length=256)
    timeout_s: float = Field(default=60.0, gt=0, le=3600)
    open_timeout_s: float = Field(default=30.0, gt=0, le=600)
    max_concurrency: int = Field(default=4, ge=1, le=64)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not SERVER_NAME.match(v):
            raise ValueError(f"MCP server name {v!r} must match {SERVER_NAME.pattern}")
        return v

    @model_validator(mode="after")
    def _transport(self) -> McpServer:
        where = f"MCP server {self.name!r}"
        if (self.url is None) == (self.command is None):
            raise ValueError(f"{where}: give either url (streamable HTTP) or command (stdio)")
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ValueError(f"{where}: url must be http:// or https://")
        if self.url is not None and (self.args or self.env):
            raise ValueError(f"{where}: args and env are for a stdio server (command)")
        if self.command is not None and self.headers:
            raise ValueError(f"{where}: headers are for an HTTP server (url)")
        _no_literal_secrets(self.headers, f"{where}: header")
        _no_literal_secrets(self.env, f"{where}: env")
        return self

    def offers(self, tool: str, agent_tools: Sequence[str]) -> bool:
        """Whether the server's `tool` is offered to an agent listing `agent_tools`."""
        return "*" in self.tools or tool in self.tools or tool_name(self.name, tool) in agent_tools

    def resolved(self, values: Mapping[str, Value], environ: Mapping[str, str]) -> dict[str, str]:
        """Headers or env with their secret references read (SecretError)."""
        out: dict[str, str] = {}
        for key, value in values.items():
            try:
                out[key] = value if isinstance(value, str) else value.resolve(environ)
            except SecretError as e:
                raise SecretError(f"MCP server {self.name!r}: {key}: {e}") from None
        return out


class McpConfig(BaseModel):
    """The `mcp_servers` key of `agents.config` (tool/mcp_client.py opens them)."""

    mcp_servers: list[McpServer] | None = Field(default=None, max_length=16)

    @field_validator("mcp_servers")
    @classmethod
    def _unique(cls, v: list[McpServer] | None) -> list[McpServer] | None:
        names = [s.name for s in v or []]
        for n in names:
            if names.count(n) > 1:
                raise ValueError(f"MCP server name {n!r} is used twice")
        return v


def mcp_problem(tools: Sequence[str], servers: Sequence[McpServer] | None) -> str | None:
    """Why the agent's MCP tools cannot work, if they cannot: an `mcp__` name of a
    server the config does not define, or a server none of whose tools is offered."""
    defined = {s.name for s in servers or []}
    for name in tools:
        server = server_of(name)
        if name.startswith(PREFIX) and server not in defined:
            return (
                f"tools: {name!r} names MCP server {server!r}, which config.mcp_servers "
                "does not define"
            )
    for s in servers or []:
        if not s.tools and server_of_any(tools, s.name) is None:
            return (
                f'MCP server {s.name!r} offers no tool: list them in its tools (or "*") or '
                f"in the agent's tools as {tool_name(s.name, '<tool>')!r}"
            )
    return None


def server_of_any(tools: Sequence[str], server: str) -> str | None:
    return next((t for t in tools if server_of(t) == server), None)
