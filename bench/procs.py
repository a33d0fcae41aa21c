"""Worker subprocesses: start, read their stdout lines, measure, stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

HANGO_RUN = ("-m", "hango_worker.cli", "run")
ROOT = Path(__file__).resolve().parent.parent  # so `-m bench.workers` resolves


def hango_env(dsn: str, script: Path, **over: str) -> dict[str, str]:
    """`hango-worker run` as documented for production, except the scripted model."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HANGO_", "OTEL_"))}
    env.update(
        {
            "HANGO_DATABASE_URL": dsn,
            "HANGO_MODEL_PROVIDER": "scripted",
            "HANGO_SCRIPT": str(script),
            "HANGO_METRICS_PORT": "0",
            "HANGO_LOG_LEVEL": "WARNING",
        }
    )
    env.update(over)
    return env


class Procs:
    """A few worker processes; their stdout lines go to `on_line(index, line)`."""

    def __init__(self, on_line: Callable[[int, str], None] | None = None) -> None:
        self.procs: list[asyncio.subprocess.Process] = []
        self.on_line = on_line
        self._readers: list[asyncio.Task[None]] = []
        self.started = 0

    async def start(self, args: Sequence[str], env: dict[str, str] | None = None) -> None:
        p = await asyncio.create_subprocess_exec(
            sys.executable,
            *args,
            env=env,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        index = len(self.procs)
        self.procs.append(p)
        self._readers.append(asyncio.create_task(self._read(index, p)))
        self._readers.append(asyncio.create_task(self._drain_stderr(p)))

    async def _read(self, index: int, p: asyncio.subprocess.Process) -> None:
        assert p.stdout is not None
        async for raw in p.stdout:
            line = raw.decode().rstrip("\n")
            if line == "started":
                self.started += 1
            elif self.on_line is not None:
                self.on_line(index, line)

    async def _drain_stderr(self, p: asyncio.subprocess.Process) -> None:
        assert p.stderr is not None
        tail: list[str] = []
        async for raw in p.stderr:
            tail = [*tail[-20:], raw.decode(errors="replace").rstrip()]
        self.stderr_tail = tail

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def check_alive(self) -> None:
        for p in self.procs:
            if p.returncode is not None:
                tail = "\n".join(getattr(self, "stderr_tail", []))
                raise RuntimeError(f"worker process exited with {p.returncode}:\n{tail}")

    async def stop(self) -> None:
        for p in self.procs:
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                await asyncio.wait_for(p.wait(), timeout=15)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        for t in self._readers:
            t.cancel()
        for t in self._readers:
            with contextlib.suppress(asyncio.CancelledError):
                await t


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU of these processes so far (psutil, or /proc without it)."""
    total = 0.0
    for pid in pids:
        try:
            import psutil

            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except ImportError:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except Exception:
            continue
    return total


def rss_bytes(pid: int) -> int:
    try:
        import psutil

        return int(psutil.Process(pid).memory_info().rss)
    except ImportError:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    return 0
