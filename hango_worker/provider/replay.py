"""ReplayProvider: a recorded run's model responses, served in order, with no model call.

`hango-worker replay` (run/replay.py) drives a recorded run with the current code and
this provider: call N gets the run's Nth recorded response, and the request it came
with is kept (`requests`) and fingerprinted (provider/fingerprint.py). When the run
recorded what it sent (`RecordedCall.sent`), a request whose fingerprint differs stops
the replay at once: the provider sets `divergence` and raises a ModelError of type
`replay_diverged` (not retryable), which ends the loop. A call past the last recorded
response raises `replay_exhausted`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hango_worker.provider.fingerprint import Fingerprints, fingerprint, first_difference
from hango_worker.provider.types import ModelError, Request, Response, TextSink

DIVERGED = "replay_diverged"
EXHAUSTED = "replay_exhausted"


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One recorded model call: its response, and the fingerprint of what was sent
    (None: recorded by a version that kept none)."""

    response: Response
    sent: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The first request that differs from the recorded one: its index (1-based) and
    the first field (provider/fingerprint.py FIELDS) that differs."""

    request: int
    field: str


@dataclass
class ReplayProvider:
    calls: list[RecordedCall]
    name: str = "replay"
    requests: list[Request] = field(default_factory=list)
    fingerprints: list[dict[str, Any]] = field(default_factory=list)
    divergence: Mismatch | None = None
    _fingerprints: Fingerprints = field(default_factory=Fingerprints)

    async def complete(self, request: Request, on_text: TextSink | None = None) -> Response:
        index = len(self.requests)
        self.requests.append(request)
        fp = fingerprint(request, self._fingerprints)
        self.fingerprints.append(fp)
        if index >= len(self.calls):
            self.divergence = Mismatch(index + 1, "calls")
            raise ModelError(
                EXHAUSTED,
                f"request {index + 1}: the recorded run made {len(self.calls)} model calls",
                retryable=False,
            )
        recorded = self.calls[index]
        if recorded.sent is not None:
            differs = first_difference(recorded.sent, fp)
            if differs is not None:
                self.divergence = Mismatch(index + 1, differs)
                raise ModelError(DIVERGED, f"request {index + 1}: {differs}", retryable=False)
        return recorded.response
