"""`make mutate`: mutation testing of hango_worker/agent and hango_worker/run (mutmut).

    python -m tests.mutation [--jobs N] [--only PATTERN] [PROFILE ...]

Each profile mutates one package and judges every mutant by the tests that are
fast enough to run once per mutant (mutmut runs only the tests that executed
the mutated function, stopping at the first failure):

- ``agent``: the whole package, by the in-memory tests and the tool-safety
  tests (and the few worker tests among them, on the shared Postgres below);
- ``run``: ``execute.py`` (load a claimed run, build its stack, drive the loop),
  by ``tests/test_worker.py``, ``tests/test_stack.py`` and ``tests/test_poison.py``
  (the load paths for malformed rows) against one embedded
  Postgres started here and shared by every mutant. Each of its mutants costs a
  few seconds of worker tests, so the rest of run/ (io.py, worker.py,
  listener.py, stream.py: about 900 more mutants) is left out to keep a full run
  under about 40 minutes on two cores;
- ``limits``, ``batch``, ``group``, ``ratelimit``, ``worker``, ``provider``,
  ``hostile``, ``console``: one file (or package, or a few files)
  each, by the tests that exercise it (see PROFILES); ``console`` has about 2500
  mutants, so run it a file at a time (``--only 'hango_worker.console.auth.*'``).

Each profile works in its own copy under ``.mutants/<profile>/`` with its own
``[tool.mutmut]`` section, so a rerun re-tests only what changed. The score is
killed (or timed out) / mutants tested, per profile. See docs/mutation-testing.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutants"
MUTMUT = Path(sys.executable).parent / "mutmut"


@dataclass(frozen=True)
class Profile:
    only_mutate: tuple[str, ...]
    tests: tuple[str, ...]
    database: bool = False


PROFILES = {
    "agent": Profile(
        only_mutate=("hango_worker/agent/*",),
        tests=(
            "tests/test_loop.py",
            "tests/test_chain.py",
            "tests/test_middlewares.py",
            "tests/test_state.py",
            "tests/test_stack.py",
            "tests/test_tool_safety.py",
        ),
        # a few of these tests use Postgres: one shared server, never one per mutant
        # (a mutant stopped at its time limit would leave its own server running)
        database=True,
    ),
    # the one way to stop early and the human in the loop: pure logic, fast tests
    "limits": Profile(
        only_mutate=("hango_worker/agent/limits.py", "hango_worker/agent/middlewares/hitl.py"),
        tests=("tests/test_limits.py", "tests/test_hitl.py"),
        database=True,
    ),
    "run": Profile(
        only_mutate=("hango_worker/run/execute.py",),
        tests=("tests/test_worker.py", "tests/test_stack.py", "tests/test_poison.py"),
        database=True,
    ),
    # a turn's tool calls side by side (also in `agent`, judged there without the
    # parallel-call tests): the batch, suspension, resume, limits, cancel
    "batch": Profile(
        only_mutate=("hango_worker/agent/batch.py",),
        tests=(
            "tests/test_parallel_tools.py",
            "tests/test_loop.py",
            "tests/test_tool_safety.py",
            "tests/test_limits.py",
            "tests/test_hitl.py",
            "tests/test_subagents.py",
            "tests/hostile/test_tool_ids.py",
        ),
        database=True,
    ),
    # group commit: fenced writes of concurrent runs in one transaction, on Postgres
    "group": Profile(
        only_mutate=("hango_worker/run/group.py",),
        tests=("tests/test_group_commit.py",),
        database=True,
    ),
    # the fleet-wide rate gate before each model call (the bucket SQL is checked by hand)
    "ratelimit": Profile(
        only_mutate=("hango_worker/run/ratelimit.py",),
        tests=("tests/test_ratelimit.py", "tests/hostile/test_rate_limits.py"),
        database=True,
    ),
    # the worker's claim loop, heartbeat and shutdown, and the shutdown path's bounded
    # waits (hostile control channels: a bare NOTIFY, a parent cycle, an orphan)
    "worker": Profile(
        only_mutate=("hango_worker/run/worker.py", "hango_worker/run/bounded.py"),
        tests=(
            "tests/test_worker.py",
            "tests/test_shutdown.py",
            "tests/test_heartbeat.py",
            "tests/hostile/test_control_channels.py",
            "tests/hostile/test_trees_and_orphans.py",
        ),
        database=True,
    ),
    # the stream folded into whole blocks, and the request parameters from the SDK
    "provider": Profile(
        only_mutate=("hango_worker/provider/accumulate.py", "hango_worker/provider/params.py"),
        tests=(
            "tests/test_content_blocks.py",
            "tests/test_request_params.py",
            "tests/test_anthropic_provider.py",
            "tests/test_bad_output.py",
        ),
        database=True,
    ),
    # hostile input: the one JSON nesting rule, memory paths (a file or a directory)
    "hostile": Profile(
        only_mutate=("hango_worker/store/json_limits.py", "hango_worker/agent/memory_files.py"),
        tests=(
            "tests/hostile/test_producer_json.py",
            "tests/hostile/test_memory_paths.py",
            "tests/test_memory.py",
        ),
        database=True,
    ),
    # the run console over HTTP (a real uvicorn per test): auth, CSRF, pages, decisions
    "console": Profile(
        only_mutate=("hango_worker/console/*", "hango_worker/store/console_queries.py"),
        tests=("tests/test_console.py",),
        database=True,
    ),
}


def _toml_list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{i}"' for i in items) + "]"


def prepare(name: str, profile: Profile) -> Path:
    """Refresh the profile's copy of the sources; keep its mutmut state (mutants/)."""
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    for folder in ("hango_worker", "tests", "alembic"):
        shutil.rmtree(work / folder, ignore_errors=True)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
        shutil.copytree(ROOT / folder, work / folder, ignore=ignore)  # copy2 keeps mtimes
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    text = re.sub(r"(?ms)^\[tool\.mutmut\]\n.*?(?=^\[)", "", text)
    text += (
        "\n[tool.mutmut]\n"
        'source_paths = ["hango_worker/"]\n'
        # the migrations live beside the package (alembic/), not in it
        'also_copy = ["alembic/"]\n'
        f"only_mutate = {_toml_list(profile.only_mutate)}\n"
        'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
        # a mutant that hangs the worker is a kill; give up on it after ~5x its tests' time
        "timeout_multiplier = 5.0\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(profile.tests)}\n"
    )
    (work / "pyproject.toml").write_text(text, encoding="utf-8")
    return work


