"""Front end: exporters' run-time shape arithmetic becomes constants where exactly equivalent."""

from __future__ import annotations

import numpy as np
import onnx
from frontend_helpers import apply, assert_same_outputs, initializers, op_types, with_shapes
from onnx import helper
from onnx_builder import const_i64, model, node

from onnxfuse.frontend.canonicalize import canonicalize
from onnxfuse.frontend.loader import load_model
from onnxfuse.frontend.shape_plumbing import INT64_MAX, ResolveShapePlumbingPass
from onnxfuse.fusion.plan import plan_fusion

SIZES = {"N": 5, "S": 7}


def reshape_input(m, output=None):
    """The constant shape of the model's Reshape (the one writing `output`, if given)."""
    (reshape,) = [n for n in m.graph.node if n.op_type == "Reshape" and output in (None, n.output[0])]
    return initializers(m)[reshape.input[1]].tolist()


def test_reshape_by_the_first_two_dims_of_its_input_keeps_them_and_flattens_the_rest():
    """`x.reshape(*x.shape[:2], -1)`: Reshape(x, Concat(Shape(x)[0:2], [-1])) → Reshape(x, [0, 0, -1])."""
    m = model(
        [
            node("Shape", ["x"], "s"),
            node("Slice", ["s", "zero", "two"], "lead"),
            node("Concat", ["lead", "m1"], "shape", axis=0),
            node("Reshape", ["x", "shape"], "r"),
            node("Relu", ["r"], "y"),
        ],
        {"x": ("N", "S", 4, 5)}, ["y"], {"zero": const_i64(0), "two": const_i64(2), "m1": const_i64(-1)},
    )
    after, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert modified
    assert reshape_input(after) == [0, 0, -1]
    assert_same_outputs(m, after, SIZES)
    graph = load_model(m)
    assert graph.value("y").shape == ("N", "S", 20)
    assert op_types(graph.model) == ["Reshape", "Relu"]  # the plumbing is dead and gone


def batch_plumbing_model(dims):
    """`x.view(x.size(0), -1)` as torch.jit writes it: Shape → Gather → Unsqueeze → Concat → Reshape."""
    return model(
        [
            node("Shape", ["x"], "s"),
            node("Gather", ["s", "zero"], "n", axis=0),
            node("Unsqueeze", ["n", "axes0"], "n1"),
            node("Concat", ["n1", "m1"], "shape", axis=0),
            node("Reshape", ["x", "shape"], "r"),
            node("Sigmoid", ["r"], "y"),
        ],
        {"x": dims}, ["y"],
        {"zero": np.array(0, dtype=np.int64), "axes0": const_i64(0), "m1": const_i64(-1)},
    )


def test_batch_plumbing_becomes_a_constant_reshape_that_fuses():
    m = batch_plumbing_model(("N", 3, 4))
    after = canonicalize(m)
    assert op_types(after) == ["Reshape", "Sigmoid"] and reshape_input(after) == [0, -1]
    assert_same_outputs(m, after, SIZES)
    (group,) = plan_fusion(load_model(m)).groups
    assert len(group.node_indices) == 2


def test_shape_of_a_static_tensor_is_a_constant():
    m = batch_plumbing_model((2, 3, 4))
    after = canonicalize(m)
    assert op_types(after) == ["Reshape", "Sigmoid"] and reshape_input(after) == [2, -1]
    assert_same_outputs(m, after)


def test_a_dim_that_is_not_the_inputs_own_is_left_computed():
    """Reshape(x, [n, -1]) with n = y's batch: not provably x's axis 0, and there is already a -1."""
    m = model(
        [
            node("Shape", ["z"], "s"),
            node("Gather", ["s", "zero"], "n", axis=0),
            node("Unsqueeze", ["n", "axes0"], "n1"),
            node("Concat", ["n1", "m1"], "shape", axis=0),
            node("Reshape", ["x", "shape"], "y"),
        ],
        {"x": ("N", 4), "z": ("M", 2)}, ["y"],
        {"zero": np.array(0, dtype=np.int64), "axes0": const_i64(0), "m1": const_i64(-1)},
    )
    _, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert not modified


