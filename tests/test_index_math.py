"""Index helpers against numpy's ravel/unravel."""
import numpy as np
import pytest
import tvm

from onnxfuse.codegen.index_math import flat_index, i64, static_length, unflattened


def _value(expr) -> int:
    return int(tvm.sym.Analyzer().simplify(expr)) if not isinstance(expr, int) else expr


@pytest.mark.parametrize("extents", [[7], [3, 5], [2, 3, 4]])
def test_flat_index_and_unflattened_invert_each_other_as_numpy(extents):
    for flat in range(int(np.prod(extents))):
        coords = unflattened(i64(flat), extents)
        assert [_value(c) for c in coords] == list(np.unravel_index(flat, extents))
        assert _value(flat_index(extents, coords)) == flat


def test_a_position_past_the_end_wraps_into_the_box_unless_told_it_is_in_range():
    extents = [3, 5]
    assert [_value(c) for c in unflattened(17, extents)] == [0, 2]  # 17 = 15 + 2
    assert [_value(c) for c in unflattened(17, extents, wrap_outermost=False)] == [3, 2]


def test_constants_are_int64_and_expressions_pass_through():
    assert str(i64(4).ty) == "int64"
    var = tvm.tirx.Var("n", "int64")
    assert i64(var).same_as(var)
    assert static_length([2, tvm.tirx.IntImm("int64", 3)]) == 6
    assert static_length([2, var]) is None
