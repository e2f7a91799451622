"""Front end: Constant nodes become initializers; constant-only nodes are folded."""

from __future__ import annotations

import numpy as np
import onnx
from frontend_helpers import apply, assert_same_outputs, initializers, op_types, run, with_shapes
from onnx import TensorProto, helper
from onnx_builder import const_i64, model, node

from onnxfuse.frontend.canonicalize import canonicalize
from onnxfuse.frontend.fold_constants import FoldConstantsPass
from onnxfuse.frontend.lift_constants import LiftConstantsPass


def constant(name, **value):
    return helper.make_node("Constant", [], [name], name=name, **value)


def test_every_kind_of_constant_becomes_an_initializer():
    m = model(
        [
            constant("shape", value_ints=[-1, 20]),
            constant("lo", value_float=0.0),
            constant("hi", value=helper.make_tensor("t", TensorProto.FLOAT, [], [6.0])),
            constant("axis", value_int=1),
            constant("scale", value_floats=[2.0]),
            node("Reshape", ["x", "shape"], "r"),
            node("Clip", ["r", "lo", "hi"], "c"),
            node("Mul", ["c", "scale"], "m"),
            node("Unsqueeze", ["m", "axis"], "y"),
        ],
        {"x": ("N", 4, 5)}, ["y"],
    )
    after, modified = apply(LiftConstantsPass(), m)
    assert modified
    assert op_types(after) == ["Reshape", "Clip", "Mul", "Unsqueeze"]
    values = initializers(after)
    assert values["shape"].tolist() == [-1, 20] and values["shape"].dtype == np.int64
    assert values["lo"].dtype == np.float32 and values["lo"].shape == () and values["hi"] == 6.0
    assert values["axis"].tolist() == 1 and values["scale"].tolist() == [2.0]
    assert_same_outputs(m, after)


def test_a_small_sparse_constant_is_lifted_dense():
    sparse = helper.make_sparse_tensor(helper.make_tensor("v", TensorProto.FLOAT, [2], [1.5, 2.5]),
                                       helper.make_tensor("i", TensorProto.INT64, [2], [1, 4]), [2, 3])
    m = model([constant("w", sparse_value=sparse), node("Add", ["x", "w"], "y")], {"x": (2, 3)}, ["y"])
    after = canonicalize(m)
    assert op_types(after) == ["Add"]
    np.testing.assert_array_equal(initializers(after)["w"], [[0, 1.5, 0], [0, 2.5, 0]])
    assert_same_outputs(m, after)


def test_a_constant_that_is_a_graph_output_stays_a_node():
    m = model([constant("y", value_ints=[1, 2]), node("Relu", ["x"], "r")], {"x": (2,)}, ["y", "r"])
    after, _ = apply(LiftConstantsPass(), m)
    assert op_types(after) == ["Constant", "Relu"]


def pad_model():
    """Pads built as PyTorch writes them: ConstantOfShape → Concat → Reshape → Slice → Transpose → Reshape → Cast."""
    return model(
        [
            node("ConstantOfShape", ["four"], "zeros", value=helper.make_tensor("z", TensorProto.INT64, [1], [0])),
            node("Concat", ["pads_given", "zeros"], "all_pads", axis=0),
            node("Reshape", ["all_pads", "m1_2"], "pairs"),
            node("Slice", ["pairs", "m1", "minf", "zero", "m1"], "reversed"),
            node("Transpose", ["reversed"], "t", perm=[1, 0]),
            node("Reshape", ["t", "m1"], "flat"),
            node("Cast", ["flat"], "pads", to=TensorProto.INT64),
            node("Pad", ["x", "pads"], "y", mode="constant"),
        ],
        {"x": ("N", 3, 8, 8)}, ["y"],
        {"four": const_i64(4), "pads_given": const_i64(1, 1, 2, 2), "m1_2": const_i64(-1, 2),
         "m1": const_i64(-1), "minf": const_i64(-(2**63) + 1), "zero": const_i64(0)},
    )


def test_the_pad_subgraph_of_constants_folds_to_one_initializer():
    m = pad_model()
    after = canonicalize(m)
    assert op_types(after) == ["Pad"]
    pad = after.graph.node[0]
    assert initializers(after)[pad.input[1]].tolist() == [0, 0, 2, 1, 0, 0, 2, 1]
    assert set(initializers(after)) == {pad.input[1]}  # the inputs of the folded nodes are gone
    assert_same_outputs(m, after)


