"""Run compile tasks in worker processes, each with a deadline, so no group can hang the run.

concurrent.futures cannot stop a task that never returns (an exponential lowering, an LLVM loop)
or survive a worker that dies (a crash inside native code) without breaking the whole pool.
Here a worker that overruns its deadline is killed and replaced, a worker that dies is replaced,
and either way only that one task fails.

Workers are spawned, so each re-imports the caller's main module. Where that cannot work (a
script piped to `python -` has no file to re-import) no worker ever starts; every worker
therefore reports ready first, and if one cannot, the tasks run in this process instead, one by
one and without deadlines, rather than failing them all.
"""

from __future__ import annotations

import multiprocessing
import time
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from typing import Any

from .fatal_signals import die_promptly_on_fatal_signals

POLL_SECONDS = 0.2
STARTUP_SECONDS = 120.0  # a worker imports TVM before it reports ready; slow disks take a while
READY = "ready"


class WorkersCannotStart(Exception):
    """A worker process died or stayed silent before it could take a task."""


def _serve(conn, fn: Callable) -> None:
    """The worker's loop: report ready, then receive (key, args) and answer (key, result) until
    told to stop. A crash in native code ends the worker at once (fatal_signals) instead of
    leaving it hung until its deadline."""
    die_promptly_on_fatal_signals()
    conn.send(READY)
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
        self.ready = False

    def await_ready(self, timeout: float = STARTUP_SECONDS) -> None:
        """Block until the worker has started; WorkersCannotStart if it died or stayed silent."""
        if self.ready:
            return
        try:
            if not self.conn.poll(timeout) or self.conn.recv() != READY:
                raise WorkersCannotStart(f"no worker process started within {timeout:.0f}s")
        except (EOFError, OSError):
            self.process.join(5)
            raise WorkersCannotStart(f"worker processes exit at startup (exit code {self.process.exitcode})") from None
        self.ready = True

    def give(self, key, args) -> None:
        self.await_ready()
        try:
            self.conn.send((key, args))
        except OSError:
            raise WorkersCannotStart("a worker process closed its pipe before its first task") from None
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
    do not survive a fork). If workers cannot start at all, the tasks not yet given run here."""
    queue = deque(tasks.items())
    try:
        yield from _run_in_workers(fn, queue, jobs, timeout, on_failure)
    except WorkersCannotStart as exc:
        warnings.warn(f"onnxfuse: {exc}; compiling in this process, without deadlines", RuntimeWarning, stacklevel=2)
        while queue:
            key, args = queue.popleft()
            yield key, fn(*args)


def _run_in_workers(fn: Callable, queue: deque, jobs: int, timeout: float | None,
                    on_failure: Callable[[str], Any]) -> Iterator[tuple[Any, Any]]:
    """run_with_deadline's pool; a task stays in `queue` until a started worker has it."""
    ctx = multiprocessing.get_context("spawn")
    workers = [_Worker(ctx, fn) for _ in range(max(1, min(jobs, len(queue))))]
    tasks_given: dict = {}  # key → (key, args) of every task a worker took
    try:
        while queue or any(w.task for w in workers):
            for w in workers:
                if w.task is None and queue:
                    try:
                        w.give(*queue[0])
                    except WorkersCannotStart:
                        # Tasks already given go back too: this run will not wait for them.
                        queue.extendleft(reversed([tasks_given[other.task[0]] for other in workers if other.task]))
                        raise
                    given = queue.popleft()
                    tasks_given[given[0]] = given
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
