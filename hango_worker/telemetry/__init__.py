"""Telemetry: tracing and metrics. A leaf: imports nothing else from hango_worker."""
