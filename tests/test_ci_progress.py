"""The progress display: a ticking line on a terminal from the first second, one line per group
with its real time in logs."""

from __future__ import annotations

import io
import time

from conftest import MODELS

import onnxfuse
import onnxfuse.pipeline as pipeline
from onnxfuse.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def slow_compiles(monkeypatch, seconds: float):
    real = pipeline.compile_one

    def compile_one(*args):
        time.sleep(seconds)
        return real(*args)

    monkeypatch.setattr(pipeline, "compile_one", compile_one)


def test_terminal_shows_the_group_and_elapsed_time_while_it_compiles(tmp_path, monkeypatch):
    slow_compiles(monkeypatch, 1.6)
    screen = Terminal()
    onnxfuse.optimize(MODELS / "diamond.onnx", tmp_path / "d.onnx", cache_dir=False, jobs=1, progress=Progress(stream=screen))
    frames = screen.getvalue().split("\r\033[K")
    ticking = [f for f in frames if "compiling group_0 (5 ops)" in f]
    assert ticking, frames
    assert any(" 1s, 1s in all" in f for f in ticking), ticking  # redrawn while the compile ran
    assert frames[-1] == ""  # the line is cleared when compiling ends


def test_log_gets_one_line_per_group_with_its_time(tmp_path, monkeypatch):
    slow_compiles(monkeypatch, 0.3)
    log = io.StringIO()
    onnxfuse.optimize(MODELS / "diamond.onnx", tmp_path / "d.onnx", cache_dir=False, jobs=1, progress=Progress(stream=log))
    lines = log.getvalue().splitlines()
    assert lines[0] == "onnxfuse: 1 group → 1 kernel to compile, 0 groups from cache"
    assert lines[1].startswith("onnxfuse: [1/1] group_0 5 ops compiled ")
    assert float(lines[1].rsplit(" ", 1)[1].rstrip("s")) >= 0.3
    assert "\r" not in log.getvalue()
