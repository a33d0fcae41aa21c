"""provider/fingerprint.py: a run's `Fingerprints` computes only what changed since its
last request, and always gives what a fresh one gives for the same request."""

from __future__ import annotations

import json

from hango_worker.provider.fingerprint import Fingerprints, fingerprint, first_difference
from hango_worker.provider.types import (
    Message,
    RawBlock,
    Request,
    TextBlock,
    ToolResultBlock,
    ToolSpec,
    ToolUseBlock,
    block_from_dict,
    evolve,
)

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}


def history(n: int) -> list[Message]:
    out = [Message("user", [TextBlock("go")])]
    for i in range(n):
        out.append(Message("assistant", [ToolUseBlock(f"t{i}", "echo", {"text": str(i)})]))
        out.append(Message("user", [ToolResultBlock(f"t{i}", f"echo: {i}")]))
    return out


def request(messages: list[Message], system: str = "Be brief.", **kw: object) -> Request:
    tools = [ToolSpec("echo", "Echo it.", SCHEMA)]
    return Request("m", messages, [TextBlock(system)], tools, **kw)  # type: ignore[arg-type]


def test_each_request_of_a_run_hashes_as_a_fresh_one_would() -> None:
    run, msgs = Fingerprints(), history(3)
    steps = [
        request(msgs),
        request([*msgs, Message("assistant", [TextBlock("more")])]),  # appended
        request([*msgs[:-1], Message(msgs[-1].role, list(msgs[-1].content))]),  # a copy
        request(msgs[:1] + msgs[3:]),  # compaction dropped two
        request([Message("user", [TextBlock("other")]), *msgs[1:]]),  # the first replaced
        request(msgs, system="Be terse."),
        request(msgs, max_tokens=10),
        request(msgs, server_tools=[{"type": "web_search_20250305", "name": "web_search"}]),
        request([]),
        request(msgs),
    ]
    for r in steps:
        assert fingerprint(r, run) == fingerprint(r)


def test_the_first_differing_field_is_named_in_order() -> None:
    base = fingerprint(request(history(2)))
    assert first_difference(base, fingerprint(request(history(2)))) is None
    assert first_difference(base, fingerprint(request(history(2), "x"))) == "system"
    assert first_difference(base, fingerprint(request(history(3)))) == "messages"
    assert first_difference(base, fingerprint(request(history(2), temperature=0.5))) == "params"
    cached = request(history(2))
    cached.tools = [evolve(cached.tools[0], cache_control={"type": "ephemeral"})]
    assert first_difference(base, fingerprint(cached)) == "tools"


def test_key_order_does_not_matter_as_after_a_round_trip_through_jsonb() -> None:
    block = {"type": "future_block", "b": [1, {"y": 2, "x": 1}], "a": "z"}
    reordered = json.loads(
        json.dumps({"a": "z", "type": "future_block", "b": [1, {"x": 1, "y": 2}]})
    )
    one = request([Message("assistant", [RawBlock(block)])])
    two = request([Message("assistant", [block_from_dict(reordered)])])
    assert fingerprint(one) == fingerprint(two)
