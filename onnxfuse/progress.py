"""What a long optimize shows while it runs.

On a terminal: one line, redrawn every half second from the start, naming the group being
compiled and how long it and the whole run have taken (a first compile can take a minute; a
blank line for that long looks like a hang). A group that falls back leaves a line of its own.
Otherwise (CI logs): one parseable line per finished kernel, with its real time.

Groups with one kernel identity (kernel_identity.py) compile once, so the counts are of distinct
kernels: `12 groups → 1 kernel to compile`.
"""

from __future__ import annotations

import sys
import threading
import time

from .fusion.plan import FusedGroup

TICK_SECONDS = 0.5


class Progress:
    """Progress of compiling the groups; pass one to `onnxfuse.optimize(progress=...)`."""

    def __init__(self, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.total = self.done = 0
        self._running: list[tuple[FusedGroup, float]] = []
        self._started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def start(self, to_compile: int, cached: int, groups: int | None = None) -> None:
        """`to_compile` distinct kernels for `groups` groups (default: one each), `cached` groups hit."""
        self.total, self.done = to_compile, 0
        self._started = time.monotonic()
        groups = to_compile if groups is None else groups
        if self.enabled and (to_compile or cached):
            self._line(f"onnxfuse: {_count(groups, 'group')} → {_count(to_compile, 'kernel')} to compile, "
                       f"{_count(cached, 'group')} from cache", final=True)
        if self.tty and to_compile:
            self._stop.clear()
            self._ticker = threading.Thread(target=self._tick, name="onnxfuse-progress", daemon=True)
            self._ticker.start()

    def compiling(self, running: list[tuple[FusedGroup, float]]) -> None:
        """The groups compiling now, each with its monotonic start time."""
        self._running = list(running)
        if self.tty:
            self._redraw()

    def step(self, group: FusedGroup, ok: bool, seconds: float, reason: str | None, groups: int = 1) -> None:
        """One kernel finished: compiled from `group`, for `groups` groups in all."""
        self.done += 1
        if not self.enabled:
            return
        what = "compiled" if ok else f"fallback ({reason})"
        if groups > 1:
            what += f" for {groups} groups"
        if self.tty:
            if not ok:
                self._line(f"onnxfuse: {group.name} ({len(group.node_indices)} ops) {what[:100]} after {seconds:.1f}s",
                           final=True)
        else:
            self._line(f"onnxfuse: [{self.done}/{self.total}] {group.name} {len(group.node_indices)} ops {what} {seconds:.2f}s",
                       final=True)

    def note(self, text: str) -> None:
        if self.enabled:
            self._line(f"onnxfuse: {text}", final=True)

    def finish(self) -> None:
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()
            self._ticker = None
            with self._lock:
                self.stream.write("\r\033[K")
                self.stream.flush()

    def status_line(self) -> str:
        """`[2/19] compiling group_4 (14 ops) 12s, 41s in all` (and `+1 more` with parallel jobs)."""
        now = time.monotonic()
        text = f"onnxfuse: [{self.done}/{self.total}]"
        if self._running:
            group, since = self._running[0]
            text += f" compiling {group.name} ({len(group.node_indices)} ops) {now - since:.0f}s"
            if len(self._running) > 1:
                text += f" +{len(self._running) - 1} more"
        return text + f", {now - self._started:.0f}s in all"

    def _tick(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            self._redraw()

    def _redraw(self) -> None:
        if self.done < self.total:
            self._line(self.status_line(), final=False)

    def _line(self, text: str, final: bool) -> None:
        with self._lock:
            if self.tty:
                self.stream.write("\r\033[K" + text + ("\n" if final else ""))
            else:
                self.stream.write(text + "\n")
            self.stream.flush()


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
