"""Waiting for spinning neighbour threads before a timed round (onnxfuse.measure.idle)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from onnxfuse.measure import idle
from onnxfuse.measure.timing import alternating_rounds


class FakeMachine:
    """A clock, a sleep that advances it, and the other threads' CPU time: busy (using a whole
    core) until `busy_until` seconds, idle after."""

    def __init__(self, busy_until: float, reports: bool = True):
        self.now = 0.0
        self.busy_until = busy_until
        self.reports = reports
        self.sleeps = 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds

    def cpu_ns(self) -> int | None:
        return int(min(self.now, self.busy_until) * 1e9) if self.reports else None

    def runnable(self) -> bool:
        return self.now < self.busy_until

    def wait(self, **kwargs) -> float:
        return idle.wait_until_idle(clock=self.clock, sleep=self.sleep, cpu_ns=self.cpu_ns, runnable=self.runnable,
                                    **kwargs)


def test_returns_after_one_poll_when_the_others_are_idle():
    machine = FakeMachine(busy_until=0.0)
    assert machine.wait() == pytest.approx(idle.POLL_SECONDS)
    assert machine.sleeps == 1


def test_waits_while_another_thread_spins_and_no_longer():
    machine = FakeMachine(busy_until=0.05)
    waited = machine.wait()
    assert 0.05 <= waited <= 0.05 + 2 * idle.POLL_SECONDS


def test_a_spinner_waiting_for_a_core_is_not_idle():
    """On a loaded machine a spinning thread may get no CPU during a poll: its state (runnable)
    still shows it is not idle."""
    machine = FakeMachine(busy_until=0.05)
    machine.cpu_ns = lambda: 0  # descheduled throughout: no CPU time gained
    waited = machine.wait()
    assert 0.05 <= waited <= 0.05 + 2 * idle.POLL_SECONDS


def test_gives_up_after_max_wait_when_the_others_never_stop():
    machine = FakeMachine(busy_until=float("inf"))
    assert machine.wait(max_wait=0.1) == pytest.approx(0.1, abs=idle.POLL_SECONDS)


def test_pauses_for_a_spin_where_cpu_times_are_not_reported():
    machine = FakeMachine(busy_until=0.0, reports=False)
    assert machine.wait() == pytest.approx(idle.FALLBACK_PAUSE_SECONDS)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_a_real_spinning_thread_is_waited_for_and_the_caller_is_not_counted():
    spin_seconds = 0.15
    started = threading.Event()

    def spin():
        started.set()
        end = time.perf_counter() + spin_seconds
        while time.perf_counter() < end:
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    started.wait()
    start = time.perf_counter()
    idle.wait_until_idle()
    waited = time.perf_counter() - start
    spinner.join()
    assert waited >= spin_seconds / 2  # it did not return while the spinner ran

    idle.wait_until_idle()  # pools left by earlier tests (BLAS, onnxruntime) may still spin
    own_before = idle.other_threads_cpu_ns()
    end = time.perf_counter() + 0.05
    while time.perf_counter() < end:  # the caller spinning is not "another thread"
        pass
    assert idle.other_threads_cpu_ns() - own_before < 0.025e9


def test_rounds_wait_before_each_contender_only_when_several_take_turns():
    log: list[str] = []
    calls = [lambda: log.append("a"), lambda: log.append("b")]
    alternating_rounds(calls, [1, 1], 2, wait_until_idle=lambda: log.append("wait"))
    assert log == ["wait", "a", "wait", "b", "wait", "b", "wait", "a"]

    log.clear()
    alternating_rounds(calls[:1], [3], 2, wait_until_idle=lambda: log.append("wait"))
    assert log == ["a"] * 6