def test_folding_reads_no_overridable_input_and_makes_no_huge_tensor():
    m = model(
        [
            node("ConstantOfShape", ["huge"], "big", value=helper.make_tensor("z", TensorProto.FLOAT, [1], [1.0])),
            node("ReduceSum", ["big"], "s", keepdims=0),
            node("Relu", ["w"], "rw"),
            node("Add", ["x", "rw"], "a"),
            node("Add", ["a", "s"], "y"),
        ],
        {"x": (2,)}, ["y"],
        {"huge": const_i64(4096, 4096), "w": np.array([1.0, -1.0], dtype=np.float32)},
    )
    m.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]))  # an overridable default
    after, modified = apply(FoldConstantsPass(max_elements=1 << 20), with_shapes(m))
    assert not modified
    assert op_types(after) == op_types(m)


def test_folding_a_small_transposed_weight():
    m = model(
        [node("Transpose", ["wp"], "w", perm=[1, 0]), node("MatMul", ["x", "w"], "y")],
        {"x": (4, 8)}, ["y"], {"wp": np.arange(16 * 8, dtype=np.float32).reshape(16, 8)},
    )
    after, modified = apply(FoldConstantsPass(), with_shapes(m))
    assert modified and op_types(after) == ["MatMul"]
    np.testing.assert_array_equal(initializers(after)["w"], np.arange(128, dtype=np.float32).reshape(16, 8).T)
    assert_same_outputs(m, after)


def test_folding_stops_at_the_size_bound():
    m = model([node("Transpose", ["wp"], "w", perm=[1, 0]), node("MatMul", ["x", "w"], "y")],
              {"x": (4, 8)}, ["y"], {"wp": np.ones((16, 8), dtype=np.float32)})
    _, modified = apply(FoldConstantsPass(max_elements=100), with_shapes(m))
    assert not modified


def test_canonical_model_is_valid_onnx():
    onnx.checker.check_model(canonicalize(pad_model()), full_check=True)


def test_folding_reaches_into_an_if_body():
    """Exporters put a cell's weight preparation (Transpose/Unsqueeze of an initializer) inside
    the If branch that uses it: folded there, the body's consumers see constants."""
    wp = np.arange(4 * 8, dtype=np.float32).reshape(4, 8)

    def branch(name, nodes, out):
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)])

    then_branch = branch("then", [node("Transpose", ["wp"], "w", perm=[1, 0]), node("MatMul", ["x", "w"], "y_then")],
                         "y_then")
    else_branch = branch("else", [node("Neg", ["x"], "y_else")], "y_else")
    m = model([node("ReduceSum", ["x"], "s", keepdims=0), node("Greater", ["s", "zero"], "p"),
               node("If", ["p"], "y", then_branch=then_branch, else_branch=else_branch)],
              {"x": (2, 8)}, ["y"], {"wp": wp, "zero": np.zeros((), np.float32)})
    after, modified = apply(FoldConstantsPass(), with_shapes(m))
    assert modified
    body = next(a.g for a in after.graph.node[-1].attribute if a.name == "then_branch")
    assert [n.op_type for n in body.node] == ["MatMul"]
    np.testing.assert_array_equal({t.name: onnx.numpy_helper.to_array(t) for t in body.initializer}["w"], wp.T)
    assert_same_outputs(m, after)


def test_constant_only_nodes_inside_an_if_branch_are_folded_into_the_branch():
    """The TorchScript exporter re-packs an LSTM's gate weights inside the branch that runs it:
    Slice/Concat of the outer weight. Folded, the branch's MatMul reads a constant."""
    then_branch = helper.make_graph(
        [node("Slice", ["w", "s0", "s2"], "w_lo"), node("Slice", ["w", "s2", "s4"], "w_hi"),
         node("Concat", ["w_hi", "w_lo"], "w_swapped", axis=0), node("MatMul", ["x", "w_swapped"], "then_y")],
        "then", [], [helper.make_tensor_value_info("then_y", TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(const_i64(v), f"s{v}") for v in (0, 2, 4)])
    else_branch = helper.make_graph([node("MatMul", ["x", "w"], "else_y")], "else", [],
                                    [helper.make_tensor_value_info("else_y", TensorProto.FLOAT, None)])
    m = model([node("If", ["cond"], "y", then_branch=then_branch, else_branch=else_branch)],
              {"x": ("N", 4)}, ["y"], {"w": np.arange(16, dtype=np.float32).reshape(4, 4)})
    m.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    after, modified = apply(FoldConstantsPass(), with_shapes(m))
    assert modified
    (if_node,) = after.graph.node
    branch = next(a.g for a in if_node.attribute if a.name == "then_branch")
    assert [n.op_type for n in branch.node] == ["MatMul"]
    swapped = next(t for t in branch.initializer if t.name == "w_swapped")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(swapped), np.arange(16).reshape(4, 4)[[2, 3, 0, 1]])
    for cond in (True, False):
        feeds = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32), "cond": np.array(cond)}
        np.testing.assert_array_equal(run(after, feeds)[0], run(m, feeds)[0])
