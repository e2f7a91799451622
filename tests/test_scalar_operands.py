"""scalar_operands: one-element constants become scalars, small integer powers become multiplies."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx_builder import model, node
from test_codegen import check_against_ort, random_feeds
from tvm import relax

from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.scalar_operands import ScalarOperands
from onnxfuse.target import resolve_target


def _calls(mod) -> list[tuple[str, list]]:
    """(op name, argument shapes or constant values) of every call in main, in order."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            args = [a.value.numpy().tolist() if isinstance(a, tvm.ir.GenericConst) else "var" for a in expr.args]
            found.append((expr.op.name, args))

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return found


def _rewritten(onnx_model):
    return _calls(ScalarOperands()(relax_import._import(onnx_model)))


def test_pow_two_and_three_become_multiplies():
    square = model([node("Pow", ["x", "two"], "y")], {"x": ("N", 8)}, {"y": ("N", 8)},
                   {"two": np.array([2.0], np.float32)})
    cube = model([node("Pow", ["x", "three"], "y")], {"x": ("N", 8)}, {"y": ("N", 8)},
                 {"three": np.array([3.0], np.float32)})
    assert _rewritten(square) == [("relax.multiply", ["var", "var"])]
    assert _rewritten(cube) == [("relax.multiply", ["var", "var"]), ("relax.multiply", ["var", "var"])]


def test_other_powers_stay_powers_with_a_scalar_exponent():
    m = model([node("Pow", ["x", "e"], "y")], {"x": ("N", 8)}, {"y": ("N", 8)}, {"e": np.array([0.5], np.float32)})
    assert _rewritten(m) == [("relax.power", ["var", 0.5])]


def test_one_element_operand_becomes_a_scalar():
    m = model([node("Mul", ["half", "x"], "y")], {"x": ("N", 8)}, {"y": ("N", 8)}, {"half": np.full((1, 1), 0.5, np.float32)})
    assert _rewritten(m) == [("relax.multiply", [0.5, "var"])]


def test_constant_of_higher_rank_than_the_other_operand_is_kept():
    """Broadcasting [N] with [1, 1] gives rank 2: a scalar would drop a dimension."""
    m = model([node("Add", ["x", "one"], "y")], {"x": ("N",)}, {"y": (1, "N")}, {"one": np.ones((1, 1), np.float32)})
    assert _rewritten(m) == [("relax.add", ["var", [[1.0]]])]


def test_tensor_constants_are_kept():
    m = model([node("Add", ["x", "b"], "y")], {"x": ("N", 2)}, {"y": ("N", 2)}, {"b": np.ones(2, np.float32)})
    assert _rewritten(m) == [("relax.add", ["var", [1.0, 1.0]])]


@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 0.5])
def test_powers_match_onnxruntime(tmp_path, exponent):
    """Including negative bases, zeros and infinities, which the multiplies must treat as Pow does."""
    m = model([node("Pow", ["x", "e"], "p"), node("Add", ["p", "x"], "y")], {"x": ("N", 32)}, {"y": ("N", 32)},
              {"e": np.array([exponent], np.float32)})
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    feeds = random_feeds(m, batch=5)
    feeds["x"][0, :4] = [0.0, -0.0, np.inf, -np.inf]
    check_against_ort(cg, m, feeds)
