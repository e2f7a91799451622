"""Run compile tasks in worker processes, each with a deadline, so no group can hang the run.

concurrent.futures cannot stop a task that never returns (an exponential lowering, an LLVM loop)
or survive a worker that dies (a crash inside native code) without breaking the whole pool.
Here a worker that overruns its deadline is killed and replaced, a worker that dies is replaced,
and either way only that one task fails.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable, Iterator

POLL_SECONDS = 0.2


def _serve(conn, fn: Callable) -> None:
    """The worker's loop: receive (key, args), answer (key, result), until told to stop."""
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        key, args = message
        conn.send((key, fn(*args)))


class _Worker:
    def __init__(self, ctx, fn: Callable):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, fn), daemon=True)
        self.process.start()
        child.close()
        self.task: tuple[Any, float] | None = None  # (key, started)

    def give(self, key, args) -> None:
        self.conn.send((key, args))
        self.task = (key, time.monotonic())

    def kill(self) -> None:
        self.process.kill()
        self.process.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
        self.conn.close()


def run_with_deadline(
    fn: Callable, tasks: dict[Any, tuple], jobs: int, timeout: float | None, on_failure: Callable[[str], Any]
) -> Iterator[tuple[Any, Any]]:
    """Yield (key, fn(*args)) for every task, or (key, on_failure(reason)) for one that timed out
    or whose worker died. `fn` must be importable (workers are spawned, not forked: TVM's threads
    do not survive a fork)."""
    ctx = multiprocessing.get_context("spawn")
    queue = deque(tasks.items())
    workers = [_Worker(ctx, fn) for _ in range(max(1, min(jobs, len(tasks))))]
    try:
        while queue or any(w.task for w in workers):
            for w in workers:
                if w.task is None and queue:
                    w.give(*queue.popleft())
            ready = wait([w.conn for w in workers if w.task], timeout=POLL_SECONDS)
            for i, w in enumerate(workers):
                if w.task is None:
                    continue
                key, started = w.task
                if w.conn in ready:
                    try:
                        done_key, result = w.conn.recv()
                    except (EOFError, OSError):
                        w.kill()
                        workers[i] = _Worker(ctx, fn)
                        yield key, on_failure(f"the compiler process died (exit code {w.process.exitcode})")
                        continue
                    w.task = None
                    yield done_key, result
                elif timeout is not None and time.monotonic() - started > timeout:
                    w.kill()
                    workers[i] = _Worker(ctx, fn)
                    yield key, on_failure(f"compile timed out after {timeout:.0f}s")
    finally:
        for w in workers:
            w.stop()
