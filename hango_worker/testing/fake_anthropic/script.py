"""The fake's script: turns (`FakeTurn`), faults (`Fault`), parsing and loading,
and `RecordedRequest`, one request as the server received it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hango_worker.provider.scripted import ScriptedTurn, ScriptError, read_script_json

STATUS_BY_TYPE = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
TYPE_BY_STATUS = {v: k for k, v in STATUS_BY_TYPE.items()}
DEFAULT_MESSAGES = {
    429: "Number of request tokens has exceeded your per-minute rate limit",
    500: "Internal server error",
    529: "Overloaded",
}
_FAULT_ALIASES = {"rate_limit": "429", "overloaded": "529", "server_error": "500"}
_STREAM_FAULTS = ("drop", "midstream_overloaded", "midstream_drop", "midstream_garbage")


class Fault(BaseModel):
    """One injected failure (see the package docstring for the kinds)."""

    model_config = ConfigDict(extra="forbid")
    fault: str
    times: int = Field(default=1, ge=1)
    retry_after: float | None = None
    message: str | None = None
    type: str | None = None
    # the request-id header (and body field) to send; "{api_key}" becomes the key the
    # client presented, as a misbehaving endpoint that echoes credentials would do
    request_id: str | None = None

    @field_validator("fault", mode="before")
    @classmethod
    def _kind(cls, v: Any) -> str:
        kind = _FAULT_ALIASES.get(str(v), str(v))
        if kind in _STREAM_FAULTS or (kind.isdigit() and 400 <= int(kind) <= 599):
            return kind
        raise ValueError(
            f"unknown fault {v!r}: use an HTTP error status (429, 529, 500, 400, …), "
            "'drop', 'midstream_overloaded', 'midstream_drop' or 'midstream_garbage'"
        )

    @property
    def status(self) -> int | None:
        return int(self.fault) if self.fault.isdigit() else None


class FakeTurn(ScriptedTurn):
    """A scripted-model turn, plus what only a server can do."""

    faults: list[Fault] = Field(default_factory=list)
    chunk_delay_s: float = 0.0
    stop_sequence: str | None = None
    # send each tool call's input whole in content_block_start (no input_json_delta)
    inputs_in_start: bool = False

    @model_validator(mode="before")
    @classmethod
    def _output(cls, data: Any) -> Any:
        """`output`: a structured answer (any JSON value), sent as the text, compact JSON."""
        if not isinstance(data, dict) or "output" not in data:
            return data
        if data.get("text"):
            raise ValueError("a turn gives `text` or `output`, not both")
        rest = {k: v for k, v in data.items() if k != "output"}
        return {**rest, "text": json.dumps(data["output"], separators=(",", ":"))}

    def all_faults(self) -> list[Fault]:
        """One entry per failing attempt: `faults` (expanded by `times`), then `error`."""
        out = [f for f in self.faults for _ in range(f.times)]
        if self.error is not None:
            status = STATUS_BY_TYPE.get(self.error.type, 500 if self.error.retryable else 400)
            fault = Fault(fault=str(status), type=self.error.type, message=self.error.message)
            out.extend([fault] * self.error.times)
        return out


def as_entry(item: Any) -> FakeTurn | Fault:
    if isinstance(item, FakeTurn | Fault):
        return item
    if isinstance(item, ScriptedTurn):
        return FakeTurn.model_validate(item.model_dump())
    if isinstance(item, dict) and "fault" in item:
        return Fault.model_validate(item)
    return FakeTurn.model_validate(item)


def parse_fake_script(raw: Any, source: str = "script") -> list[FakeTurn]:
    """Turns from a JSON list; fault entries are attached to the turn after them."""
    if not isinstance(raw, list):
        raise ScriptError(f"{source}: a script is a JSON list of turns, got {type(raw).__name__}")
    turns: list[FakeTurn] = []
    pending: list[Fault] = []
    for i, item in enumerate(raw):
        try:
            entry = as_entry(item)
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ScriptError(f"{source}: entry {i}: {loc}: {first['msg']}") from None
        if isinstance(entry, Fault):
            pending.append(entry)
            continue
        if pending:
            entry = entry.model_copy(update={"faults": [*pending, *entry.faults]})
            pending = []
        turns.append(entry)
    if pending:
        raise ScriptError(f"{source}: fault entries at the end are not followed by a turn")
    return turns


def load_fake_script(path: str | Path) -> list[FakeTurn]:
    return parse_fake_script(read_script_json(path), str(path))


@dataclass(slots=True)
class RecordedRequest:
    """One request as the server received it (header names in lowercase)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    received_at: float = field(default_factory=time.time)
    input_tokens: int | None = None  # as counted by the fake (tokens.py); None: not valid
    platform: str | None = None  # "vertex" | "bedrock": its route (platforms.py)

    @property
    def api_key(self) -> str | None:
        """The key the client presented, from `x-api-key` or `Authorization: Bearer`."""
        if "x-api-key" in self.headers:
            return self.headers["x-api-key"]
        auth = self.headers.get("authorization", "")
        return auth[7:].strip() if auth[:7].lower() == "bearer " else None

    @property
    def messages(self) -> list[Any]:
        msgs = self.body.get("messages") if isinstance(self.body, dict) else None
        return msgs if isinstance(msgs, list) else []

    @property
    def turn_index(self) -> int:
        """How many assistant messages the history holds (which turn the script plays)."""
        return sum(1 for m in self.messages if isinstance(m, dict) and m.get("role") == "assistant")
