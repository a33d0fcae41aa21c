"""`make test-stress`: the tests that start a worker, a subprocess or a server, run round
after round while busy processes contend for every core (load as a test condition).

A race that needs a starved CPU to show (a write still in flight when a pool closes, a
task that ends after its replacement started) passes on an idle machine and fails on a
busy CI runner or a pod at its CPU limit. Each round starts `--hogs` busy processes
(default: two per core; each also stops itself after `--max-s` seconds, so none
outlives a killed run), runs the selection with the suite's per-test timeout, stops the
hogs, and reports; the first failing round ends it (exit code 1).

    make test-stress                          # 3 rounds, 2 hogs per core
    make test-stress STRESS_ARGS="--rounds 5 --hogs 6"
    .venv/bin/python -m tests.stress --list   # the selection only

The selection is every tests/test_*.py whose source starts one of these (MARKERS), so
a new test of that kind joins it by itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKERS = (
    "run_until_idle(",
    "serve(",
    "Worker(",
    "start_worker(",
    "create_subprocess_exec(",
    "subprocess.run(",
    "FakeAnthropic(",
    "OtlpReceiver(",
    "start_metrics_server(",
)
# Measured elsewhere or not a worker's behaviour: the benchmarks' smoke test (timing
# tools), the deploy files (image, wheel), the browser tests (`make test-browser`).
SKIP = {"test_bench_smoke.py", "test_deploy.py", "test_suite_timeout.py"}
HOG = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


def selection() -> list[str]:
    out = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name not in SKIP and any(m in path.read_text() for m in MARKERS):
            out.append(str(path.relative_to(ROOT)))
    return out


def start_hogs(n: int, max_s: float) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", HOG, str(max_s)]) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for h in hogs:
        h.kill()
    for h in hogs:
        h.wait(timeout=10)


def one_round(n: int, rounds: int, files: list[str], hogs: int, max_s: float) -> int:
    print(f"== round {n} of {rounds}: {len(files)} files beside {hogs} busy processes", flush=True)
    started = time.monotonic()
    busy = start_hogs(hogs, max_s)
    try:
        cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider"]
        code = subprocess.call([*cmd, "--durations=10", *files], cwd=ROOT)
    finally:
        stop_hogs(busy)
    load = os.getloadavg()[0]
    took = time.monotonic() - started
    print(f"== round {n}: exit {code} in {took:.0f}s (load average at the end {load:.1f})")
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.stress", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1))
    p.add_argument("--max-s", type=float, default=3600.0, help="each hog's own time limit")
    p.add_argument("--list", action="store_true", help="print the selection and stop")
    p.add_argument("files", nargs="*", help="test files instead of the selection")
    a = p.parse_args(argv)
    files = a.files or selection()
    if a.list:
        print("\n".join(files))
        return 0
    for n in range(1, a.rounds + 1):
        if one_round(n, a.rounds, files, a.hogs, a.max_s) != 0:
            print(f"test-stress: round {n} failed", file=sys.stderr)
            return 1
    print(f"test-stress: {a.rounds} rounds passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
