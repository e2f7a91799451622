"""Codegen: each group compiles to one kernel whose results match onnxruntime on the same group."""

from __future__ import annotations

import time

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh

from onnxfuse.codegen.compile import CompiledGroup, compile_group
from onnxfuse.errors import CompileError
from onnxfuse.target import resolve_target

RTOL, ATOL = 1e-4, 1e-5


# ---------------------------------------------------------------- model builders


def make_model(nodes, inputs, outputs, inits=None, opset=17) -> onnx.ModelProto:
    initializers = [nh.from_array(v, k) for k, v in (inits or {}).items()]
    graph = h.make_graph(nodes, "group", inputs, outputs, initializers)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def f32(name, shape):
    return h.make_tensor_value_info(name, TP.FLOAT, shape)


def i64(name, shape):
    return h.make_tensor_value_info(name, TP.INT64, shape)


def lstm_gate_model(hidden=16, k=24, opset=18):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((k, 3 * hidden)) * 0.3).astype(np.float32)
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["m"]),
        h.make_node("Split", ["m"], ["a", "b", "c"], axis=1, num_outputs=3),
        h.make_node("Sigmoid", ["a"], ["sa"]),
        h.make_node("Tanh", ["b"], ["tb"]),
        h.make_node("Exp", ["c"], ["ec"]),
        h.make_node("Mul", ["sa", "tb"], ["p"]),
        h.make_node("Add", ["p", "ec"], ["y"]),
    ]
    return make_model(nodes, [f32("x", ["N", k])], [f32("y", ["N", hidden])], {"W": w}, opset)


def tree_chain_model(depth: int, n_trees: int = 10, n_features: int = 8, tree_depth: int = 5, seed: int = 0):
    """Hummingbird `tree_trav`-style traversal: per level Reshape/Gather×4/GatherElements/
    LessOrEqual/Where/Cast/Add/Reshape; ends with a leaf-value Gather. Inputs: X and root indices."""
    rng = np.random.default_rng(seed)
    nodes_per_tree = 2 ** (tree_depth + 1) - 1
    total = n_trees * nodes_per_tree
    local = np.arange(nodes_per_tree)
    is_leaf = local >= 2 ** tree_depth - 1
    left_local = np.where(is_leaf, local, np.minimum(2 * local + 1, nodes_per_tree - 1))
    right_local = np.where(is_leaf, local, np.minimum(2 * local + 2, nodes_per_tree - 1))
    inits = {
        "features": rng.integers(0, n_features, total).astype(np.int64),
        "thresholds": rng.standard_normal(total).astype(np.float32),
        "lefts": np.tile(left_local, n_trees).astype(np.int32),
        "rights": np.tile(right_local, n_trees).astype(np.int32),
        "offsets": (np.arange(n_trees) * nodes_per_tree).astype(np.int64),
        "values": rng.standard_normal(total).astype(np.float32),
        "flat": np.array([-1], dtype=np.int64),
        "rows": np.array([-1, n_trees], dtype=np.int64),
    }
    nodes = []
    index = "idx0"
    for level in range(depth):
        p = f"l{level}_"
        nodes += [
            h.make_node("Reshape", [index, "flat"], [p + "flat"]),
            h.make_node("Gather", ["features", p + "flat"], [p + "f"], axis=0),
            h.make_node("Gather", ["thresholds", p + "flat"], [p + "t"], axis=0),
            h.make_node("Gather", ["lefts", p + "flat"], [p + "l"], axis=0),
            h.make_node("Gather", ["rights", p + "flat"], [p + "r"], axis=0),
            h.make_node("Reshape", [p + "f", "rows"], [p + "f2"]),
            h.make_node("Reshape", [p + "t", "rows"], [p + "t2"]),
            h.make_node("Reshape", [p + "l", "rows"], [p + "l2"]),
            h.make_node("Reshape", [p + "r", "rows"], [p + "r2"]),
            h.make_node("GatherElements", ["X", p + "f2"], [p + "x"], axis=1),
            h.make_node("LessOrEqual", [p + "x", p + "t2"], [p + "c"]),
            h.make_node("Where", [p + "c", p + "l2", p + "r2"], [p + "w"]),
            h.make_node("Cast", [p + "w"], [p + "w64"], to=TP.INT64),
            h.make_node("Add", [p + "w64", "offsets"], [p + "n"]),
            h.make_node("Reshape", [p + "n", "rows"], [p + "next"]),
        ]
        index = p + "next"
    nodes += [
        h.make_node("Reshape", [index, "flat"], ["leaf_flat"]),
        h.make_node("Gather", ["values", "leaf_flat"], ["leaf_values"], axis=0),
        h.make_node("Reshape", ["leaf_values", "rows"], ["scores"]),
    ]
    model = make_model(
        nodes,
        [f32("X", ["N", n_features]), i64("idx0", ["N", n_trees])],
        [f32("scores", ["N", n_trees])],
        inits,
        opset=13,
    )
    return model, inits["offsets"]


