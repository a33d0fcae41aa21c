"""Responses: a turn made into the message JSON, its SSE frames, and error bodies."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from hango_worker.provider.scripted import word_chunks
from hango_worker.testing.fake_anthropic.cache import CacheUsage
from hango_worker.testing.fake_anthropic.script import FakeTurn


def _json_chunks(raw: str, size: int = 24) -> list[str]:
    return [""] + [raw[i : i + size] for i in range(0, len(raw), size)]


@dataclass(slots=True)
class Answer:
    """A turn made concrete: the message JSON plus what only the stream shows."""

    message: dict[str, Any]
    cut_json: str | None = None  # the truncated arguments of the last tool_use (max_tokens)
    chunk_delay_s: float = 0.0
    inputs_in_start: bool = False  # tool inputs whole in content_block_start


def build_answer(turn: FakeTurn, index: int, body: dict[str, Any], usage: CacheUsage) -> Answer:
    content: list[dict[str, Any]] = []
    if turn.thinking is not None:
        content.append(
            {"type": "thinking", "thinking": turn.thinking, "signature": f"scripted-{index}"}
        )
    content += copy.deepcopy(turn.blocks)  # any block type, streamed as the API would
    if turn.text:
        content.append({"type": "text", "text": turn.text})
    # like the API: with tool_choice none the model answers in text only
    choice = body.get("tool_choice")
    calls = [] if isinstance(choice, dict) and choice.get("type") == "none" else turn.tool_calls
    for j, call in enumerate(calls):
        tid = call.id or f"toolu_s{index:04d}_{j}"
        content.append({"type": "tool_use", "id": tid, "name": call.name, "input": call.input})
    stop = str(turn.stop_reason or ("tool_use" if calls else "end_turn"))
    cut: str | None = None
    if stop == "max_tokens" and content and content[-1]["type"] == "tool_use":
        full = json.dumps(content[-1]["input"])
        cut = full[: max(1, len(full) // 2)]
        content[-1]["input"] = {}
    out_chars = sum(_output_chars(b) for b in content)
    counts = {
        "input_tokens": usage.input_tokens,
        "output_tokens": max(1, out_chars // 4),
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
    }
    scripted = turn.usage or {}
    counts.update({k: v for k, v in scripted.items() if isinstance(v, int)})
    message = {
        "id": "",
        "type": "message",
        "role": "assistant",
        "model": body.get("model"),
        "content": content,
        "stop_reason": stop,
        "stop_sequence": _stop_sequence(turn, stop, body),
        "usage": {
            **counts,
            "cache_creation": _creation(counts, usage),
            "service_tier": "standard",
            **scripted,  # as scripted: tier, server_tool_use, fields nobody knows yet, …
        },
    }
    if turn.stop_details is not None:
        message["stop_details"] = turn.stop_details
    return Answer(
        message=message,
        cut_json=cut,
        chunk_delay_s=turn.chunk_delay_s,
        inputs_in_start=turn.inputs_in_start,
    )


def _output_chars(block: dict[str, Any]) -> int:
    if block["type"] == "tool_use":
        return len(block["name"]) + len(json.dumps(block["input"]))
    if block["type"] in ("text", "thinking"):
        return len(block.get("text") or block.get("thinking") or "")
    return len(json.dumps(block))


def _stop_sequence(turn: FakeTurn, stop: str, body: dict[str, Any]) -> str | None:
    if stop != "stop_sequence":
        return None
    given = body.get("stop_sequences") or []
    return turn.stop_sequence or (str(given[0]) if given else "STOP")


def _creation(counts: dict[str, int], usage: CacheUsage) -> dict[str, int]:
    n = counts["cache_creation_input_tokens"]
    one_hour = min(n, usage.cache_creation_1h_input_tokens)
    return {"ephemeral_5m_input_tokens": n - one_hour, "ephemeral_1h_input_tokens": one_hour}


Frame = tuple[str, dict[str, Any]]


def _block_frames(
    i: int, block: dict[str, Any], cut_json: str | None, input_in_start: bool = False
) -> list[Frame]:
    kind = block["type"]
    deltas: list[dict[str, Any]]
    if kind == "text":
        start: dict[str, Any] = {**block, "text": ""}
        deltas = []
        if isinstance(block.get("citations"), list):  # each citation before the text
            start["citations"] = []
            deltas += [{"type": "citations_delta", "citation": c} for c in block["citations"]]
        deltas += [{"type": "text_delta", "text": t} for t in word_chunks(block["text"])]
    elif kind == "thinking":
        start = {**block, "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": t} for t in word_chunks(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    elif (input_in_start and cut_json is None) or (
        kind != "tool_use" and not isinstance(block.get("input"), dict)
    ):
        start, deltas = dict(block), []  # whole in the start (redacted_thinking, results, …)
    else:  # tool_use, server_tool_use: the input as partial JSON
        start = {**block, "input": {}}
        raw = cut_json if cut_json is not None else json.dumps(block["input"])
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in _json_chunks(raw)]
    frames: list[Frame] = [
        ("content_block_start", {"type": "content_block_start", "index": i, "content_block": start})
    ]
    frames += [
        ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})
        for d in deltas
    ]
    frames.append(("content_block_stop", {"type": "content_block_stop", "index": i}))
    return frames


def stream_frames(answer: Answer) -> list[Frame]:
    """The SSE frames of a message, in the API's order, with pings."""
    msg = answer.message
    usage = msg["usage"]
    head = {**msg, "content": [], "stop_reason": None, "stop_sequence": None}
    head.pop("stop_details", None)
    head["usage"] = {**usage, "output_tokens": 1}
    frames: list[Frame] = [
        ("message_start", {"type": "message_start", "message": head}),
        ("ping", {"type": "ping"}),
    ]
    last = len(msg["content"]) - 1
    for i, block in enumerate(msg["content"]):
        frames += _block_frames(
            i, block, answer.cut_json if i == last else None, answer.inputs_in_start
        )
    frames.append(("ping", {"type": "ping"}))
    delta_usage = {
        k: usage[k]
        for k in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
        )
    }
    for key in _FINAL_USAGE:  # reported final in message_delta, as the API does
        if key in usage:
            delta_usage[key] = usage[key]
    delta = {"stop_reason": msg["stop_reason"], "stop_sequence": msg["stop_sequence"]}
    if "stop_details" in msg:
        delta["stop_details"] = msg["stop_details"]
    frames.append(
        ("message_delta", {"type": "message_delta", "delta": delta, "usage": delta_usage})
    )
    frames.append(("message_stop", {"type": "message_stop"}))
    return frames


_FINAL_USAGE = ("server_tool_use", "output_tokens_details")

# A frame whose data is not JSON (a "midstream_garbage" fault): sent as it is.
GARBAGE = "garbage"


def sse_frame(frame: Frame) -> bytes:
    data = frame[1].get(GARBAGE) if frame[0] == "content_block_delta" else None
    if not isinstance(data, str):
        data = json.dumps(frame[1])
    return f"event: {frame[0]}\ndata: {data}\n\n".encode()


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def error_body(err_type: str, message: str, request_id: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": err_type, "message": message},
        "request_id": request_id,
    }
