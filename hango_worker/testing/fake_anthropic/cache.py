"""The prompt cache: prefix hashes at cache_control breakpoints, reported truthfully."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hango_worker.testing.fake_anthropic.tokens import segments

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
        tokens: list[int] = []  # cumulative, through each segment
        breakpoints: list[tuple[int, str]] = []
        total = 0
        for i, (canon, n, cc) in enumerate(segments(body)):
            h.update(canon.encode())
            digests.append(h.copy().digest())
            total += n
            tokens.append(total)
            if cc:
                ttl = cc.get("ttl", "5m") if isinstance(cc, dict) else "5m"
                breakpoints.append((i, ttl if ttl in _TTL_S else "5m"))
        with self._lock:
            return self._account(digests, tokens, breakpoints, total)

    def _account(
        self, digests: list[bytes], tokens: list[int], bps: list[tuple[int, str]], total: int
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
        read = tokens[hit] if hit >= 0 else 0
        eligible = [(b, t) for b, t in bps if tokens[b] >= self.min_cacheable_tokens]
        usage = CacheUsage(input_tokens=0, cache_read_input_tokens=read)
        cached = read
        if eligible:
            last, usage.creation_ttl = eligible[-1]
            if last > hit:
                usage.cache_creation_input_tokens = tokens[last] - read
                cached = tokens[last]
                usage.cache_creation_1h_input_tokens = _written_1h(eligible, tokens, hit, read)
            for b, ttl in eligible:
                self._entries[digests[b]] = (now + _TTL_S[ttl], _TTL_S[ttl])
        usage.input_tokens = total - cached
        return usage


def _written_1h(eligible: list[tuple[int, str]], tokens: list[int], hit: int, read: int) -> int:
    """Tokens written up to 1 h breakpoints: each written span is charged at the TTL of
    the breakpoint that ends it, as the API splits `cache_creation`."""
    start, one_hour = read, 0
    for b, ttl in eligible:
        end = tokens[b]
        if b > hit and end > start:
            if ttl == "1h":
                one_hour += end - start
            start = end
    return one_hour
