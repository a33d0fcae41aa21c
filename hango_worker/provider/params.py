"""The Messages API's request parameters an agent may set, as the installed SDK knows
them: read from the SDK's own request types, never from a list copied by hand, so a
new SDK version brings its new parameters without a code change.

- `API_PARAMS`: every parameter of `messages.create` (and of `beta.messages.create`:
  `BETA_PARAMS`) but the ones hango builds itself (`OWNED`: the model, the history, the
  system prompt, its tools and tool choice, `max_tokens` (the agent's own key),
  streaming, and the request-level `cache_control`, since hango places its own cache
  breakpoints (agent/middlewares/prompt_cache.py)).
- `check_params` validates the values against the SDK's TypedDicts (pydantic), then the
  combinations the API refuses; every problem is one line naming the key (and, for a
  combination, both keys).
- `SERVER_TOOLS`: the Anthropic-defined tools (web search, web fetch, code execution,
  tool search, …), which run on Anthropic's side and sit in `tools` beside hango's own.

See docs/system-architecture.md, "Request parameters".
"""

from __future__ import annotations

import collections.abc
import typing
from functools import cache
from typing import Any, get_args, get_origin

from anthropic.types import ToolUnionParam
from anthropic.types import message_create_params as plain
from anthropic.types.beta import BetaToolUnionParam
from anthropic.types.beta import message_create_params as beta
from pydantic import TypeAdapter, ValidationError
from typing_extensions import TypedDict

# What hango builds itself; an agent cannot set these through its config.
OWNED = frozenset(
    ("model", "messages", "system", "tools", "tool_choice", "max_tokens", "stream", "cache_control")
)
# hango's own keys beside the SDK's: `server_tools` (entries of the API's `tools`)
SERVER_TOOLS_KEY = "server_tools"
MIN_THINKING_BUDGET = 1024  # the API's floor for thinking.budget_tokens


def _hints(td: type) -> dict[str, Any]:
    return typing.get_type_hints(td, include_extras=True)


def _as_list(hint: Any) -> Any:
    """`Iterable[X]` as `list[X]` (pydantic validates an Iterable lazily: never, here)."""
    origin = get_origin(hint)
    if origin in (typing.Required, typing.NotRequired):
        return _as_list(get_args(hint)[0])
    if origin is collections.abc.Iterable:
        return list[get_args(hint)[0]]  # type: ignore[misc]
    return hint


_PLAIN = {k: v for k, v in _hints(plain.MessageCreateParamsBase).items() if k not in OWNED}
_BETA = {k: v for k, v in _hints(beta.MessageCreateParamsBase).items() if k not in OWNED}
API_PARAMS = frozenset(_PLAIN)
BETA_PARAMS = frozenset(_BETA) - API_PARAMS  # only through the beta endpoint (`betas` too)
ALL_PARAMS = API_PARAMS | BETA_PARAMS


@cache
def _adapter(use_beta: bool) -> TypeAdapter[Any]:
    fields = _BETA if use_beta else _PLAIN
    make: Any = TypedDict  # built from the SDK's hints at run time
    td = make("AgentRequestParams", {k: _as_list(v) for k, v in fields.items()}, total=False)
    return TypeAdapter(td)


@cache
def _tool_adapter(use_beta: bool) -> TypeAdapter[Any]:
    return TypeAdapter(BetaToolUnionParam if use_beta else ToolUnionParam)


def uses_beta(params: dict[str, Any]) -> bool:
    """Whether a request with these parameters goes to the beta endpoint."""
    return any(k in BETA_PARAMS for k in params)


def _type_of(member: Any) -> tuple[str, ...]:
    """The `type` literal(s) of a TypedDict union member, if it has one."""
    hint = _hints(member).get("type") if isinstance(member, type) else None
    while get_origin(hint) in (typing.Required, typing.NotRequired):
        hint = get_args(hint)[0]
    return tuple(str(a) for a in get_args(hint)) if get_origin(hint) is typing.Literal else ()


def _union_members(hint: Any) -> list[Any]:
    while get_origin(hint) in (typing.Required, typing.NotRequired, typing.Annotated):
        hint = get_args(hint)[0]
    if get_origin(hint) is typing.Union:
        return [m for m in get_args(hint) if isinstance(m, type)]
    return []


def _describe(e: ValidationError, value: Any, hint: Any, where: str) -> str:
    """One line for the first problem. In a union of typed objects (thinking, a server
    tool) the error of the member the value's `type` names, or the types there are."""
    members = _union_members(hint)
    typed = {t: m for m in members for t in _type_of(m)}
    if typed and isinstance(value, dict):
        kind = value.get("type")
        if kind not in typed:
            return f"{where}.type: {kind!r} is not one of {', '.join(map(repr, typed))}"
        name = typed[kind].__name__
        for err in e.errors():
            loc = [str(p) for p in err["loc"]]
            if name in loc:
                rest = loc[loc.index(name) + 1 :]
                return f"{'.'.join([where, *rest])}: {err['msg']}"
    err = e.errors()[0]
    loc = [str(p) for p in err["loc"] if not str(p)[:1].isupper()]  # no member names
    if loc and loc[0] == where:  # validated as {key: value}
        loc = loc[1:]
    return f"{'.'.join([where, *loc])}: {err['msg']}"


def check_params(params: dict[str, Any]) -> None:
    """ValueError, one line naming the key, for a value the SDK's types refuse."""
    use_beta = uses_beta(params)
    fields = _BETA if use_beta else _PLAIN
    adapter = _adapter(use_beta)
    for key, value in params.items():
        try:
            adapter.validate_python({key: value})
        except ValidationError as e:
            raise ValueError(_describe(e, value, fields.get(key), key)) from None


def check_server_tools(tools: list[Any], use_beta: bool) -> None:
    """Each entry an Anthropic-defined tool (a `type` like `web_search_20250305`), valid
    as the SDK's types say; hango's own tools are listed in the agent's `tools`."""
    adapter = _tool_adapter(use_beta)
    union = BetaToolUnionParam if use_beta else ToolUnionParam
    for i, tool in enumerate(tools):
        where = f"{SERVER_TOOLS_KEY}.{i}"
        if not isinstance(tool, dict) or tool.get("type") in (None, "custom"):
            raise ValueError(
                f"{where}: a server tool is an object with the `type` of an Anthropic tool "
                "(e.g. web_search_20250305); hango's own tools go in the agent's tools"
            )
        try:
            adapter.validate_python(tool)
        except ValidationError as e:
            raise ValueError(_describe(e, tool, union, where)) from None


def check_combinations(
    params: dict[str, Any], *, max_tokens: int, temperature: float | None
) -> None:
    """What the API refuses together, one line naming both keys."""
    thinking = params.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") == "disabled":
        return
    if temperature is not None and temperature != 1:
        raise ValueError(
            f"temperature ({temperature:g}) and thinking cannot be used together: with "
            "thinking on the API takes only temperature 1; unset temperature"
        )
    budget = thinking.get("budget_tokens")
    if thinking.get("type") == "enabled" and isinstance(budget, int):
        if budget < MIN_THINKING_BUDGET:
            raise ValueError(
                f"thinking.budget_tokens ({budget}) must be at least {MIN_THINKING_BUDGET}"
            )
        if budget >= max_tokens:
            raise ValueError(
                f"thinking.budget_tokens ({budget}) must be below max_tokens ({max_tokens})"
            )
