"""Untrusted text never runs on the event loop unbounded: approval rules' patterns are
RE2 (agent/middlewares/hitl.py), linear in the text whatever the pattern."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hango_worker.agent.middlewares.hitl import ApprovalRule
from hango_worker.tool.threads import DaemonThreads


def test_a_catastrophic_pattern_matches_in_linear_time() -> None:
    """Proves: `(a+)+$` against 100,000 a's and a b, exponential for a backtracking
    engine (Python's `re` would not return in our lifetime), returns at once. Run on a
    daemon thread with a bound, so a regression fails here instead of hanging."""
    rule = ApprovalRule(tool="echo", when={"text": "(a+)+$"})
    args = {"text": "a" * 100_000 + "b"}
    outcome = DaemonThreads(1, "pattern").submit(rule.matches, "echo", args)
    assert outcome.result(timeout=10) is False
    assert rule.matches("echo", {"text": "aaa"}) is True


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=secret)", r"(?<!x)y"])
def test_what_re2_cannot_do_is_refused_when_the_rule_is_read(pattern: str) -> None:
    """Proves: a backreference or lookaround is refused with one line naming RE2."""
    with pytest.raises(ValidationError) as e:
        ApprovalRule(tool="echo", when={"text": pattern})
    (err,) = e.value.errors()
    assert "RE2 syntax" in err["msg"] and "\n" not in err["msg"]
