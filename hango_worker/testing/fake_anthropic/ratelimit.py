"""The fake server's rate limit: a token bucket like the real API's (continuously
refilled, holding at most `limit * window_s / 60`), answering 429 `rate_limit_error`
with the real headers (`retry-after` and `anthropic-ratelimit-*`) once it is empty.
Successful answers carry the `anthropic-ratelimit-*` headers too. `window_s` shorter
than a minute keeps a test short with the same shape of limit."""

from __future__ import annotations

import datetime
import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Bucket:
    per_minute: int
    window_s: float
    level: float = -1.0
    at: float = field(default_factory=time.monotonic)

    @property
    def capacity(self) -> float:
        return self.per_minute * self.window_s / 60.0

    def refill(self, now: float) -> None:
        if self.level < 0:
            self.level = self.capacity
        self.level = min(self.capacity, self.level + (now - self.at) * self.per_minute / 60.0)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` is available (0: now)."""
        missing = min(amount, self.capacity) - self.level
        return max(0.0, missing * 60.0 / self.per_minute)


@dataclass
class FakeRateLimit:
    """`FakeAnthropic(..., rate_limit=FakeRateLimit(requests_per_minute=60))`."""

    requests_per_minute: int
    input_tokens_per_minute: int | None = None
    window_s: float = 60.0
    accepted: list[float] = field(default_factory=list)  # monotonic times of accepted calls
    refused: int = 0  # 429s sent
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.requests_per_minute < 1 or self.window_s <= 0:
            raise ValueError("FakeRateLimit needs requests_per_minute >= 1 and window_s > 0")
        self._req = _Bucket(self.requests_per_minute, self.window_s)
        itpm = self.input_tokens_per_minute
        self._in = _Bucket(itpm, self.window_s) if itpm else None

    def take(self, input_tokens: int) -> float | None:
        """None: accepted (and counted); else the retry-after seconds of a 429."""
        with self._lock:
            now = time.monotonic()
            buckets = [(self._req, 1.0)] + ([(self._in, float(input_tokens))] if self._in else [])
            for b, _ in buckets:
                b.refill(now)
            wait = max(b.wait_for(n) for b, n in buckets)
            if wait > 0:
                self.refused += 1
                return wait
            for b, n in buckets:
                b.level -= min(n, b.capacity)
            self.accepted.append(now)
            return None

    def max_in_window(self, window_s: float | None = None) -> int:
        """The most calls accepted within any `window_s` (default: this limit's window)."""
        w = self.window_s if window_s is None else window_s
        times, most, j = sorted(self.accepted), 0, 0
        for i, t in enumerate(times):
            while t - times[j] >= w:
                j += 1
            most = max(most, i - j + 1)
        return most

    def headers(self) -> dict[str, str]:
        """The `anthropic-ratelimit-*` headers, as of now."""
        with self._lock:
            now = time.monotonic()
            out: dict[str, str] = {}
            for name, b in (("requests", self._req), ("input-tokens", self._in)):
                if b is None:
                    continue
                b.refill(now)
                full_in = (b.capacity - b.level) * 60.0 / b.per_minute
                reset = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=full_in)
                out[f"anthropic-ratelimit-{name}-limit"] = str(b.per_minute)
                out[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, int(b.level)))
                out[f"anthropic-ratelimit-{name}-reset"] = reset.strftime("%Y-%m-%dT%H:%M:%SZ")
            return out
