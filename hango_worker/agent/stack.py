"""default_stack: the one place middleware order is decided (docs/design.md §5.3).

Index 0 is outermost. Slots not built yet are explicit `None`s, skipped by
the chain, so the order of the finished product is visible today.
"""

from __future__ import annotations

from dataclasses import dataclass

from hango_worker.agent.middleware import Middleware
from hango_worker.agent.mw_allowlist import ToolAllowlist
from hango_worker.agent.mw_prompt_cache import CacheTTL, PromptCache
from hango_worker.agent.mw_repair import RepairToolCalls
from hango_worker.agent.mw_repeat import RepeatCall
from hango_worker.agent.mw_todo import TOOL_NAME as TODO_TOOL
from hango_worker.agent.mw_todo import Todo

DEFAULT_REPEAT_CALL_THRESHOLD = 3


@dataclass(frozen=True, slots=True)
class StackConfig:
    allowlist: tuple[str, ...]
    repeat_call_threshold: int = DEFAULT_REPEAT_CALL_THRESHOLD
    cache_ttl: CacheTTL = "5m"


def default_stack(cfg: StackConfig) -> list[Middleware | None]:
    return [
        # Skills: outermost, so skill instructions frame every later block and tool.
        # (Run hooks in slots before RepairToolCalls see history before it is repaired.)
        None,
        # Filesystem: before summarization, which must see results already offloaded to files.
        None,
        # Subagent: delegation sees the filesystem tools but not the parent's summaries.
        None,
        # Summarization: after filesystem, so it compacts what is left in the context.
        None,
        # RepairToolCalls: before anything reads history, so all later hooks see a valid one.
        RepairToolCalls(),
        # Todo: early among contributors, so the plan sits before the cache breakpoint.
        Todo(),
        # RepeatCall: outside the allowlist, so a banned call is counted but still rejected.
        RepeatCall(threshold=cfg.repeat_call_threshold),
        # PromptCache: before Memory, so memory edits land after the cached prefix.
        PromptCache(cfg.cache_ttl),
        # Memory: after the cache breakpoint; its blocks change often.
        None,
        # HumanInTheLoop: just outside the allowlist, so approvals see calls after every
        # rewrite; it sees a call before the allowlist does, so it must skip banned tools.
        None,
        # ToolAllowlist: last = innermost, so no middleware can re-add a banned tool.
        # (`provided`: tools this stack offers every agent; unlisted ones are dropped quietly.)
        ToolAllowlist(cfg.allowlist, provided=(TODO_TOOL,)),
    ]
