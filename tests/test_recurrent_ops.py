"""LSTM / GRU / RNN nodes as sequence kernels (codegen/recurrent.py), against onnxruntime running
the original op, per attribute: directions, initial states, sequence_lens, both layouts, clip,
activations, GRU linear_before_reset, LSTM peepholes and input_forget.

The LSTM and the GRU compute what onnxruntime's ops compute, so on x86-64 their outputs are
onnxruntime's bit for bit (docs/recurrent.md); the RNN has activations of its own: rtol 1e-4,
atol 1e-5 (a few ulps, compounding over time steps). Sizes are small and the hidden size is not a
multiple of the vector width, so the padded column block is exercised too.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tvm
import tvm.s_tir
from conftest import assert_outputs_match, run_both
from onnx import TensorProto, helper, numpy_helper
from test_ieee_order import assert_bitwise_equal
from test_portable_levels import QEMU, needs_qemu
from tvm import te

import onnxfuse
from onnxfuse.codegen import ieee_order
from onnxfuse.codegen.recurrent import MLAS_PACKED_STRIDE_K, OVERLAP_CHUNK, _OverlappedProjection, build_recurrent_kernel
from onnxfuse.codegen.recurrent_op import pack_weights, rational_tanh, read_recurrent_op
from onnxfuse.errors import CompileError
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.target import resolve_target

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
INPUT, HIDDEN = 8, 20
# (sequence length, batch): ragged rows only, one full batch tile + ragged rows, full tiles only
SIZES = [(1, 1), (5, 3), (9, 6), (2, 8)]


def recurrent_model(op: str, *, direction="forward", layout=0, states=False, seq_lens=False, peepholes=False,
                    outputs=None, steps=None, sizes=(INPUT, HIDDEN), scale=0.4, **attributes) -> onnx.ModelProto:
    """One recurrent node with symbolic batch and sequence (static if `steps` is given); states and
    sequence_lens are inputs. `sizes`: input and hidden size; `scale`: the weights' spread."""
    input_size, hidden = sizes
    rng = np.random.default_rng(7)
    d, g = (2 if direction == "bidirectional" else 1), GATES[op]
    weights = {"W": rng.standard_normal((d, g * hidden, input_size)) * scale,
               "R": rng.standard_normal((d, g * hidden, hidden)) * scale, "B": rng.standard_normal((d, 2 * g * hidden)) * 0.3}
    if peepholes:
        weights["P"] = rng.standard_normal((d, 3 * hidden)) * 0.3
    seq = steps if steps is not None else "seq"
    seq_batch = [seq, "batch"] if layout == 0 else ["batch", seq]
    state_shape = [d, "batch", hidden] if layout == 0 else ["batch", d, hidden]
    inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [*seq_batch, input_size])]
    names = ["X", "W", "R", "B", "", "", ""]
    if seq_lens:
        inputs.append(helper.make_tensor_value_info("lens", TensorProto.INT32, ["batch"]))
        names[4] = "lens"
    if states:
        inputs.append(helper.make_tensor_value_info("h0", TensorProto.FLOAT, state_shape))
        names[5] = "h0"
        if op == "LSTM":
            inputs.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, state_shape))
            names[6] = "c0"
    if peepholes:
        names.append("P")
    names = names if op == "LSTM" else names[:6]
    while names and not names[-1]:
        names.pop()
    outputs = outputs or (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])
    y_shape = [seq, d, "batch", hidden] if layout == 0 else ["batch", seq, d, hidden]
    infos = [helper.make_tensor_value_info(o, TensorProto.FLOAT, y_shape if o == "Y" else state_shape) for o in outputs]
    node_outputs = [o if o in outputs else "" for o in (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])]
    while not node_outputs[-1]:
        node_outputs.pop()
    if layout:
        attributes["layout"] = layout
    node = helper.make_node(op, names, node_outputs, hidden_size=hidden, direction=direction, **attributes)
    graph = helper.make_graph([node], "recurrent", inputs, infos,
                              [numpy_helper.from_array(w.astype(np.float32), k) for k, w in weights.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def seq_first_reference(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnxruntime refuses layout 1, so a layout-1 op is checked against its layout-0 twin with
    the inputs and outputs transposed: onnxruntime's own op on the same numbers."""
    reference = onnx.ModelProto()
    reference.CopyFrom(model)
    graph = reference.graph
    node = graph.node[0]
    del node.attribute[[a.name for a in node.attribute].index("layout")]
    transposes = []
    for k, name in enumerate(node.input):
        if name in ("X", "h0", "c0"):
            node.input[k] = f"{name}_seq_first"
            transposes.append(helper.make_node("Transpose", [name], [node.input[k]], perm=[1, 0, 2]))
    for k, name in enumerate(node.output):
        if name:
            node.output[k] = f"{name}_seq_first"
            perm = [2, 0, 1, 3] if name == "Y" else [1, 0, 2]
            transposes.append(helper.make_node("Transpose", [node.output[k]], [name], perm=perm))
    graph.node.extend(transposes)
    return reference


def assert_as_onnxruntime(op: str, expected: list, actual: list) -> None:
    """The LSTM and the GRU bit for bit on x86-64 (on aarch64 onnxruntime's C++ for their gates
    may be built with fused multiply-adds); the RNN within tolerance."""
    if op in ("LSTM", "GRU") and platform.machine() == "x86_64":
        assert len(expected) == len(actual)
        for e, a in zip(expected, actual):
            assert_bitwise_equal(np.asarray(a), np.asarray(e))
    else:
        assert_outputs_match(expected, actual, rtol=1e-4, atol=1e-5)


def feeds_for(model: onnx.ModelProto, steps: int, batch: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else (steps if d.dim_param == "seq" else batch)
                for d in value.type.tensor_type.shape.dim]
        if value.name == "lens":
            feeds["lens"] = rng.integers(1, steps + 1, size=dims).astype(np.int32)
        else:
            feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


CASES = {
    "lstm_forward_defaults": dict(op="LSTM"),
    "lstm_bidirectional_states_lens_peepholes_clip": dict(op="LSTM", direction="bidirectional", states=True,
                                                         seq_lens=True, peepholes=True, clip=1.5),
    "lstm_reverse_layout1_input_forget_activations": dict(
        op="LSTM", direction="reverse", layout=1, input_forget=1,
        activations=["HardSigmoid", "Tanh", "Softsign"], activation_alpha=[0.3], activation_beta=[0.4]),
    "gru_bidirectional_linear_before_reset_states_lens": dict(op="GRU", direction="bidirectional", states=True,
                                                              seq_lens=True, linear_before_reset=1),
    "gru_reverse_layout1_reset_after_clip": dict(op="GRU", direction="reverse", layout=1, seq_lens=True, clip=2.0),
    # onnxruntime's GRU has code of its own per reset / output activation (recurrent_op.gru_*_gate)
    "gru_activations_swapped": dict(op="GRU", direction="bidirectional", linear_before_reset=1,
                                    activations=["Tanh", "Sigmoid", "Tanh", "Sigmoid"]),
    "gru_activations_hardsigmoid_softsign_reset_after": dict(op="GRU", activations=["HardSigmoid", "Softsign"],
                                                             activation_alpha=[0.3], activation_beta=[0.4]),
    # onnxruntime's Affine defaults to alpha = beta = 0 (recurrent_op.ACTIVATIONS)
    "lstm_affine_without_alpha_beta": dict(op="LSTM", activations=["Sigmoid", "Tanh", "Affine"]),
    "gru_affine_without_alpha_beta": dict(op="GRU", linear_before_reset=1, activations=["Sigmoid", "Affine"]),
    "lstm_bidirectional_layout1_states_only_y_h_y_c": dict(op="LSTM", direction="bidirectional", layout=1,
                                                          states=True, outputs=["Y_h", "Y_c"]),
    "rnn_bidirectional_relu_only_y_h": dict(op="RNN", direction="bidirectional", states=True,
                                            activations=["Relu", "Tanh"], outputs=["Y_h"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_sequence_kernel_matches_onnxruntime(case, tmp_path, cache):
    model = recurrent_model(**CASES[case])
    original = tmp_path / f"{case}.onnx"
    onnx.save(model, original)
    result = onnxfuse.optimize(original, tmp_path / f"{case}.fused.onnx", verify=False, cache_dir=cache)
    assert [o.status for o in result.outcomes] == ["compiled"], result.report["groups"]
    fused = onnx.load(result.model_path)
    assert not any(n.op_type in GATES for n in fused.graph.node)
    reference = original
    if CASES[case].get("layout") == 1:
        reference = tmp_path / f"{case}.reference.onnx"
        onnx.save(seq_first_reference(model), reference)
    for seed, (steps, batch) in enumerate(SIZES):
        expected, actual = run_both(reference, result.model_path, feeds_for(model, steps, batch, seed))
        assert_as_onnxruntime(CASES[case]["op"], expected, actual)


# MLAS sums a product by prepacked weights MLAS_PACKED_STRIDE_K k's at a time, adding each block
# into the output: an LSTM or GRU with more inputs or hidden units than that sums in blocks too
# (recurrent.k_blocks; the GRU's linear output in a buffer of its own).
# Without initial states the first step skips the GEMV, and with it the blocks' folds (a random
# sweep found the GRU's linear output read stale there).
@pytest.mark.parametrize("states", [True, False], ids=["states", "no_states"])
@pytest.mark.parametrize("op, linear_before_reset", [("LSTM", 0), ("GRU", 0), ("GRU", 1)])
def test_sums_past_mlas_k_block_are_onnxruntimes(op, linear_before_reset, states, tmp_path, cache):
    sizes = (MLAS_PACKED_STRIDE_K + 44, MLAS_PACKED_STRIDE_K + 4)  # input, hidden: both past one block
    attributes = {"linear_before_reset": 1} if linear_before_reset else {}
    model = recurrent_model(op, direction="bidirectional", states=states, sizes=sizes, steps=3, **attributes)
    original = tmp_path / f"{op}.onnx"
    onnx.save(model, original)
    result = onnxfuse.optimize(original, tmp_path / f"{op}.fused.onnx", verify=False, cache_dir=cache)
    assert [o.status for o in result.outcomes] == ["compiled"], result.report["groups"]
    for seed, batch in enumerate((1, 5, 8)):
        expected, actual = run_both(original, result.model_path, feeds_for(model, 3, batch, seed))
        assert_as_onnxruntime(op, expected, actual)


def without_bias(model: onnx.ModelProto) -> onnx.ModelProto:
    node = model.graph.node[0]
    node.input[3] = ""
    kept = [w for w in model.graph.initializer if w.name != "B"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


# onnxruntime clips every gate's input, with FLT_MAX when the op has no clip attribute: with a
# bias, std::min / std::max turn NaN into FLT_MAX; without one, NaN stays NaN (recurrent.pre_activation).
@pytest.mark.parametrize("case", ["LSTM", "LSTM clip", "LSTM no bias", "GRU", "GRU reset first clip", "GRU no bias"])
def test_special_values_give_onnxruntimes_bits(case, tmp_path):
    op = case.split()[0]
    attributes = {"clip": 3.0} if "clip" in case else {}
    if op == "GRU" and "first" not in case:
        attributes["linear_before_reset"] = 1
    model = recurrent_model(op, steps=4, peepholes=op == "LSTM", **attributes)
    if "no bias" in case:
        model = without_bias(model)
    original = tmp_path / "op.onnx"
    onnx.save(model, original)
    result = onnxfuse.optimize(original, tmp_path / "op.fused.onnx", verify=False, cache_dir=False)
    assert [o.status for o in result.outcomes] == ["compiled"], result.report["groups"]
    feeds = feeds_for(model, 4, 6, 0)
    x = feeds["X"]
    x[0, 0, 0], x[1, 1, 2], x[2, 2, 3] = np.nan, np.inf, -np.inf
    x[0, 3, :], x[1, 4, :] = 1e30, -0.0
    expected, actual = run_both(original, result.model_path, feeds)
    assert_as_onnxruntime(op, expected, actual)


@needs_qemu
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("cpu", ["Haswell", "Nehalem"])
def test_a_portable_kernel_is_onnxruntimes_on_each_emulated_cpu(op, cpu, tmp_path):
    """onnxruntime's Sigmoid clamps per CPU (sigmoid_clamp) and its GEMM and polynomials fuse
    multiply-adds only where the CPU has FMA: each level of a portable build computes what
    onnxruntime computes on the CPUs that run it (Haswell: the AVX2 level; Nehalem: the baseline).
    Weights of spread 6 drive many gates into the activations' clamps. (The two Sigmoid clamps
    differ at 4 of 4 million inputs near 17.84: test_sigmoid_levels.py covers them.)"""
    attributes = {"peepholes": True} if op == "LSTM" else {"linear_before_reset": 1}
    model = recurrent_model(op, direction="bidirectional", states=True, steps=4, scale=6.0, **attributes)
    original = tmp_path / f"{op}.onnx"
    onnx.save(model, original)
    result = onnxfuse.optimize(original, tmp_path / f"{op}.fused.onnx", target="portable", verify=False,
                               cache_dir=False, jobs=1)
    assert [o.status for o in result.outcomes] == ["compiled"], result.report["groups"]
    probe = Path(__file__).resolve().parent / "portable" / "probe.py"
    done = subprocess.run([QEMU, "-cpu", cpu, sys.executable, str(probe), str(original), str(result.model_path),
                           str(result.library_path), "1", "3"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["level"] == {"Haswell": "x86-64-v3", "Nehalem": "x86-64"}[cpu], report
    for output in report["outputs"]:
        assert output["same_shape"] and output["max_abs"] == 0.0, output


# At one row the LSTM projects the first chunk of steps upfront and the later ones inside the
# recurrence (recurrent._OverlappedProjection): sequences of 2 and 3 whole chunks, one with a
# partial last chunk, and a symbolic sequence run at lengths of either kind and below 2 chunks
# (the kernel then takes its other form).
OVERLAP_CASES = {
    "lstm_forward_defaults": dict(op="LSTM"),
    "lstm_bidirectional_states_lens_peepholes_clip": dict(op="LSTM", direction="bidirectional", states=True,
                                                         seq_lens=True, peepholes=True, clip=1.5),
    "lstm_reverse_layout1_input_forget": dict(op="LSTM", direction="reverse", layout=1, input_forget=1),
}
OVERLAP_SEQUENCES = {  # the model's sequence dim → the lengths run
    2 * OVERLAP_CHUNK: [2 * OVERLAP_CHUNK],
    3 * OVERLAP_CHUNK: [3 * OVERLAP_CHUNK],
    2 * OVERLAP_CHUNK + 5: [2 * OVERLAP_CHUNK + 5],
    None: [2 * OVERLAP_CHUNK, 2 * OVERLAP_CHUNK + 5, OVERLAP_CHUNK + 1],
}


@pytest.mark.parametrize("case", sorted(OVERLAP_CASES))
@pytest.mark.parametrize("sequence", list(OVERLAP_SEQUENCES), ids=lambda s: f"seq{s or '_symbolic'}")
def test_the_projection_inside_the_recurrence_matches_onnxruntime(case, sequence, tmp_path, cache):
    model = recurrent_model(**OVERLAP_CASES[case], steps=sequence)
    op = read_recurrent_op(model)
    steps = tvm.tirx.const(sequence, "int64") if sequence else tvm.tirx.Var("seq", "int64")
    assert _OverlappedProjection.plan(op, pack_weights(op, 16), steps) is not None
    original = tmp_path / f"{case}.onnx"
    onnx.save(model, original)
    result = onnxfuse.optimize(original, tmp_path / f"{case}.fused.onnx", verify=False, cache_dir=cache)
    assert [o.status for o in result.outcomes] in (["compiled"], ["cached"]), result.report["groups"]
    reference = original
    if OVERLAP_CASES[case].get("layout") == 1:
        reference = tmp_path / f"{case}.reference.onnx"
        onnx.save(seq_first_reference(model), reference)
    runs = [(length, batch) for length in OVERLAP_SEQUENCES[sequence] for batch in (1, 5)]  # 5: a full tile + 1 row
    for seed, (length, batch) in enumerate(runs):
        expected, actual = run_both(reference, result.model_path, feeds_for(model, length, batch, seed))
        assert_as_onnxruntime("LSTM", expected, actual)


PORTABLE_CASES = {
    "gru": dict(op="GRU", direction="bidirectional", linear_before_reset=1),
    # the projection inside the recurrence (a static sequence of 2 chunks) at every level
    "lstm_static_sequence": dict(op="LSTM", direction="bidirectional", peepholes=True, steps=2 * OVERLAP_CHUNK),
}


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x86-64 levels run on x86-64 hosts")
@pytest.mark.parametrize("case", sorted(PORTABLE_CASES))
def test_a_portable_build_matches_onnxruntime_at_every_level_this_cpu_runs(case, tmp_path, cache):
    """The portable target joins one kernel per ISA level into one object. Each level's entry point
    needs its own name: with one name for all levels, joining them failed and every recurrent op
    of a default (portable) build fell back to onnxruntime."""
    model = recurrent_model(**PORTABLE_CASES[case])
    original = tmp_path / f"{case}.onnx"
    onnx.save(model, original)
    result = onnxfuse.optimize(original, tmp_path / f"{case}.fused.onnx", target="portable", verify=False,
                               cache_dir=cache)
    assert [o.status for o in result.outcomes] == ["compiled"], result.report["groups"]
    probe = Path(__file__).resolve().parent / "portable" / "probe.py"
    ran = []
    for level in resolve_target("portable").levels:
        done = subprocess.run([sys.executable, str(probe), str(original), str(result.model_path),
                               str(result.library_path), "1", "6"], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "ONNXFUSE_ISA_LEVEL": level.name})
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(done.stdout.strip().splitlines()[-1])
        if report["level"] is None:
            assert "lacks a feature" in report["session_error"]
            continue
        ran.append(report["level"])
        for output in report["outputs"]:
            assert output["same_shape"] and output["max_abs"] <= 1e-5 + 1e-4 * output["max_expected"], output
    assert "x86-64" in ran  # the baseline runs everywhere


def test_the_gate_math_survives_tvms_simplifier_as_named_values():
    """TVM's simplifier substitutes a let whose value reads no memory into every use; with the
    gate math's values bound by lets, the LSTM kernel grew from 0.2 MB of TIR to 47 MB in that
    pass (the fast exp reads its argument 18 times) and took minutes to build. Named through
    stack buffers (recurrent._ValueSlots), the kernel keeps its size."""
    kernel = build_recurrent_kernel(read_recurrent_op(recurrent_model("LSTM", peepholes=True)), "k", 16)
    module = tvm.IRModule({"k": ieee_order.fence(kernel.func)})
    with tvm.transform.PassContext(opt_level=3):
        simplified = tvm.s_tir.transform.StmtSimplify()(module)
    assert len(simplified["k"].script()) < 2 * len(module["k"].script())


def test_the_rational_tanh_is_within_a_few_ulps_of_numpy():
    """The kernels' tanh (recurrent_op.rational_tanh) built for this CPU, on [-12, 12] (into the
    clamp) and on tiny values, where an absolute bound alone would hide a relative error."""
    x = np.concatenate([np.linspace(-12, 12, 200001), 2.0 ** -np.arange(1, 60), -(2.0 ** -np.arange(1, 60))])
    x = x.astype(np.float32)
    data = te.placeholder((x.size,), "float32", name="x")
    out = te.compute(data.shape, lambda i: rational_tanh(data[i]), name="tanh")
    func = te.create_prim_func([data, out]).with_attr("global_symbol", "tanh")
    built = tvm.compile(tvm.IRModule({"tanh": func}), target="llvm")
    got = tvm.runtime.tensor(np.empty_like(x))
    built["tanh"](tvm.runtime.tensor(x), got)
    expected = np.tanh(x.astype(np.float64))
    error = np.abs(got.numpy() - expected)
    assert error.max() <= 4e-7
    nonzero = expected != 0
    assert (error[nonzero] / np.abs(expected[nonzero])).max() <= 4e-7
    assert not got.numpy()[~nonzero].any()


def test_a_recurrent_node_is_a_group_of_its_own(tmp_path):
    path = tmp_path / "lstm.onnx"
    onnx.save(recurrent_model("LSTM"), path)
    plan = plan_fusion(load_model(path))
    assert [g.op_types for g in plan.groups] == [("LSTM",)]
    assert plan.unfused == []


def test_weights_computed_at_run_time_fall_back_with_a_reason():
    model = recurrent_model("GRU")
    w = next(i for i in model.graph.initializer if i.name == "W")
    model.graph.input.append(helper.make_tensor_value_info("W", TensorProto.FLOAT, list(w.dims)))
    del model.graph.initializer[[i.name for i in model.graph.initializer].index("W")]
    with pytest.raises(CompileError, match="must be constants"):
        read_recurrent_op(model)


def test_an_activation_the_kernel_lacks_falls_back_with_a_reason():
    model = recurrent_model("RNN", activations=["Softplus"])
    with pytest.raises(CompileError, match="Softplus"):
        read_recurrent_op(model)
