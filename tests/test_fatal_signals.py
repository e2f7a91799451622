"""A crash in native code ends the process with faulthandler's traceback, not in TVM's handler."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from onnxfuse.bench import worker_failure

SEGFAULT = "import ctypes; ctypes.string_at(0)"


def crash_after(setup: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", f"{setup}\n{SEGFAULT}"], capture_output=True, text=True,
                          timeout=120)


def test_without_it_tvms_handler_prints_the_crash():
    """The control: TVM's library, once loaded, owns SIGSEGV."""
    proc = crash_after("import tvm")
    assert proc.returncode == -signal.SIGSEGV
    assert "Segfault encountered" in proc.stderr


def test_with_it_faulthandler_reports_and_the_default_action_kills():
    proc = crash_after("import tvm\nfrom onnxfuse.fatal_signals import die_promptly_on_fatal_signals\n"
                       "die_promptly_on_fatal_signals()")
    assert proc.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert "Segfault encountered" not in proc.stderr


def test_tvm_loaded_afterwards_does_not_take_the_signal_back():
    proc = crash_after("from onnxfuse.fatal_signals import die_promptly_on_fatal_signals\n"
                       "die_promptly_on_fatal_signals()\nimport tvm")
    assert proc.returncode == -signal.SIGSEGV
    assert "Segfault encountered" not in proc.stderr


def test_a_killed_worker_is_named_by_its_signal_and_innermost_frame():
    stderr = ("Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n"
              '  File "/x/kernels.py", line 12 in call\n  File "/x/timing.py", line 80 in race\n\n'
              "Extension modules: numpy (total: 1)\n")
    assert worker_failure(-signal.SIGSEGV, stderr) == 'worker killed by SIGSEGV (File "/x/kernels.py", line 12 in call)'
    assert worker_failure(-signal.SIGABRT, "") == "worker killed by SIGABRT"


def test_a_worker_that_exits_is_named_by_its_code_and_last_line():
    assert worker_failure(1, "Traceback\n  ...\nValueError: bad\n\n") == "worker exited with 1: ValueError: bad"
    assert worker_failure(3, "") == "worker exited with 3: no message"


def test_a_compile_worker_that_segfaults_dies_with_faulthandler_not_tvms_handler():
    """A compile worker has TVM loaded when native code crashes: the task fails as a dead worker,
    and the worker's stderr is faulthandler's traceback, not TVM's handler's."""
    script = ("import sys; sys.path.insert(0, 'tests')\n"
              "from worker_tasks import segfault_with_tvm_loaded\nfrom onnxfuse.workers import run_with_deadline\n"
              "print(dict(run_with_deadline(segfault_with_tvm_loaded, {'boom': ()}, jobs=1, timeout=120, on_failure=str)))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(Path(__file__).resolve().parent.parent))
    assert proc.returncode == 0, proc.stderr
    assert "'boom':" in proc.stdout and "died" in proc.stdout
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert "Segfault encountered" not in proc.stderr
