"""ScriptedProvider: a deterministic model for tests and the offline demo.

A script is a JSON list of turns::

    [{"text": "Let me check.", "tool_calls": [{"name": "current_time", "input": {}}]},
     {"text": "It is noon."}]

Optional per-turn keys: ``thinking`` (a thinking block), ``blocks`` (content
blocks of any type, each a JSON object given as the API would return it:
redacted_thinking, server_tool_use, web_search_tool_result, a text block with
citations, a type nobody knows yet; they come after the thinking and before the
text and tool calls, and are kept and sent back exactly), ``stop_reason``,
``stop_details`` (as the API sends it with a refusal), ``delay_s`` (sleep before
answering), ``usage`` (the API's usage object: counts, ``cache_creation``,
``output_tokens_details``, ``server_tool_use``, ``service_tier``, ``speed``,
``inference_geo``, any field added later) and ``error``
(``{"type": ..., "message": ..., "retryable": bool}`` raised as a ModelError).

The turn played is chosen from the request, not from a counter: turn N is
played when the history holds N assistant messages. So a run resumed on
another worker after a crash gets exactly the answer the crashed worker got,
with the same tool_use ids, which is what makes crash tests comparable.
"""

from __future__ import annotations

import asyncio
import json
import operator
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hango_worker.provider.sanitize import clean_message, record_sanitized
from hango_worker.provider.types import (
    Block,
    Message,
    ModelError,
    Request,
    Response,
    StopReason,
    TextBlock,
    TextSink,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
    block_from_dict,
    tool_input,
)
from hango_worker.vocab import ErrorType

LABEL = "scripted model (deterministic, offline — not Claude)"


_ROLE = operator.attrgetter("role")


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    # any JSON value: a model can send arguments that are not an object (an error for it)
    input: Any = Field(default_factory=dict)
    id: str | None = None


class ScriptedError(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str = ErrorType.API_ERROR
    message: str = "scripted failure"
    retryable: bool = False
    times: int = 1  # fail this many attempts of the turn, then answer


class ScriptedTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: str = ""
    thinking: str | None = None
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    stop_reason: StopReason | None = None
    # the API's stop_details (a refusal's type, category and explanation)
    stop_details: dict[str, Any] | None = None
    delay_s: float = 0.0
    # the API's usage object: counts, and any of cache_creation, output_tokens_details
    # (thinking_tokens), server_tool_use, service_tier, speed, inference_geo, fields
    # added later; what it leaves out is counted by the model
    usage: dict[str, Any] | None = None
    error: ScriptedError | None = None


class ScriptError(ValueError):
    """The script file is not a valid script."""


def parse_script(raw: Any, source: str = "script") -> list[ScriptedTurn]:
    if not isinstance(raw, list):
        raise ScriptError(f"{source}: a script is a JSON list of turns, got {type(raw).__name__}")
    turns = []
    for i, item in enumerate(raw):
        try:
            turns.append(ScriptedTurn.model_validate(item))
        except ValidationError as e:
            first = e.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ScriptError(f"{source}: turn {i}: {loc}: {first['msg']}") from None
    return turns


def read_script_json(path: str | Path) -> Any:
    """The JSON in a script file; ScriptError with the file and line when it is not."""
    p = Path(path)
    try:
        return json.loads(p.read_text())
    except OSError as e:
        raise ScriptError(f"cannot read script {p}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise ScriptError(f"{p}: not JSON: {e.msg} at line {e.lineno}") from None


def load_script(path: str | Path) -> list[ScriptedTurn]:
    return parse_script(read_script_json(path), str(path))


def word_chunks(text: str) -> list[str]:
    """Split text like a model streams it: word by word, keeping spaces."""
    out: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch == " " and i > start:
            out.append(text[start:i])
            start = i
    if start < len(text):
        out.append(text[start:])
    return out


class ScriptedProvider:
    name = "scripted"
    label = LABEL

    def __init__(
        self, turns: Sequence[ScriptedTurn | dict[str, Any]], *, chunk_delay_s: float = 0.0
    ) -> None:
        self.turns = [
            t if isinstance(t, ScriptedTurn) else ScriptedTurn.model_validate(t) for t in turns
        ]
        self.chunk_delay_s = chunk_delay_s
        self._failures: dict[int, int] = {}
        self.calls = 0

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        self.calls += 1
        started = time.perf_counter()
        # the turn to play: assistant messages so far (counted in C, not a Python
        # generator per message: this runs on every call of a benchmark's long run)
        index = list(map(_ROLE, request.messages)).count("assistant")
        if index >= len(self.turns):
            raise ModelError(
                ErrorType.SCRIPT_EXHAUSTED,
                f"the scripted model has no turn {index + 1}: its script has {len(self.turns)}",
                retryable=False,
            )
        turn = self.turns[index]
        if turn.error is not None and self._failures.get(index, 0) < turn.error.times:
            self._failures[index] = self._failures.get(index, 0) + 1
            raise ModelError(turn.error.type, turn.error.message, retryable=turn.error.retryable)
        if turn.delay_s:
            await asyncio.sleep(turn.delay_s)
        first_chunk: float | None = None
        content: list[Block] = []
        if turn.thinking is not None:
            content.append(ThinkingBlock(thinking=turn.thinking, signature=f"scripted-{index}"))
        # a copy each time (json round trip): a block is never shared between responses
        content += [block_from_dict(json.loads(json.dumps(b))) for b in turn.blocks]
        if turn.text:
            for chunk in word_chunks(turn.text):
                if first_chunk is None:
                    first_chunk = time.perf_counter() - started
                if on_text is not None:
                    on_text(chunk)
                if self.chunk_delay_s:
                    await asyncio.sleep(self.chunk_delay_s)
            content.append(TextBlock(text=turn.text))
        # like the API: with tool_choice none the model answers in text only
        calls = [] if (request.tool_choice or {}).get("type") == "none" else turn.tool_calls
        for j, call in enumerate(calls):
            args, problem = tool_input(call.input)
            tid = call.id or f"toolu_s{index:04d}_{j}"
            content.append(ToolUseBlock(id=tid, name=call.name, input=args, input_error=problem))
        message = Message(role="assistant", content=content)
        record_sanitized("model_output", clean_message(message))
        stop = turn.stop_reason or (StopReason.TOOL_USE if calls else StopReason.END_TURN)
        usage = (
            Usage.from_api(turn.usage)
            if turn.usage
            else Usage(
                input_tokens=10 + 5 * len(request.messages),
                output_tokens=max(1, len(turn.text) // 4),
            )
        )
        return Response(
            message=message,
            stop_reason=stop,
            usage=usage,
            id=f"msg_scripted_{index:04d}",
            model=request.model,
            time_to_first_chunk_s=first_chunk,
            stop_details=turn.stop_details,
        )
