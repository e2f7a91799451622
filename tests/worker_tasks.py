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
