"""Waiting until the other threads of this process stop using the CPU.

Why: TVM's pool threads, and onnxruntime's unless a session turns spinning off, spin after a
call (onnxruntime's about 50 ms on this machine). When contenders take turns in one process, the
one that just ran then keeps a core busy through the next one's round, and a 2-thread contender
competes with a spinning neighbour. So each round starts once the neighbours are idle.

Linux reports each thread's CPU time in nanoseconds in /proc/self/task/<tid>/schedstat; where
that is missing, the wait is a fixed pause as long as onnxruntime's spin. CPU time alone is not
enough on a loaded machine: a spinning thread waiting for a core gains none during a poll, so
a poll also finds no other thread runnable (state R in /proc/self/task/<tid>/stat) before it
counts as idle. (A spinner descheduled for one 2 ms poll passed as idle in a CI run with two
test workers and compile processes on two cores.)
"""

from __future__ import annotations

import os
import threading
import time

POLL_SECONDS = 0.002
IDLE_SHARE = 0.05  # the other threads together used under 5% of one core during a poll
MAX_WAIT_SECONDS = 0.5
FALLBACK_PAUSE_SECONDS = 0.06  # without schedstat: longer than onnxruntime's default spin

_TASKS = "/proc/self/task"


def _other_threads(name: str) -> list[str] | None:
    """The text of /proc/self/task/<tid>/`name` for every thread of this process except the
    calling one (threads that ended meanwhile left out), or None where the kernel has no task list."""
    me = str(threading.get_native_id())
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    texts = []
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"{_TASKS}/{tid}/{name}") as stat:
                texts.append(stat.read())
        except OSError:
            continue  # the thread ended
    return texts


def other_threads_cpu_ns() -> int | None:
    """CPU nanoseconds used so far by every thread of this process except the calling one, or
    None where the kernel does not report it."""
    texts = _other_threads("schedstat")
    if texts is None:
        return None
    total = 0
    for text in texts:
        try:
            total += int(text.split()[0])
        except (ValueError, IndexError):
            continue  # reports nothing: it is not spinning
    return total


def other_threads_runnable() -> bool:
    """Whether another thread of this process is running or waiting for a core (state R)."""
    return any(text.rpartition(")")[2].split()[:1] == ["R"] for text in _other_threads("stat") or [])


def wait_until_idle(max_wait: float = MAX_WAIT_SECONDS, clock=time.perf_counter, sleep=time.sleep,
                    cpu_ns=other_threads_cpu_ns, runnable=other_threads_runnable) -> float:
    """Blocks until the other threads of this process use (almost) no CPU, at most `max_wait`
    seconds; returns how long it waited."""
    start = clock()
    before = cpu_ns()
    if before is None:
        sleep(FALLBACK_PAUSE_SECONDS)
        return clock() - start
    while clock() - start < max_wait:
        poll_start = clock()
        sleep(POLL_SECONDS)
        after = cpu_ns()
        if after is None:
            break
        busy = (after - before) / 1e9
        if busy <= IDLE_SHARE * max(clock() - poll_start, POLL_SECONDS) and not runnable():
            break
        before = after
    return clock() - start
