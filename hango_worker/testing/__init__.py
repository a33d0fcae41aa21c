"""Test helpers shipped for users testing their own code: an OTLP receiver and
FakeAnthropic, a local fake of the Anthropic Messages API.

The FakeAnthropic names are imported on first use (they pull in pydantic and the
scripted model), so ``import hango_worker.testing`` stays cheap.

Belongs here: fakes and harnesses that tests use in place of the real thing.
May import: `hango_worker`, `agent`, `client`, `config`, `console`, `provider`,
`render`, `run`, `store`, `telemetry`, `tool`, `vocab`, `watch`. Never imports the
programs `cli`, `demo` or `service`, and production code never imports this
package (import-linter contracts in `.importlinter`, `make lint`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from hango_worker.testing.otlp_receiver import (
    OTLPReceiver,
    ReceivedEvent,
    ReceivedLink,
    ReceivedRequest,
    ReceivedSpan,
)

if TYPE_CHECKING:
    from hango_worker.testing.fake_anthropic import (
        FakeAnthropic,
        FakeTurn,
        Fault,
        RecordedRequest,
        load_fake_script,
        parse_fake_script,
    )

_LAZY = {
    "FakeAnthropic",
    "FakeTurn",
    "Fault",
    "RecordedRequest",
    "load_fake_script",
    "parse_fake_script",
}

__all__ = [
    "FakeAnthropic",
    "FakeTurn",
    "Fault",
    "OTLPReceiver",
    "ReceivedEvent",
    "ReceivedLink",
    "ReceivedRequest",
    "ReceivedSpan",
    "RecordedRequest",
    "load_fake_script",
    "parse_fake_script",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module("hango_worker.testing.fake_anthropic"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
