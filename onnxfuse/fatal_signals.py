"""Die promptly, with a Python traceback, when native code crashes: never hang.

TVM's FFI library installs a SIGSEGV handler (from a load-time constructor) that prints a
backtrace and allocates while doing so. When the crash is a corrupt heap, the segfault often
happens inside malloc with its lock held, the handler's own malloc waits for that lock, and the
process sleeps in a futex forever: a benchmark of a kernel that wrote out of bounds once sat
like that for an hour instead of failing. Python's faulthandler writes without allocating and
then re-raises the signal with the handler that was installed before it, so that one is reset to
the default first.

Only processes that load TVM and run kernels call this (the CLI's compiling commands and the
benchmark workers); a serving process that loads our custom-op library never loads TVM.
"""

from __future__ import annotations

import faulthandler
import io
import signal
import sys

FATAL_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)


def die_promptly_on_fatal_signals() -> None:
    """Replace TVM's crash handler with faulthandler's over the default action. TVM's library is
    loaded first, since loading it later would install its handler again."""
    import tvm_ffi  # noqa: F401  (its constructor installs the SIGSEGV handler being replaced)

    for sig in FATAL_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    try:  # the process's own stderr: sys.stderr may be a stream without a file descriptor (click's test runner)
        faulthandler.enable(file=sys.__stderr__)
    except (AttributeError, ValueError, io.UnsupportedOperation):
        pass  # no stderr to write to: the default action alone still ends the process
