"""One vocabulary (hango_worker/vocab.py): the SQL, the code, the metrics and the docs use
no run status, attempt end or error type it does not define."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from hango_worker import vocab
from hango_worker.agent import ports
from hango_worker.store import schema
from hango_worker.telemetry import metrics
from hango_worker.tool import types as tool_types

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "hango_worker"
SQL_MODULES = [
    PKG / "store" / n
    for n in (
        "sql.py",
        "sql_checkpoint.py",
        "sql_claim.py",
        "repo.py",
        "gc.py",
        "schema.py",
        "tenants.py",
        "ratelimits.py",
        "purge.py",
        "retention.py",
    )
]
STATUS_WORDS = {str(s) for s in vocab.RunStatus} | {vocab.RELEASED}
ERROR_WORDS = {str(e) for e in vocab.ErrorType}


def _status_words_in_sql(text: str) -> set[str]:
    found: set[str] = set()
    for m in re.finditer(r"status(?:::\w+)?\s*(?:=|<>|!=)\s*'(\w+)'", text):
        found.add(m.group(1))
    for m in re.finditer(r"status(?:::\w+)?\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", text):
        found |= set(re.findall(r"'(\w+)'", m.group(1)))
    for m in re.finditer(r"status\s*=\s*CASE(.*?)END", text, re.S):
        found |= set(re.findall(r"(?:THEN|ELSE)\s+'(\w+)'", m.group(1)))
    for m in re.finditer(r"\$\d+::text\s*(?:=|IN)\s*\(?([^)\n]*)", text):
        found |= set(re.findall(r"'(\w+)'", m.group(1)))
    found |= set(re.findall(r"'status',\s*'(\w+)'", text))
    found |= set(re.findall(r"'(\w+)'\s+AS\s+status", text))
    return found


def test_sql_uses_only_known_statuses_and_error_types() -> None:
    statuses: set[str] = set()
    errors: set[str] = set()
    for path in SQL_MODULES:
        text = path.read_text(encoding="utf-8")
        statuses |= _status_words_in_sql(text)
        errors |= set(re.findall(r"'type',\s*'(\w+)'", text))
        errors |= set(re.findall(r"(?<!>)'(\w+)'\s+AS\s+error_type", text))
    assert {"queued", "running", "failed", "released"} <= statuses  # the scan sees them
    assert statuses <= STATUS_WORDS, statuses - STATUS_WORDS
    assert {"max_attempts", "invalid_row"} <= errors
    assert errors <= ERROR_WORDS, errors - ERROR_WORDS


def test_the_schema_metrics_and_ports_take_their_words_from_vocab() -> None:
    assert tuple(str(s) for s in vocab.RunStatus) == schema.RUN_STATUSES
    check = next(c for c in schema.runs.constraints if c.name == "runs_status_check")
    assert set(re.findall(r"'(\w+)'", str(check.sqltext))) == set(schema.RUN_STATUSES)
    assert set(metrics.RUN_STATUSES) == {str(s) for s in vocab.ATTEMPT_ENDS}
    assert set(typing.get_args(ports.Status)) == {str(s) for s in vocab.ATTEMPT_ENDS}
    assert set(metrics.TOOL_OUTCOMES) == set(tool_types.OUTCOMES)
    assert metrics.KNOWN_ERROR_TYPES == ERROR_WORDS
    for etype in vocab.ErrorType:
        assert metrics.error_type_label(etype) == str(etype)
    assert metrics.error_type_label("something_new") == "other"


def test_code_records_only_known_error_types() -> None:
    """Error dicts written by the code name their type through vocab.ErrorType, never a
    string of their own; a literal `"type": "<word>_error"`-like value would drift."""
    offenders = []
    for path in PKG.rglob("*.py"):
        if "testing" in path.parts:
            continue  # the fake API server speaks the API's words, not ours
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"\"type\":\s*\"(\w+)\"", text):
            if m.group(1) in ERROR_WORDS:
                offenders.append(f"{path.relative_to(ROOT)}: {m.group(0)}")
    assert offenders == []


def test_operations_doc_explains_every_error_type() -> None:
    """docs/operations.md's table of why a run failed names every error type."""
    doc = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    missing = sorted(e for e in ERROR_WORDS if f"`{e}`" not in doc)
    assert missing == []
