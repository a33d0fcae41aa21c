"""Model output nested deeper than Python decodes: the call is answered with an error
result and never executed, the stream and the worker go on (provider/accumulate.py)."""

from __future__ import annotations

from hango_worker.provider.accumulate import set_tool_input
from hango_worker.provider.types import ToolUseBlock


def test_tool_arguments_nested_too_deep_are_an_error_for_the_model() -> None:
    """Proves: before, json.loads raised RecursionError out of the stream's assembly."""
    block = ToolUseBlock("toolu_1", "lookup", {})
    set_tool_input(block, '{"q": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert block.input == {} and block.complete
    assert block.input_error == "its arguments are nested too deeply to read"
    ok = ToolUseBlock("toolu_2", "lookup", {})
    set_tool_input(ok, '{"q": [[1]]}')
    assert ok.input == {"q": [[1]]} and ok.input_error is None