def test_one_unknown_element_becomes_minus_one():
    """Reshape(x, [M, 4]) where M is another tensor's batch: -1 gives the same size for any
    non-empty x the original accepts; the same symbol as x's own axis is a copy (0)."""
    def reshape_by_batch_of(z_dims):
        return model(
            [
                node("Shape", ["z"], "s"),
                node("Gather", ["s", "zero"], "n", axis=0),
                node("Unsqueeze", ["n", "axes0"], "n1"),
                node("Concat", ["n1", "four"], "shape", axis=0),
                node("Reshape", ["x", "shape"], "y"),
            ],
            {"x": ("N", 2, 2), "z": z_dims}, ["y"],
            {"zero": np.array(0, dtype=np.int64), "axes0": const_i64(0), "four": const_i64(4)},
        )

    m = reshape_by_batch_of(("M", 2))
    after, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert modified and reshape_input(after) == [-1, 4]
    assert_same_outputs(m, after, {"N": 5, "M": 5})
    after, _ = apply(ResolveShapePlumbingPass(), with_shapes(reshape_by_batch_of(("N", 2))))
    assert reshape_input(after) == [0, 4]


def head_split_model():
    """nn.MultiheadAttention's head split as the dynamo exporter writes it: x[S, N, 64] viewed as
    [S, N * 4, 16], with N * 4 computed as Reshape(Mul(Squeeze(Shape(x)[1:2]), 4), [-1])."""
    return model(
        [
            node("Shape", ["x"], "seq", start=0, end=1),
            node("Shape", ["x"], "batch", start=1, end=2),
            node("Squeeze", ["batch"], "n"),
            node("Mul", ["n", "heads"], "rows"),
            node("Reshape", ["rows", "m1"], "rows1"),
            node("Concat", ["seq", "rows1", "width"], "shape", axis=0),
            node("Reshape", ["x", "shape"], "y"),
        ],
        {"x": ("S", "N", 64)}, ["y"],
        {"heads": np.array(4, dtype=np.int64), "m1": const_i64(-1), "width": const_i64(16)},
    )


def test_a_size_times_a_number_is_the_one_element_left_to_minus_one():
    m = head_split_model()
    after, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert modified and reshape_input(after, "y") == [0, -1, 16]
    assert_same_outputs(m, after, SIZES)


def test_a_size_times_a_number_is_known_element_by_element():
    import onnx_ir as ir

    from onnxfuse.frontend.shape_values import DimOf, ScaledDim, shape_values

    graph = ir.serde.deserialize_model(with_shapes(head_split_model())).graph
    known = {value.name: content for value, content in shape_values(graph).items()}
    (seq, scaled, width) = known["shape"].elements
    assert isinstance(seq, DimOf) and seq.symbol == "S" and width == 16
    assert isinstance(scaled, ScaledDim) and scaled.dim.symbol == "N" and scaled.factor == 4
    assert known["rows1"].elements == (scaled,) and not known["rows1"].scalar


def test_torch_jit_expand_pattern_becomes_a_constant():
    """`x.expand(x.size(0), -1)` as torch.jit writes it: Expand(x, Where(Equal(shape, -1), 1, shape)).
    The target is [N, 1] with N x's own axis 0, so Expand(x, [1, 1]) is the same, and that is x."""
    m = model(
        [
            node("Shape", ["x"], "s"),
            node("Gather", ["s", "zero"], "n", axis=0),
            node("Unsqueeze", ["n", "axes0"], "n1"),
            node("Concat", ["n1", "m1"], "shape", axis=0),
            node("Equal", ["shape", "m1s"], "is_m1"),
            node("Where", ["is_m1", "ones", "shape"], "target"),
            node("Expand", ["x", "target"], "e"),
            node("Relu", ["e"], "y"),
        ],
        {"x": ("N", 1)}, ["y"],
        {"zero": np.array(0, dtype=np.int64), "axes0": const_i64(0), "m1": const_i64(-1),
         "m1s": const_i64(-1, -1), "ones": const_i64(1, 1)},
    )
    after, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert modified and "Expand" not in op_types(after)
    assert_same_outputs(m, after, SIZES)
    after = canonicalize(m)
    assert op_types(after) == ["Relu"]
    assert_same_outputs(m, after, SIZES)


