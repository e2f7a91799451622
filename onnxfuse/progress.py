"""What a long optimize shows while it runs: a progress bar on a terminal, one line per group otherwise."""

from __future__ import annotations

import sys

from .fusion.plan import FusedGroup


class Progress:
    """A progress bar on a terminal; one parseable line per group otherwise."""

    def __init__(self, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.total = self.done = 0

    def start(self, to_compile: int, cached: int) -> None:
        self.total = to_compile
        if self.enabled and (to_compile or cached):
            self._line(f"onnxfuse: {to_compile} kernels to compile, {cached} groups from cache", final=True)

    def step(self, group: FusedGroup, ok: bool, seconds: float, reason: str | None) -> None:
        self.done += 1
        if not self.enabled:
            return
        what = "compiled" if ok else f"fallback ({reason})"
        if self.tty:
            filled = int(30 * self.done / max(self.total, 1))
            self._line(f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {group.name} {what[:60]}",
                       final=not ok)
        else:
            self._line(f"onnxfuse: [{self.done}/{self.total}] {group.name} {len(group.node_indices)} ops {what} {seconds:.2f}s",
                       final=True)

    def note(self, text: str) -> None:
        if self.enabled:
            self._line(f"onnxfuse: {text}", final=True)

    def finish(self) -> None:
        if self.tty and self.total:
            self.stream.write("\n")
            self.stream.flush()

    def _line(self, text: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
