"""A model for which `optimize` keeps no kernel is written as it was read (model_file.load_unchanged).

The front end rewrites a model before planning (Constant nodes lifted into initializers, shape
plumbing folded, dims named). With kernels, the shipped check runs what is written against the
original; without any, nothing would have checked those rewrites before onnxruntime runs them.
"""

from __future__ import annotations

import numpy as np
import onnx
from conftest import run_both
from onnx import helper, numpy_helper
from onnx_builder import model, node, weights

import onnxfuse


def conv_with_a_constant_weight() -> onnx.ModelProto:
    """A Conv (left to onnxruntime by `auto`) whose weight is a Constant node, then a Relu that
    onnxruntime folds into it (left to it too): no group to compile."""
    weight = helper.make_node("Constant", [], ["W"], name="W",
                              value=numpy_helper.from_array(weights(4, 3, 3, 3), "W"))
    return model([weight, node("Conv", ["X", "W"], "c", pads=[1, 1, 1, 1]), node("Relu", ["c"], "Y")],
                 {"X": ["N", 3, 8, 8]}, {"Y": ["N", 4, 8, 8]})


def test_a_model_without_kernels_is_written_as_it_was(tmp_path, cache):
    source = tmp_path / "conv.onnx"
    onnx.save(conv_with_a_constant_weight(), str(source))
    result = onnxfuse.optimize(source, tmp_path / "out" / "conv.fused.onnx", cache_dir=cache, jobs=1)
    assert result.report["groups_compiled"] == 0 and result.library_path is None
    written, original = onnx.load(str(result.model_path)), onnx.load(str(source))
    assert written.graph == original.graph  # the Constant node included, not lifted
    feeds = {"X": np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)}
    expected, actual = run_both(source, result.model_path, feeds)
    np.testing.assert_array_equal(expected[0], actual[0])
