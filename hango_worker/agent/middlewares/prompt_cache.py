"""PromptCache: prompt-cache breakpoints, set by index on the request the provider receives.

Three breakpoints (docs/learning/09-caching-and-memory.md):

(a) the last tool definition — tools come first in the API's prefix;
(b) the last system block that comes from the agent or from a contributor placed
    BEFORE this middleware in the chain (`SystemLayout.blocks_before`): contributors
    placed after it (Memory) land after the breakpoint, so editing them never
    invalidates the cached prefix;
(c) the newest message's last block, so the cached prefix moves forward every turn.

Placed by a final rewrite (`ModelRequest.rewrite_final`): on the tools the allowlist
kept, the system as assembled, the messages as an outer middleware (compaction) left
them — never by matching strings, and only on copies: stored history never carries a
`cache_control`. The API takes at most 4 breakpoints: breakpoints some other part
already set (on tools, system, the newest message) are counted, and (c), (b), (a) are
kept in that order of value. The cost is flat in history length (~20 µs per call).

TTL: `5m` by default; with `1h` (AgentConfig `cache_ttl`) the stable prefix (a, b) is
written for an hour while (c) stays `5m` — it is rewritten every turn, and the API
requires longer-TTL breakpoints to come before shorter ones, which this order keeps.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from hango_worker.agent.middleware import (
    ModelHandler,
    ModelRequest,
    ModelResponse,
    StackContext,
    SystemLayout,
)
from hango_worker.provider.types import (
    Block,
    CacheControl,
    Message,
    RawBlock,
    Request,
    TextBlock,
    ThinkingBlock,
    evolve,
)
from hango_worker.telemetry.tracing import MW_NAME, current_turn_span

NAME = "prompt_cache"
MAX_BREAKPOINTS = 4  # the API's limit per request
CacheTTL = Literal["5m", "1h"]
EVENT = "middleware.cache_breakpoints"


class PromptCacheConfig(BaseModel):
    """The agent's setting (`agents.config`, a section of AgentConfig)."""

    # prompt-cache TTL of the stable prefix (tools + system)
    cache_ttl: CacheTTL = "5m"


def cache_control(ttl: CacheTTL) -> CacheControl:
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": "1h"}


def _markable(block: Block) -> bool:
    """The API refuses cache_control on thinking blocks and on empty text blocks; a
    RawBlock is never edited (it goes back exactly as the API returned it)."""
    if isinstance(block, ThinkingBlock | RawBlock):
        return False
    return not (isinstance(block, TextBlock) and not block.text)


def _last_markable(message: Message) -> int:
    for j in range(len(message.content) - 1, -1, -1):
        if _markable(message.content[j]):
            return j
    return -1


def breakpoints_in(request: Request) -> int:
    """cache_control markers already on the request (set by something else) in the
    tools, the system blocks and the newest message. Older messages are not scanned
    (that would cost O(history) per call): history never carries a marker — stored
    content drops them (`block_from_dict`) and PromptCache marks copies only."""
    n = sum(1 for t in request.tools if t.cache_control)
    n += sum(1 for b in request.system if b.cache_control)
    if request.messages:
        n += sum(1 for b in request.messages[-1].content if getattr(b, "cache_control", None))
    return n


class PromptCache:
    """See the module docstring. Stateless: nothing is stored between calls."""

    name = NAME

    def __init__(self, ttl: CacheTTL = "5m") -> None:
        if ttl not in ("5m", "1h"):
            raise ValueError(f"cache ttl must be '5m' or '1h', got {ttl!r}")
        self.ttl: CacheTTL = ttl
        self.prefix_cc = cache_control(ttl)
        self.message_cc = cache_control("5m")

    async def wrap_model_call(self, req: ModelRequest, next: ModelHandler) -> ModelResponse:
        return await next(req.rewrite_final(self.place))

    def place(self, request: Request, layout: SystemLayout) -> Request:
        """The request with breakpoints (a), (b), (c) set on copies; records the indexes."""
        tool_i = len(request.tools) - 1
        if tool_i >= 0 and request.tools[tool_i].cache_control:
            tool_i = -1
        system_i = min(layout.blocks_before(self.name), len(request.system)) - 1
        if system_i >= 0 and (
            not request.system[system_i].text or request.system[system_i].cache_control
        ):
            system_i = -1  # nothing to mark, or already marked by someone else
        msg_i = len(request.messages) - 1
        block_i = _last_markable(request.messages[msg_i]) if msg_i >= 0 else -1
        budget = MAX_BREAKPOINTS - breakpoints_in(request)
        # most valuable first: the moving message breakpoint, then system, then tools
        if block_i < 0 or budget < 1:
            msg_i = block_i = -1
        budget -= 1 if block_i >= 0 else 0
        if budget < 1:
            system_i = -1
        budget -= 1 if system_i >= 0 else 0
        if budget < 1:
            tool_i = -1
        tools, system, messages = request.tools, request.system, request.messages
        if tool_i >= 0:
            tools = list(tools)
            tools[tool_i] = evolve(tools[tool_i], cache_control=self.prefix_cc)
        if system_i >= 0:
            system = list(system)
            system[system_i] = evolve(system[system_i], cache_control=self.prefix_cc)
        if block_i >= 0:
            messages = list(messages)
            content = list(messages[msg_i].content)
            block = content[block_i]
            assert not isinstance(block, ThinkingBlock)  # _last_markable skips them
            content[block_i] = evolve(block, cache_control=self.message_cc)
            messages[msg_i] = Message(messages[msg_i].role, content)
        current_turn_span().add_event(
            EVENT,
            {
                MW_NAME: self.name,
                "hango.cache.tools_index": tool_i,
                "hango.cache.system_index": system_i,
                "hango.cache.message_index": msg_i,
                "hango.cache.block_index": block_i,
                "hango.cache.ttl": self.ttl,
            },
        )
        return evolve(request, tools=tools, system=system, messages=messages)


def build(ctx: StackContext) -> PromptCache:
    return PromptCache(ctx.settings(PromptCacheConfig).cache_ttl)
