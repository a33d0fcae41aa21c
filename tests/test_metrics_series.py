"""The metrics operators alert on: final model failures apart from retries, series that
exist at 0 from the start, build info, run slots, run-duration buckets that reach hours,
and one list of error types shared by the provider and the metric labels."""

from __future__ import annotations

import ast
from pathlib import Path

import asyncpg
from prometheus_client import REGISTRY, generate_latest

from hango_worker import vocab
from hango_worker.telemetry import metrics
from hango_worker.testing.inmem import run_agent
from tests.helpers import agent, scripted
from tests.worker_helpers import enqueue, make_agent, run_until_idle

PROVIDER = Path(__file__).resolve().parent.parent / "hango_worker" / "provider"


def sample(name: str, **labels: str) -> float:
    value = REGISTRY.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


async def test_a_retried_then_successful_call_is_a_retry_not_a_failure() -> None:
    retries = sample("hango_model_retries_total", error_type="rate_limit_error")
    failures = sample("hango_model_failures_total", error_type="rate_limit_error")
    provider = scripted(
        {"text": "ok", "error": {"type": "rate_limit_error", "retryable": True, "times": 2}}
    )
    outcome, _, _ = await run_agent(agent(), provider)
    assert outcome.status == "succeeded"
    assert sample("hango_model_retries_total", error_type="rate_limit_error") == retries + 2
    assert sample("hango_model_failures_total", error_type="rate_limit_error") == failures


async def test_a_call_that_fails_for_good_is_counted_once() -> None:
    failures = sample("hango_model_failures_total", error_type="overloaded_error")
    auth = sample("hango_model_failures_total", error_type="authentication_error")
    provider = scripted(
        {"text": "ok", "error": {"type": "overloaded_error", "retryable": True, "times": 50}}
    )
    outcome, _, _ = await run_agent(agent(), provider)
    assert outcome.status == "failed"
    assert sample("hango_model_failures_total", error_type="overloaded_error") == failures + 1
    provider = scripted({"text": "ok", "error": {"type": "authentication_error"}})
    outcome, _, _ = await run_agent(agent(), provider)
    assert outcome.status == "failed"
    assert sample("hango_model_failures_total", error_type="authentication_error") == auth + 1


def test_known_label_values_exist_from_the_start() -> None:
    text = generate_latest(REGISTRY).decode()
    for status in ("succeeded", "failed", "cancelled", "released"):
        assert f'hango_runs_finished_total{{status="{status}"}}' in text, status
        assert f'hango_run_duration_seconds_count{{status="{status}"}}' in text, status
    for etype in ("max_attempts", "max_turns", "rate_limit_error", "internal_error", "other"):
        assert f'hango_runs_failed_total{{error_type="{etype}"}}' in text, etype
    for etype in ("rate_limit_error", "overloaded_error", "api_connection_error", "other"):
        assert f'hango_model_failures_total{{error_type="{etype}"}}' in text, etype
        assert f'hango_model_retries_total{{error_type="{etype}"}}' in text, etype
    assert 'hango_worker_slots{state="used"}' in text
    assert 'hango_worker_slots{state="total"}' in text


def test_build_info_names_the_installed_version() -> None:
    from importlib.metadata import version

    assert sample("hango_build_info", version=version("hango-worker")) == 1.0


def test_run_duration_buckets_reach_hours() -> None:
    bounds = [b for b in metrics.RUN_DURATION._upper_bounds if b != float("inf")]
    assert bounds == sorted(bounds)
    assert bounds[0] <= 1.0 and bounds[-1] >= 4 * 3600


def _provider_error_literals() -> set[str]:
    """Error-type strings the provider modules spell out themselves instead of naming
    `vocab.ErrorType` members (only `is_error`, a tool-result field, may appear)."""
    found: set[str] = set()
    for path in sorted(PROVIDER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and value.endswith("_error") and value.isidentifier():
                found.add(value)
    found.discard("is_error")
    return found


def test_provider_error_types_keep_their_label() -> None:
    """The provider names its error types from the one list, which metrics label by."""
    assert _provider_error_literals() == set()
    for etype in vocab.MODEL_ERROR_TYPES:
        assert metrics.error_type_label(etype) == str(etype)
    assert {"api_connection_error", "api_timeout_error", "malformed_stream"} <= {
        str(e) for e in vocab.MODEL_ERROR_TYPES
    }
    assert metrics.error_type_label("something_new") == "other"


async def test_slots_gauge_follows_the_worker(pool: asyncpg.Pool, dsn: str) -> None:
    await make_agent(pool, tools=[])
    await enqueue(pool)
    stats = await run_until_idle(dsn, scripted({"text": "done"}), worker_concurrency=3)
    assert stats.claimed == 1
    assert sample("hango_worker_slots", state="total") == 3
    assert sample("hango_worker_slots", state="used") == 0
    # every registered tool has its outcome series, called or not
    for outcome in ("ok", "error"):
        assert sample("hango_tool_calls_total", gen_ai_tool_name="calculator", outcome=outcome) >= 0
