"""Test helpers shipped for users testing their own instrumentation."""

from hango_worker.testing.otlp_receiver import (
    OTLPReceiver,
    ReceivedEvent,
    ReceivedLink,
    ReceivedRequest,
    ReceivedSpan,
)

__all__ = ["OTLPReceiver", "ReceivedEvent", "ReceivedLink", "ReceivedRequest", "ReceivedSpan"]
