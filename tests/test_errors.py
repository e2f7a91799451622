"""One-line error messages: what the user sees when a group falls back or an input is refused."""

from __future__ import annotations

import onnxruntime as ort
import pytest
from onnx_builder import model, node

from onnxfuse.errors import first_line


def test_first_line_drops_onnxruntimes_source_location_and_signature():
    """The reason is at the end of onnxruntime's message, past a 200-character cut before."""
    broken = model([node("Relu", ["x"], "y")], {"x": (2, 3)}, {"y": (2, 3)})
    broken.ir_version = 99
    with pytest.raises(Exception) as raised:
        ort.InferenceSession(broken.SerializeToString(), providers=["CPUExecutionProvider"])
    raw = str(raised.value).splitlines()[0]
    short = first_line(raised.value)
    assert "onnxruntime_src" in raw and "onnxruntime_src" not in short
    assert short.endswith("Unsupported model IR version: 99, max supported IR version: "
                          + raw.rsplit(": ", 1)[1]) and short.startswith("[ONNXRuntimeError]")
    assert len(short) <= 200


@pytest.mark.parametrize("text,expected", [
    ("plain reason\nmore detail", "plain reason"),
    ("failed:/onnxruntime_src/a/b.cc:12 f(int (*)(x), y) the reason", "failed: the reason"),
    ("failed:/onnxruntime_src/a/b.cc:12 no signature here", "failed: no signature here"),
    ("failed:/onnxruntime_src/a/b.cc:12", "failed:"),
])
def test_first_line_shapes(text, expected):
    assert first_line(RuntimeError(text)) == expected


def test_first_line_names_an_empty_exception():
    assert first_line(ValueError()) == "ValueError"

