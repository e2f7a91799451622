"""Runs the build jobs of one kernel (one per ISA level) in forked child processes.

Why: a portable kernel is scheduled and built once per ISA level (three on x86-64), one after
another, and nearly all of that is single-threaded: the scheduling holds the GIL, and TVM's
LLVM options (`-x86-cmov-converter=false` for tree kernels) are global state that TVM applies
and reverts around each build, so two builds in threads of one process can revert each other's
options mid-build. A model with one big group (a tree ensemble) then compiled on one core while
the others idled: 14 s for the 100-tree depth-8 chain on this project's 2-core VM.

A forked child inherits the scheduled functions and TVM's state without pickling anything, builds
its level into its own object file, and exits; the parent meanwhile builds the best level itself.
Forking is safe here because a child never runs a kernel (TVM's thread pool, which does not
survive a fork, is never touched) and leaves through os._exit (no parent finalizer runs twice).
A child dies with its parent (PR_SET_PDEATHSIG), so a compile the pipeline kills for its deadline
leaves nothing running. The pipeline's workers themselves are spawned, not forked (workers.py):
they run kernels for verification.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections import deque
from collections.abc import Callable, Sequence

from ..errors import short_reason

_PR_SET_PDEATHSIG = 1


class ChildBuildFailed(RuntimeError):
    """A job failed in its child: "<job name>: <reason>"."""


def run_jobs(jobs: Sequence[tuple[str, Callable[[], None]]], parallel: int, in_parent: Callable[[], None]) -> None:
    """Runs `in_parent` here while each (name, job) runs in a forked child, at most `parallel`
    children at once; returns when all are done. A failure here kills the children and is
    raised; a child's is raised as ChildBuildFailed once every child has ended (the first one's).
    parallel < 1, or no fork: all here, in order."""
    if parallel < 1 or not sys.platform.startswith("linux"):
        in_parent()
        for _, job in jobs:
            job()
        return
    waiting = deque(jobs)
    running: dict[int, tuple[str, int]] = {}  # pid → (job name, read end of its reason pipe)
    failures: list[str] = []

    def start_children() -> None:
        while waiting and len(running) < parallel:
            name, job = waiting.popleft()
            pid, reason_fd = _fork(job)
            running[pid] = (name, reason_fd)

    try:
        start_children()
        in_parent()
    except BaseException:
        _stop(running)
        raise
    while running:
        pid = next(iter(running))  # the oldest: waiting for "any child" could reap one that is not ours
        _, status = os.waitpid(pid, 0)
        name, reason_fd = running.pop(pid)
        failure = _failure(name, status, reason_fd)
        if failure:
            failures.append(failure)
        start_children()
    if failures:
        raise ChildBuildFailed(failures[0])


def _fork(job: Callable[[], None]) -> tuple[int, int]:
    """(pid, read end of a pipe that carries the child's failure reason)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        code = 1
        try:
            _die_with_parent()
            job()
            code = 0
        except BaseException as exc:  # noqa: BLE001 - the parent gets the reason, whatever it was
            os.write(write_end, short_reason(exc).encode(errors="replace")[:2000])
        finally:
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def _failure(name: str, status: int, reason_fd: int) -> str | None:
    """Why the child building `name` failed, or None if it succeeded."""
    with os.fdopen(reason_fd, "rb") as pipe:
        reason = pipe.read().decode(errors="replace").strip()
    if os.WIFSIGNALED(status):
        return f"{name}: build process killed by {signal.Signals(os.WTERMSIG(status)).name}"
    if os.WEXITSTATUS(status) != 0:
        return f"{name}: {reason or f'build process exited with status {os.WEXITSTATUS(status)}'}"
    return None


def _stop(running: dict[int, tuple[str, int]]) -> None:
    """Kill and reap every running child (this process is failing anyway)."""
    for pid, (_, reason_fd) in running.items():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        os.close(reason_fd)
    running.clear()


def _die_with_parent() -> None:
    """Ask Linux to kill this child when its parent dies (a compile killed at its deadline)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before the request took effect
        os._exit(1)