def tree_feeds(batch, n_features, offsets, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, n_features)).astype(np.float32)
    idx0 = np.broadcast_to(offsets, (batch, len(offsets))).astype(np.int64).copy()
    return {"X": x, "idx0": idx0}


# ---------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def target():
    return resolve_target("native")


def ort_run(model, feeds):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def check_against_ort(cg: CompiledGroup, model, feeds):
    expected = ort_run(model, feeds)
    got = cg.run(feeds)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert g.shape == e.shape
        if np.issubdtype(e.dtype, np.floating):
            np.testing.assert_allclose(g, e, rtol=RTOL, atol=ATOL)
        else:
            np.testing.assert_array_equal(g, e)


def random_feeds(model, batch=3, seed=0, dims=None):
    """Normal float32 feeds; a symbolic dim takes its value in `dims` (by name), else `batch`."""
    rng = np.random.default_rng(seed)
    initializers = {i.name for i in model.graph.initializer}
    named = dims or {}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else named.get(d.dim_param, batch)
                for d in inp.type.tensor_type.shape.dim]
        feeds[inp.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def compile_and_check(model, tmp_path, target, name="k", batches=(3,)):
    cg = compile_group(model, name, target, tmp_path)
    for b in batches:
        check_against_ort(cg, model, random_feeds(model, b))
    return cg


# ---------------------------------------------------------------- tests


def test_elementwise_chain(tmp_path, target):
    nodes = [
        h.make_node("Mul", ["x", "x"], ["a"]),
        h.make_node("Relu", ["a"], ["b"]),
        h.make_node("Sigmoid", ["b"], ["c"]),
        h.make_node("Tanh", ["c"], ["d"]),
        h.make_node("Exp", ["d"], ["e"]),
        h.make_node("Neg", ["e"], ["y"]),
    ]
    model = make_model(nodes, [f32("x", ["N", 32])], [f32("y", ["N", 32])])
    compile_and_check(model, tmp_path, target, batches=(1, 5, 70))


def test_broadcasting_binary_ops(tmp_path, target):
    bias = np.linspace(-1, 1, 8).astype(np.float32)
    nodes = [
        h.make_node("Add", ["x", "row"], ["a"]),  # [N,4,8] + [4,1]
        h.make_node("Mul", ["a", "bias"], ["b"]),  # + [8]
        h.make_node("Sub", ["b", "x"], ["c"]),
        h.make_node("Div", ["c", "two"], ["y"]),
    ]
    model = make_model(
        nodes,
        [f32("x", ["N", 4, 8]), f32("row", [4, 1])],
        [f32("y", ["N", 4, 8])],
        {"bias": bias, "two": np.array(2.0, dtype=np.float32)},
    )
    compile_and_check(model, tmp_path, target, batches=(2, 9))


def test_lstm_gate_is_one_kernel_with_symbolic_batch(tmp_path, target):
    from onnxfuse.codegen.relax_import import import_group

    model = lstm_gate_model()
    group = import_group(model, "gate")
    assert group.prim_func is not None  # import_group raises unless exactly one PrimFunc is called
    cg = compile_and_check(model, tmp_path, target, name="lstm_gate", batches=(1, 37))
    assert cg.stats["fused_prim_funcs"] == 1
    assert cg.spec.inputs[0].shape == ("N", 24)
    assert cg.spec.outputs[0].shape == ("N", 16)
    assert cg.arg_sources == ("x", "W")
    assert (tmp_path / "lstm_gate.o").exists()


def test_matmul_add_relu_epilogue(tmp_path, target):
    rng = np.random.default_rng(3)
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["m"]),
        h.make_node("Add", ["m", "b"], ["a"]),
        h.make_node("Relu", ["a"], ["y"]),
    ]
    model = make_model(
        nodes,
        [f32("x", ["N", 40])],
        [f32("y", ["N", 64])],
        {"W": rng.standard_normal((40, 64)).astype(np.float32), "b": rng.standard_normal(64).astype(np.float32)},
    )
    cg = compile_and_check(model, tmp_path, target, batches=(1, 13, 64))
    assert cg.stats["reductions_scheduled"] >= 1