def test_an_expand_to_ones_is_its_input_unless_it_adds_axes():
    def expand_model(target):
        return model([node("Expand", ["x", "t"], "e"), node("Relu", ["e"], "y")],
                     {"x": ("N", 3)}, ["y"], {"t": const_i64(*target)})

    after, modified = apply(ResolveShapePlumbingPass(), with_shapes(expand_model([1, 1])))
    assert modified and op_types(after) == ["Relu"]
    assert_same_outputs(expand_model([1, 1]), after, SIZES)
    for kept in ([1, 1, 1], [2, 1]):  # adds an axis; broadcasts N to 2
        after, modified = apply(ResolveShapePlumbingPass(), with_shapes(expand_model(kept)))
        assert not modified and op_types(after) == ["Expand", "Relu"]


def test_slice_to_int64_max_from_zero_is_dropped():
    m = model(
        [
            node("Slice", ["x", "starts", "ends", "axes"], "s"),
            node("Relu", ["s"], "y"),
        ],
        {"x": ("N", 6)}, ["y"],
        {"starts": const_i64(0, 1), "ends": const_i64(INT64_MAX, 100), "axes": const_i64(0, 1)},
    )
    after, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert modified
    (slice_node,) = [n for n in after.graph.node if n.op_type == "Slice"]
    values = initializers(after)
    # Axis 0 (0 to INT64_MAX) is a no-op and goes; axis 1's end is clamped to its size.
    assert [values[i].tolist() for i in slice_node.input[1:]] == [[1], [6], [1], [1]]
    assert_same_outputs(m, after, SIZES)


def test_a_slice_that_does_nothing_disappears():
    m = model([node("Slice", ["x", "starts", "ends"], "s"), node("Relu", ["s"], "y")],
              {"x": ("N", 6)}, ["y"], {"starts": const_i64(0), "ends": const_i64(INT64_MAX)})
    after = canonicalize(m)
    assert op_types(after) == ["Relu"] and after.graph.node[0].input[0] == "x"
    assert_same_outputs(m, after, SIZES)


def with_allowzero(m):
    next(n for n in m.graph.node if n.op_type == "Reshape").attribute.extend([helper.make_attribute("allowzero", 1)])
    m.opset_import[0].version = 18
    return m


def test_allowzero_reshape_of_batch_plumbing_becomes_a_copy():
    """The dynamo exporter writes allowzero=1: with no literal 0 in the shape, it differs from
    allowzero=0 only on a zero-size axis, so the same rewrite holds."""
    m = with_allowzero(batch_plumbing_model(("N", 3, 4)))
    after, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert modified
    (reshape,) = [n for n in after.graph.node if n.op_type == "Reshape"]
    assert reshape_input(after) == [0, -1]
    assert [(a.name, a.i) for a in reshape.attribute] == [("allowzero", 0)]
    assert_same_outputs(m, after, SIZES)


def test_allowzero_reshape_with_a_literal_zero_is_left_alone():
    m = with_allowzero(batch_plumbing_model(("N", 3, 0)))
    m.graph.initializer[2].CopyFrom(onnx.numpy_helper.from_array(const_i64(0), "m1"))  # x.view(n, 0)
    _, modified = apply(ResolveShapePlumbingPass(), with_shapes(m))
    assert not modified


