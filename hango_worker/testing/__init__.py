"""Test helpers shipped for users testing their own code: an OTLP receiver,
FakeAnthropic, a local fake of the Anthropic Messages API, `run_agent` (a run driven
in memory, testing/inmem.py) and `load_export` (a run exported by `hango-worker runs
export` as a fixture, testing/exported.py).

Those names are imported on first use (they pull in pydantic, the scripted model and
the agent loop), so ``import hango_worker.testing`` stays cheap.

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
    from hango_worker.testing.exported import ExportedRun, load_export
    from hango_worker.testing.fake_anthropic import (
        FakeAnthropic,
        FakeTurn,
        Fault,
        RecordedRequest,
        load_fake_script,
        parse_fake_script,
    )
    from hango_worker.testing.inmem import run_agent

# name → the module it is imported from on first use
_MODULES = {
    "ExportedRun": "hango_worker.testing.exported",
    "load_export": "hango_worker.testing.exported",
    "run_agent": "hango_worker.testing.inmem",
}
_LAZY = {
    "FakeAnthropic",
    "FakeTurn",
    "Fault",
    "RecordedRequest",
    "load_fake_script",
    "parse_fake_script",
}

__all__ = [
    "ExportedRun",
    "FakeAnthropic",
    "FakeTurn",
    "Fault",
    "OTLPReceiver",
    "ReceivedEvent",
    "ReceivedLink",
    "ReceivedRequest",
    "ReceivedSpan",
    "RecordedRequest",
    "load_export",
    "load_fake_script",
    "parse_fake_script",
    "run_agent",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY or name in _MODULES:
        module = _MODULES.get(name, "hango_worker.testing.fake_anthropic")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, *_MODULES})
