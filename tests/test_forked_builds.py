"""forked_builds.py: level builds in forked children, their failures reported, none left behind."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from onnxfuse.codegen.forked_builds import ChildBuildFailed, run_jobs


def _write(path: Path, text: str):
    return lambda: path.write_text(f"{text} {os.getpid()}")


def test_jobs_run_in_children_while_the_parent_works(tmp_path):
    parent_pid = os.getpid()
    run_jobs([(f"level{i}", _write(tmp_path / f"{i}.txt", f"job{i}")) for i in range(3)], 2,
             _write(tmp_path / "parent.txt", "parent"))
    pids = {p.stem: int(p.read_text().split()[1]) for p in tmp_path.iterdir()}
    assert pids["parent"] == parent_pid
    children = [pids[str(i)] for i in range(3)]
    assert parent_pid not in children and len(set(children)) == 3


def test_parallel_zero_runs_everything_here_in_order(tmp_path):
    order = []
    run_jobs([("a", lambda: order.append("a")), ("b", lambda: order.append("b"))], 0, lambda: order.append("parent"))
    assert order == ["parent", "a", "b"]


def test_a_childs_exception_comes_back_with_its_job_name_and_reason(tmp_path):
    def fails():
        raise ValueError("no such register")

    with pytest.raises(ChildBuildFailed, match="x86-64-v3: no such register"):
        run_jobs([("x86-64-v3", fails), ("x86-64", _write(tmp_path / "ok.txt", "ok"))], 2, lambda: None)
    assert (tmp_path / "ok.txt").exists()  # the other child still finished


def test_a_child_killed_by_a_signal_is_named(tmp_path):
    with pytest.raises(ChildBuildFailed, match="x86-64: build process killed by SIGKILL"):
        run_jobs([("x86-64", lambda: os.kill(os.getpid(), signal.SIGKILL))], 1, lambda: None)


def test_a_failing_parent_stops_its_children(tmp_path):
    marker = tmp_path / "late.txt"

    def slow():
        time.sleep(3)
        marker.write_text("should not be written")

    def parent_fails():
        raise RuntimeError("parent build failed")

    with pytest.raises(RuntimeError, match="parent build failed"):
        run_jobs([("slow", slow)], 1, parent_fails)
    time.sleep(3.5)
    assert not marker.exists()


def test_other_children_of_the_process_are_left_alone(tmp_path):
    import subprocess

    other = subprocess.Popen(["sh", "-c", "exit 3"])
    run_jobs([("quick", _write(tmp_path / "q.txt", "q"))], 1, lambda: time.sleep(1))
    assert other.wait(timeout=5) == 3  # still there to reap, with its own status