def test_gemm_trans_b(tmp_path, target):
    rng = np.random.default_rng(4)
    nodes = [h.make_node("Gemm", ["x", "W", "c"], ["y"], transB=1, alpha=0.5, beta=2.0)]
    model = make_model(
        nodes,
        [f32("x", [12, 20])],
        [f32("y", [12, 32])],
        {"W": rng.standard_normal((32, 20)).astype(np.float32), "c": rng.standard_normal(32).astype(np.float32)},
    )
    compile_and_check(model, tmp_path, target)


def test_conv_relu(tmp_path, target):
    rng = np.random.default_rng(5)
    nodes = [
        h.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["c"], ["y"]),
    ]
    model = make_model(
        nodes,
        [f32("x", [2, 3, 8, 8])],
        [f32("y", [2, 4, 8, 8])],
        {"W": rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "B": rng.standard_normal(4).astype(np.float32)},
    )
    compile_and_check(model, tmp_path, target)


def test_layernorm_pieces(tmp_path, target):
    nodes = [
        h.make_node("ReduceMean", ["x"], ["mu"], axes=[-1], keepdims=1),
        h.make_node("Sub", ["x", "mu"], ["d"]),
        h.make_node("Mul", ["d", "d"], ["d2"]),
        h.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], keepdims=1),
        h.make_node("Add", ["var", "eps"], ["ve"]),
        h.make_node("Sqrt", ["ve"], ["sd"]),
        h.make_node("Div", ["d", "sd"], ["y"]),
    ]
    model = make_model(
        nodes, [f32("x", ["N", 48])], [f32("y", ["N", 48])], {"eps": np.array(1e-5, dtype=np.float32)}, opset=13
    )
    compile_and_check(model, tmp_path, target, batches=(1, 19))


def test_multiple_outputs(tmp_path, target):
    nodes = [
        h.make_node("Add", ["x", "x"], ["a"]),
        h.make_node("Relu", ["a"], ["y1"]),
        h.make_node("Sigmoid", ["a"], ["y2"]),
    ]
    model = make_model(nodes, [f32("x", ["N", 24])], [f32("y1", ["N", 24]), f32("y2", ["N", 24])])
    cg = compile_and_check(model, tmp_path, target, batches=(1, 33))
    assert len(cg.spec.outputs) == 2


@pytest.mark.parametrize("depth", [3, 8])
def test_tree_chain(tmp_path, target, depth):
    model, offsets = tree_chain_model(depth)
    start = time.perf_counter()
    cg = compile_group(model, f"tree{depth}", target, tmp_path)
    print(f"tree depth {depth}: compiled in {time.perf_counter() - start:.2f} s; {cg.stats}")
    for batch in (1, 37, 1000):
        check_against_ort(cg, model, tree_feeds(batch, 8, offsets, seed=batch))
    assert cg.stats["index_checks"] > 0


def test_out_of_range_gather_index_is_an_error(tmp_path, target):
    model, offsets = tree_chain_model(2)
    cg = compile_group(model, "tree_bad", target, tmp_path)
    feeds = tree_feeds(50, 8, offsets)
    feeds["idx0"][7, 2] = 10**6
    with pytest.raises(Exception, match="index"):
        cg.run(feeds)
    feeds["idx0"][7, 2] = -(10**6)
    with pytest.raises(Exception, match="index"):
        cg.run(feeds)
    # A negative index within [-n, 0) wraps once, as in ONNX; the kernel still works afterwards.
    feeds["idx0"][7, 2] = -5
    check_against_ort(cg, model, feeds)


def test_unsupported_op_raises_compile_error(tmp_path, target):
    nodes = [h.make_node("NonMaxSuppression", ["boxes", "scores"], ["sel"])]
    model = make_model(
        nodes,
        [f32("boxes", [1, 6, 4]), f32("scores", [1, 1, 6])],
        [i64("sel", [None, 3])],
        opset=13,
    )
    with pytest.raises(CompileError) as info:
        compile_group(model, "nms", target, tmp_path)
    assert "\n" not in str(info.value)


