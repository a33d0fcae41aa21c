"""Two small built-in tools that do something real offline."""

from __future__ import annotations

import ast
import datetime as dt
import math
import operator
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from hango_worker.tool.types import Tool, ToolContext, ToolResult


async def _current_time(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    tz_name = args.get("timezone", "UTC")
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        return ToolResult.error(
            f"unknown timezone {tz_name!r}; use an IANA name such as 'Europe/Paris'"
        )
    return ToolResult(dt.datetime.now(tz).isoformat(timespec="seconds"))


_BINOPS: dict[type[ast.operator], Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNOPS: dict[type[ast.unaryop], Any] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


# Bounds that keep every evaluation to microseconds, so it can run on the event loop:
# an integer result may have at most MAX_INT_BITS bits (about 1,200 digits), and
# `round` at most MAX_ROUND_DIGITS digits. Anything bigger is refused before it is computed.
MAX_INT_BITS = 4000
MAX_ROUND_DIGITS = 1000


class CalcError(ValueError):
    pass


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse integer powers and products whose result could exceed MAX_INT_BITS."""
    if not (type(left) is int and type(right) is int):
        return  # floats overflow (OverflowError) instead of growing
    if isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
        bits = right * abs(left).bit_length()  # an upper bound of the result's size
    elif isinstance(op, ast.Mult):
        bits = abs(left).bit_length() + abs(right).bit_length()
    else:
        return
    if bits > MAX_INT_BITS:
        raise CalcError(
            f"the result could be larger than the calculator's limit ({MAX_INT_BITS} bits, "
            "about 1,200 digits)"
        )


def _round(x: Any, ndigits: Any = None) -> Any:
    if ndigits is not None and (type(ndigits) is not int or abs(ndigits) > MAX_ROUND_DIGITS):
        raise CalcError(f"round() takes an integer number of digits up to {MAX_ROUND_DIGITS}")
    return round(x) if ndigits is None else round(x, ndigits)


_FUNCS: dict[str, Any] = {"sqrt": math.sqrt, "abs": abs, "round": _round, "min": min, "max": max}
_CONSTS = {"pi": math.pi, "e": math.e}


def evaluate(expr: str) -> float | int:
    """Evaluate arithmetic safely: numbers, + - * / // % **, a few functions. No eval."""
    if len(expr) > 200:
        raise CalcError("expression longer than 200 characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        raise CalcError(f"not an arithmetic expression: {expr!r}") from None
    value = _eval(tree.body)
    if not isinstance(value, int | float):
        raise CalcError("expression did not give a number")
    return value


def _eval(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        _check_size(node.op, left, right)
        return _BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
    raise CalcError(f"unsupported element in expression: {ast.dump(node)[:60]}")


async def _calculator(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
    try:
        value = evaluate(args["expression"])
    except (CalcError, ArithmeticError, ValueError, TypeError, RecursionError, MemoryError) as e:
        return ToolResult.error(f"cannot evaluate: {e}")
    return ToolResult(str(value))


CURRENT_TIME = Tool(
    name="current_time",
    description="Returns the current date and time (ISO 8601) in a timezone (default UTC).",
    input_schema={
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "IANA timezone name"}},
        "additionalProperties": False,
    },
    call=_current_time,
    idempotent=True,
)

CALCULATOR = Tool(
    name="calculator",
    description=(
        "Evaluates an arithmetic expression exactly (+ - * / // % **, sqrt, abs, round, min, "
        "max, pi, e). Use it instead of doing arithmetic in your head."
    ),
    input_schema={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. '(17 * 3) / 2'"}},
        "required": ["expression"],
        "additionalProperties": False,
    },
    call=_calculator,
    idempotent=True,
)

BUILTIN_TOOLS = [CURRENT_TIME, CALCULATOR]
