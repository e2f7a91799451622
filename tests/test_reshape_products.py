"""The front end's reshape_products pass: a dim onnx's inference leaves unnamed across a Reshape
is solved from the other side where the rest determine it, and nowhere else."""

from __future__ import annotations

import numpy as np
import pytest
from onnx_builder import const_i64, model, node

from onnxfuse.frontend.loader import load_model
from onnxfuse.frontend.reshape_products import _solve


def flattened(input_shape: tuple, target: np.ndarray):
    m = model([node("Reshape", ["x", "target"], "flat"), node("Relu", ["flat"], "y")],
              {"x": input_shape}, ["y"], {"target": target})
    return m


@pytest.mark.parametrize("input_shape, target, expected", [
    (("batch", 17, 32), const_i64(-1, 32), ("17*batch", 32)),
    (("batch", "seq", 32), const_i64(-1, 32), ("batch*seq", 32)),
    (("batch", 4, 8), const_i64(-1, 8), ("4*batch", 8)),
    (("batch", 17, 32), const_i64(17, -1, 32), (17, "batch", 32)),
])
def test_a_flattened_dim_is_named_by_its_product(tmp_path, input_shape, target, expected):
    path = tmp_path / "m.onnx"
    path.write_bytes(flattened(input_shape, target).SerializeToString())
    graph = load_model(path)
    assert graph.value("flat").shape == expected
    assert graph.value("y").shape == expected  # onnx carries the name on


@pytest.mark.parametrize("before, after, expected", [
    (("unk__6", 32), (17, "batch", 32), ("unk__6", "17*batch")),
    ((17, "batch", 32), ("unk__1", 32), ("unk__1", "17*batch")),
    (("unk__2", 32), ("4*batch", 17, 8), ("unk__2", "17*batch")),  # a product on the other side
    (("unk__0", 8), (2, 16), ("unk__0", 4)),  # a number
    (("unk__0", 32), ("batch", 32), ("unk__0", "batch")),
    (("unk__0", "unk__1"), ("batch", 32), None),  # two unknowns
    (("unk__0", 3), ("batch", 32), None),  # 32 * batch / 3 is no product
    (("unk__0", "seq"), ("batch", 32), None),  # seq divides nothing on the other side
    (("unk__0", 1), ("a", "b", "c"), None),  # three symbols: no DerivedDim says that
    (("unk__0", 32), (None, 32), None),  # an unknown dim onnx did not name
])
def test_the_solution_is_exact_or_absent(before, after, expected):
    assert _solve(before, after) == expected