def test_group_input_the_kernel_does_not_read_is_a_compile_error(tmp_path, target):
    """The custom node would pass more tensors than the kernel takes (seen with a Dropout whose
    ratio input TVM's import ignores): refuse at compile time, so the group falls back."""
    nodes = [h.make_node("Neg", ["x"], ["a"]), h.make_node("Dropout", ["a", "ratio"], ["y"])]
    model = make_model(nodes, [f32("x", ["N", 4]), f32("ratio", [])], [f32("y", ["N", 4])], opset=13)
    with pytest.raises(CompileError, match="inputs"):
        compile_group(model, "k", target, tmp_path)


def test_group_reading_an_input_only_for_its_shape_is_a_compile_error(tmp_path, target):
    """tf2onnx builds an RNN's zero state as Expand(0, Concat(Shape(x)[0:1], [16])): TVM then passes
    x's dim to the kernel, not x, and checking the kernel failed with "TypeError: expected int"."""
    nodes = [h.make_node("Shape", ["x"], ["s"]), h.make_node("Slice", ["s", "zero", "one"], ["b"]),
             h.make_node("Concat", ["b", "width"], ["target"], axis=0), h.make_node("Expand", ["fill", "target"], ["y"])]
    inits = {name: np.array(value, np.int64) for name, value in (("zero", [0]), ("one", [1]), ("width", [16]))}
    inits["fill"] = np.array(0.0, np.float32)
    model = make_model(nodes, [f32("x", ["N", 10, 16])], [f32("y", ["N", 16])], inits, opset=13)
    with pytest.raises(CompileError, match="only for its shape"):
        compile_group(model, "k", target, tmp_path)


def test_random_feeds_of_rank_zero_are_arrays():
    """onnxruntime refuses numpy scalars; a 0-d bool input once made verification skip a group."""
    from onnxfuse.measure.inputs import random_array

    rng = np.random.default_rng(0)
    for dtype in ("bool", "int64", "float32"):
        value = random_array(dtype, (), rng)
        assert isinstance(value, np.ndarray) and value.shape == () and value.dtype == np.dtype(dtype)


def test_bad_name_raises_compile_error(tmp_path, target):
    with pytest.raises(CompileError):
        compile_group(lstm_gate_model(), "not an identifier", target, tmp_path)


def lstm_cell_model(hidden=16, k=24):
    """Two MatMuls, gate math, and an output (C_out) that another output (H_out) also reads."""
    rng = np.random.default_rng(7)
    inits = {
        "W": (rng.standard_normal((k, 4 * hidden)) * 0.3).astype(np.float32),
        "R": (rng.standard_normal((hidden, 4 * hidden)) * 0.3).astype(np.float32),
        "b": (rng.standard_normal(4 * hidden) * 0.1).astype(np.float32),
    }
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["xw"]),
        h.make_node("MatMul", ["h", "R"], ["hr"]),
        h.make_node("Add", ["xw", "hr"], ["s"]),
        h.make_node("Add", ["s", "b"], ["g"]),
        h.make_node("Split", ["g"], ["gi", "gf", "gg", "go"], axis=1, num_outputs=4),
        h.make_node("Sigmoid", ["gi"], ["i"]),
        h.make_node("Sigmoid", ["gf"], ["f"]),
        h.make_node("Tanh", ["gg"], ["cand"]),
        h.make_node("Sigmoid", ["go"], ["o"]),
        h.make_node("Mul", ["f", "c"], ["keep"]),
        h.make_node("Mul", ["i", "cand"], ["write"]),
        h.make_node("Add", ["keep", "write"], ["c_out"]),
        h.make_node("Tanh", ["c_out"], ["tc"]),
        h.make_node("Mul", ["o", "tc"], ["h_out"]),
    ]
    return make_model(
        nodes,
        [f32("x", ["N", k]), f32("h", ["N", hidden]), f32("c", ["N", hidden])],
        [f32("h_out", ["N", hidden]), f32("c_out", ["N", hidden])],
        inits,
        opset=18,
    )


def test_lstm_cell_register_tiled_and_fully_tiled(tmp_path, target):
    """Both MatMuls get the register-tiled micro-kernel, and every block moves under the row
    tile even though the output C_out is also read by H_out (batches cover full tiles, a ragged
    tail and a tail-only batch)."""
    model = lstm_cell_model()
    cg = compile_and_check(model, tmp_path, target, name="lstm_cell", batches=(1, 8, 13, 64))
    assert cg.stats["reductions_scheduled"] == 2
    assert not [s for s in cg.stats["skipped_steps"] if "compute_at" in s], cg.stats["skipped_steps"]


