"""Tasks for the worker-pool tests; a module of its own so spawned workers can import them."""

import os
import signal
import time


def square(x):
    return x * x


def sleep_then(seconds, value):
    time.sleep(seconds)
    return value


def crash():
    os.kill(os.getpid(), signal.SIGSEGV)


def segfault_with_tvm_loaded():
    """As a compile task dies: TVM imported (its library owns SIGSEGV once loaded), then a bad read."""
    import ctypes

    import tvm  # noqa: F401

    return ctypes.string_at(0)  # reads address 0: SIGSEGV in native code
