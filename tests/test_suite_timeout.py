"""The suite's own per-test timeout (pyproject.toml, tests/conftest.py): a test that
hangs fails the session naming the test, with the stack of the task that waits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HANGS = """
import asyncio


async def test_waits_forever() -> None:
    await asyncio.Event().wait()
"""


def test_a_hanging_test_fails_fast_naming_itself_and_its_stack(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's settings
    opts = ["timeout=2", "timeout_method=thread", "asyncio_mode=auto"]
    opts += [
        "asyncio_default_fixture_loop_scope=session",
        "asyncio_default_test_loop_scope=session",
    ]
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest"]
    args += ["-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
    for o in opts:
        args += ["-o", o]
    p = subprocess.run(
        [*args, str(tmp_path / "test_hangs.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-3000:]
    assert "test_hangs.py::test_waits_forever did not finish within 2s" in out, out[-3000:]
    assert "await asyncio.Event().wait()" in out  # the waiting task's stack
    assert "Stack of MainThread" in out  # and every thread's