def test_gemm_over_symbolic_batch_gets_a_small_batch_variant(tmp_path, target):
    """A GEMM group over a symbolic batch carries `<name>_small` (one row per tile) for batches
    below its row tile less RAGGED_TILE_SLACK; CompiledGroup.run picks the variant as the runtime
    does, so every batch from 1 to 17 checks one side of the switch or the other."""
    from onnxfuse.codegen import schedule

    model = lstm_cell_model()
    cg = compile_and_check(model, tmp_path, target, name="cell_variants", batches=range(1, 18))
    assert cg.spec.small_batch_below == cg.stats["tile_rows"] - schedule.RAGGED_TILE_SLACK
    assert cg.stats["small_batch_variant_below"] == cg.spec.small_batch_below
    assert cg.spec.serial_variant and cg.stats["parallel"]  # its row loop is parallel: a serial twin too
    static = make_model(model.graph.node, [f32("x", [3, 24]), f32("h", [3, 16]), f32("c", [3, 16])],
                        [f32("h_out", [3, 16]), f32("c_out", [3, 16])],
                        {i.name: nh.to_array(i) for i in model.graph.initializer}, opset=18)
    static_cg = compile_and_check(static, tmp_path, target, name="cell_static")
    assert static_cg.spec.small_batch_below == 0 and not static_cg.spec.serial_variant


def test_static_batch_gemm_epilogue(tmp_path, target):
    rng = np.random.default_rng(8)
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["m"]),
        h.make_node("Sigmoid", ["m"], ["y"]),
    ]
    model = make_model(nodes, [f32("x", [70, 32])], [f32("y", [70, 48])], {"W": rng.standard_normal((32, 48)).astype(np.float32)})
    compile_and_check(model, tmp_path, target)


@pytest.mark.parametrize("max_duplication", [1, 2])
def test_duplication_guard_keeps_shared_values_materialised(tmp_path, target, max_duplication):
    """A value read by 3 consumers is computed once (its block stays) under a guard below 3, and
    inlined (its block disappears) at 3; results match onnxruntime either way. It is too big
    for a cheap value of the inputs, which is inlined under any guard (test_inline_rereads)."""
    nodes = [
        h.make_node("Mul", ["x", "x"], ["square"]),
        h.make_node("Add", ["square", "x"], ["sum"]),
        h.make_node("Mul", ["sum", "x"], ["shared"]),
        h.make_node("Add", ["shared", "one"], ["a"]),
        h.make_node("Sub", ["shared", "two"], ["b"]),
        h.make_node("Mul", ["shared", "a"], ["c"]),  # a is read once: inlined at any setting
        h.make_node("Add", ["b", "c"], ["y"]),
    ]
    scalars = {"one": np.array(1.0, np.float32), "two": np.array(2.0, np.float32)}
    model = make_model(nodes, [f32("x", ["N", 32])], [f32("y", ["N", 32])], scalars)
    guarded = compile_group(model, f"dup{max_duplication}", target, tmp_path, max_duplication=max_duplication)
    inlined = compile_group(model, f"dup{max_duplication}_all", target, tmp_path, max_duplication=3)
    for cg in (guarded, inlined):
        check_against_ort(cg, model, random_feeds(model, 9))
    assert guarded.stats["max_copies"] <= max_duplication
    assert guarded.stats["materialized"] == inlined.stats["materialized"] + 1
    assert inlined.stats["max_copies"] == 3
    assert guarded.stats["max_duplication"] == max_duplication


def test_duplication_guard_bounds_tree_chain_growth(tmp_path, target):
    """With the guard, every inlined expression is emitted at most max_duplication times and the
    number of materialised blocks grows linearly with depth (no timing assertion: the block
    counts are what keeps compile time linear)."""
    counts = {}
    for depth in (2, 4, 8):
        model, offsets = tree_chain_model(depth)
        cg = compile_group(model, f"guard{depth}", target, tmp_path, max_duplication=1)
        assert cg.stats["max_copies"] <= 1
        counts[depth] = cg.stats["materialized"]
        if depth == 4:
            check_against_ort(cg, model, tree_feeds(37, 8, offsets))
    per_level = (counts[8] - counts[4]) / 4
    assert per_level == (counts[4] - counts[2]) / 2  # the same number of blocks per extra level


def test_max_duplication_must_be_positive(tmp_path, target):
    with pytest.raises(CompileError):
        compile_group(lstm_gate_model(), "k", target, tmp_path, max_duplication=0)
