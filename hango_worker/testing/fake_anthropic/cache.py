"""The prompt cache: prefix hashes at cache_control breakpoints, reported truthfully."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hango_worker.testing.fake_anthropic.validate import content_blocks

CACHE_LOOKBACK_BLOCKS = 20
DEFAULT_MIN_CACHEABLE_TOKENS = 1024
_TTL_S = {"5m": 300.0, "1h": 3600.0}


@dataclass(slots=True)
class CacheUsage:
    input_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    creation_ttl: str = "5m"  # the TTL of the last breakpoint written
    # the part of the writes up to breakpoints with "ttl": "1h" (the rest is 5 m)
    cache_creation_1h_input_tokens: int = 0


def _segments(body: dict[str, Any]) -> list[tuple[str, int, Any]]:
    """(canonical text, characters, cache_control) per cacheable block, in prefix order."""
    raw: list[tuple[str, Any]] = []
    for tool in body.get("tools") or []:
        raw.append(("tool", tool))
    system = body.get("system")
    if isinstance(system, str):
        raw.append(("system", {"type": "text", "text": system}))
    elif isinstance(system, list):
        raw.extend(("system", b) for b in system)
    for m in body.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        role = str(m.get("role")) if isinstance(m, dict) else "?"
        if isinstance(content, str):
            raw.append((role, {"type": "text", "text": content}))
        else:
            raw.extend((role, b) for b in content_blocks(m))
    out = []
    for where, block in raw:
        if not isinstance(block, dict):
            continue
        cc = block.get("cache_control")
        plain = {k: v for k, v in block.items() if k != "cache_control"}
        canon = where + json.dumps(plain, sort_keys=True, separators=(",", ":"))
        text = plain.get("text")
        out.append((canon, len(text) if isinstance(text, str) else len(canon), cc))
    return out


class PromptCache:
    """Prefix hashes written at cache_control breakpoints, with their expiry times."""

    def __init__(
        self,
        min_cacheable_tokens: int = DEFAULT_MIN_CACHEABLE_TOKENS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_cacheable_tokens = min_cacheable_tokens
        self.clock = clock
        self._entries: dict[bytes, tuple[float, float]] = {}  # digest -> (expires, ttl)
        self._lock = threading.Lock()

    def account(self, body: dict[str, Any]) -> CacheUsage:
        h = hashlib.sha256(str(body.get("model")).encode())
        digests: list[bytes] = []
        chars: list[int] = []
        breakpoints: list[tuple[int, str]] = []
        total = 0
        for i, (canon, n, cc) in enumerate(_segments(body)):
            h.update(canon.encode())
            digests.append(h.copy().digest())
            total += n
            chars.append(total)
            if cc:
                ttl = cc.get("ttl", "5m") if isinstance(cc, dict) else "5m"
                breakpoints.append((i, ttl if ttl in _TTL_S else "5m"))
        with self._lock:
            return self._account(digests, chars, breakpoints, total)

    def _account(
        self, digests: list[bytes], chars: list[int], bps: list[tuple[int, str]], total: int
    ) -> CacheUsage:
        now = self.clock()
        hit = -1
        for b, _ in bps:
            for j in range(b, max(-1, b - CACHE_LOOKBACK_BLOCKS), -1):
                if j <= hit:
                    break
                entry = self._entries.get(digests[j])
                if entry is not None and entry[0] > now:
                    hit = j
                    self._entries[digests[j]] = (now + entry[1], entry[1])
                    break
        read = chars[hit] // 4 if hit >= 0 else 0
        eligible = [(b, t) for b, t in bps if chars[b] // 4 >= self.min_cacheable_tokens]
        usage = CacheUsage(input_tokens=0, cache_read_input_tokens=read)
        cached = read
        if eligible:
            last, usage.creation_ttl = eligible[-1]
            if last > hit:
                usage.cache_creation_input_tokens = chars[last] // 4 - read
                cached = chars[last] // 4
                usage.cache_creation_1h_input_tokens = _written_1h(eligible, chars, hit, read)
            for b, ttl in eligible:
                self._entries[digests[b]] = (now + _TTL_S[ttl], _TTL_S[ttl])
        usage.input_tokens = max(1, total // 4 - cached)
        return usage


def _written_1h(eligible: list[tuple[int, str]], chars: list[int], hit: int, read: int) -> int:
    """Tokens written up to 1 h breakpoints: each written span is charged at the TTL of
    the breakpoint that ends it, as the API splits `cache_creation`."""
    start, one_hour = read, 0
    for b, ttl in eligible:
        end = chars[b] // 4
        if b > hit and end > start:
            if ttl == "1h":
                one_hour += end - start
            start = end
    return one_hour
