"""The threads sync tool functions run in: daemon threads, so that a tool that never
returns cannot keep a stopping worker alive.

`concurrent.futures.ThreadPoolExecutor` joins its threads when the interpreter exits
(and `asyncio.run` waits for the default executor), so one hung sync tool, already
answered with a timeout and abandoned by its run, would hold `hango-worker run` after
SIGTERM until the tool returned: forever, for a tool stuck on a dead socket. A daemon
thread is dropped at exit instead (docs/system-architecture.md, "Graceful shutdown").
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonThreads(Executor):
    """At most `max_workers` daemon threads, started as calls arrive, taking calls in
    order; an idle thread takes the next call before a new thread is started."""

    def __init__(self, max_workers: int, name: str) -> None:
        self.max_workers = max_workers
        self.name = name
        self._calls: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        done: Future[T] = Future()
        self._calls.put((done, fn, args, kwargs))
        if not self._idle.acquire(timeout=0):
            self._start_thread()
        return done

    def _start_thread(self) -> None:
        with self._lock:
            if len(self._threads) >= self.max_workers:
                return
            t = threading.Thread(
                target=self._work, name=f"{self.name}_{len(self._threads)}", daemon=True
            )
            t.start()
            self._threads.append(t)

    def _work(self) -> None:
        while True:
            done, fn, args, kwargs = self._calls.get()
            if done.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as e:  # handed to the caller, as an executor does
                    done.set_exception(e)
                else:
                    done.set_result(result)
            del done, fn, args, kwargs
            self._idle.release()