@contextmanager
def database(wanted: bool) -> Iterator[dict[str, str]]:
    """One embedded Postgres for every mutant of the profile, stopped here at the
    end; the tests' own per-test databases live in it (not a server per mutant)."""
    env = {k: v for k, v in os.environ.items() if k != "HANGO_DATABASE_URL"}
    if not wanted:
        yield env
        return
    from hango_worker.store import embedded

    root = tempfile.mkdtemp(prefix="hango-mutate-")
    server, dsn = embedded.start(root)
    try:
        yield {**env, "HANGO_DATABASE_URL": dsn}
    finally:
        embedded.stop(server)
        shutil.rmtree(root, ignore_errors=True)


def results(work: Path) -> dict[str, str]:
    """Mutant name → mutmut's verdict (killed, survived, no tests, timeout, …)."""
    out = subprocess.run(
        [str(MUTMUT), "results", "--all", "true"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    pairs = (line.strip().rsplit(": ", 1) for line in out.splitlines() if "__mutmut_" in line)
    return {name: verdict for name, verdict in pairs}


def mutate(work: Path, env: dict[str, str], jobs: int, only: tuple[str, ...] = ()) -> None:
    """mutmut re-tests new and changed functions only and keeps every other verdict;
    a survivor of an earlier run is re-tested too, since tests may have been added.
    (Which tests run which function is learnt again only for new tests: after
    changing existing ones, delete .mutants/<profile> for an exact score.)"""
    earlier = (work / "mutants").exists()
    run = [str(MUTMUT), "run", "--max-children", str(jobs)]
    subprocess.run([*run, *only], cwd=work, env=env, check=True)
    if earlier:
        alive = [n for n, v in _only(results(work), only).items() if v in ("survived", "no tests")]
        if alive:
            subprocess.run([*run, *alive], cwd=work, env=env, check=True)


def _only(verdicts: dict[str, str], only: tuple[str, ...]) -> dict[str, str]:
    """The verdicts of the mutants `only` names (fnmatch patterns, as mutmut takes them)."""
    if not only:
        return verdicts
    return {n: v for n, v in verdicts.items() if any(fnmatch.fnmatch(n, p) for p in only)}


def summarize(name: str, work: Path, only: tuple[str, ...] = ()) -> str:
    status = Counter(_only(results(work), only).values())
    total = sum(n for k, n in status.items() if k not in ("not checked", "skipped"))
    killed = status["killed"] + status["timeout"]
    score = 100.0 * killed / total if total else 0.0
    counts = ", ".join(f"{k} {v}" for k, v in sorted(status.items()))
    partial = " — INCOMPLETE: run again to finish" if status["not checked"] else ""
    return f"{name}: score {score:.1f}% ({killed}/{total} killed; {counts}){partial}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__)
    p.add_argument("profiles", nargs="*", help=f"any of {', '.join(PROFILES)} (default: all)")
    p.add_argument("--jobs", type=int, default=2, help="mutants tested at once (default 2)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="test (and score) only the mutants whose names match, e.g. "
        "'hango_worker.console.auth.*' (repeatable; a later run without it tests the rest)",
    )
    args = p.parse_args(argv)
    unknown = [n for n in args.profiles if n not in PROFILES]
    if unknown or args.jobs < 1:
        p.error(
            f"unknown profile {unknown} (known: {', '.join(PROFILES)})" if unknown else "--jobs"
        )
    lines = []
    for name in args.profiles or list(PROFILES):
        profile = PROFILES[name]
        work = prepare(name, profile)
        only = tuple(args.only)
        with database(profile.database) as env:
            mutate(work, env, args.jobs, only)
        subprocess.run([str(MUTMUT), "results"], cwd=work, check=True)  # the survivors
        lines.append(summarize(name, work, only))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
