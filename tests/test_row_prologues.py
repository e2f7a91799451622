"""Row prologues and GEMM chains (fusion/partition.py): a LayerNorm, or a GEMM with its epilogue,
read by one GEMM by constant weights alone runs in that GEMM's kernel; the kernel computes the
prologue once per row tile (schedule: a GEMM operand is never inlined) and matches onnxruntime
on the original model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import MODELS, assert_outputs_match
from onnx_builder import model, node, weights
from test_fusion_rules import groups, reasons
from test_ieee_order import fused_session, original_session

from onnxfuse.codegen import relax_import, schedule
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.kernel_identity import canonical_group

HIDDEN = 16


def layer_norm_nodes(x: str = "x") -> list:
    """LayerNorm as TorchScript and hand-written models spell it, ending in value "ln"."""
    return [node("ReduceMean", [x], "mean", axes=[-1]), node("Sub", [x, "mean"], "centered"),
            node("Mul", ["centered", "centered"], "squares"), node("ReduceMean", ["squares"], "var", axes=[-1]),
            node("Add", ["var", "eps"], "var_eps"), node("Sqrt", ["var_eps"], "std"),
            node("Div", ["centered", "std"], "normed"), node("Mul", ["normed", "gamma"], "scaled"),
            node("Add", ["scaled", "beta"], "ln")]


LN_NAMES = {"mean", "centered", "squares", "var", "var_eps", "std", "normed", "scaled", "ln"}


def ln_inits(width: int = HIDDEN) -> dict:
    return {"eps": np.array([1e-5], np.float32), "gamma": weights(width, seed=1), "beta": weights(width, seed=2)}


def ln_ffn(extra_reader: bool = False, exported_ln: bool = False, x_shape=("N", 8, HIDDEN)):
    """LayerNorm -> MatMul(w) + b -> Relu; `extra_reader`: the LayerNorm's result is also added
    to the output (a second reader); `exported_ln`: the LayerNorm is also a graph output."""
    nodes = [*layer_norm_nodes(), node("MatMul", ["ln", "w"], "mm"), node("Add", ["mm", "b"], "biased"),
             node("Relu", ["biased"], "y" if not extra_reader else "r")]
    if extra_reader:
        nodes.append(node("Add", ["r", "ln"], "y"))
    outputs = {"y": x_shape, **({"ln": x_shape} if exported_ln else {})}
    return model(nodes, {"x": x_shape}, outputs, {**ln_inits(), "w": weights(HIDDEN, HIDDEN, seed=3),
                                                  "b": weights(HIDDEN, seed=4)})


GEMM_GROUP = {"mm", "biased", "y"}


def test_a_layer_norm_read_by_one_gemm_joins_its_group():
    assert groups(ln_ffn()) == [LN_NAMES | GEMM_GROUP]
    assert sorted(map(len, groups(ln_ffn(), row_prologues=False))) == [len(GEMM_GROUP), len(LN_NAMES)]


def test_a_layer_norm_with_a_second_reader_stays_apart():
    """A residual read of the LayerNorm (a transformer block) would need its rows outside the kernel too."""
    found = groups(ln_ffn(extra_reader=True))
    assert LN_NAMES in found


def test_a_layer_norm_that_is_a_graph_output_stays_apart():
    assert LN_NAMES in groups(ln_ffn(exported_ln=True))


def test_a_reduction_over_the_batch_axis_is_no_prologue():
    """Each row of a GEMM tile would need every row of the input: the mean stays out, while the
    subtraction of its (broadcast) result is row-local and joins."""
    m = model([node("ReduceMean", ["x"], "mean", axes=[0]), node("Sub", ["x", "mean"], "centered"),
               node("MatMul", ["centered", "w"], "mm"), node("Relu", ["mm"], "y")],
              {"x": ("N", HIDDEN)}, {"y": ("N", HIDDEN)}, {"w": weights(HIDDEN, HIDDEN)})
    assert groups(m) == [{"centered", "mm", "y"}]
    assert "batch axis" in reasons(m)["mean"]


def test_a_prologue_into_the_weight_operand_stays_apart():
    """Only the data operand of a GEMM by constant weights is row-local: a computed B mixes rows."""
    m = model([node("Relu", ["a"], "ra"), node("Sigmoid", ["ra"], "sa"), node("MatMul", ["x", "sa"], "mm"),
               node("Relu", ["mm"], "y")],
              {"x": (4, HIDDEN), "a": (HIDDEN, HIDDEN)}, {"y": (4, HIDDEN)})
    assert {"ra", "sa"} in groups(m)


@pytest.mark.parametrize("batch", [1, 3, 64])
def test_layer_norm_ffn_kernel_matches_onnxruntime(tmp_path, batch):
    m = ln_ffn()
    session = fused_session(m, tmp_path)
    assert len(session.get_inputs()) == 1
    x = np.random.default_rng(batch).standard_normal((batch, 8, HIDDEN)).astype(np.float32) * 3 + 1
    expected = original_session(m).run(None, {"x": x})
    assert_outputs_match(expected, session.run(None, {"x": x}))


def test_gemm_chain_kernel_matches_onnxruntime_and_computes_the_hidden_layer_once(tmp_path):
    """MLP: MatMul + b -> Relu -> MatMul + b, one kernel. The hidden layer is a block of its own
    (materialised per row tile), not an expression inside the second GEMM's loop."""
    nodes = [node("MatMul", ["x", "w1"], "m1"), node("Add", ["m1", "b1"], "a1"), node("Relu", ["a1"], "r"),
             node("MatMul", ["r", "w2"], "m2"), node("Add", ["m2", "b2"], "y")]
    m = model(nodes, {"x": ("N", HIDDEN)}, {"y": ("N", 8)},
              {"w1": weights(HIDDEN, 48, seed=1), "b1": weights(48, seed=2), "w2": weights(48, 8, seed=3),
               "b2": weights(8, seed=4)})
    assert groups(m) == [{"m1", "a1", "r", "m2", "y"}]
    session = fused_session(m, tmp_path)
    for batch in (1, 5, 300):
        x = np.random.default_rng(batch).standard_normal((batch, HIDDEN)).astype(np.float32)
        assert_outputs_match(original_session(m).run(None, {"x": x}), session.run(None, {"x": x}))


def test_a_gemm_operand_computed_in_the_kernel_is_not_inlined():
    """Inlined, the LayerNorm's division by sqrt(var + eps) ran in the GEMM's inner loop, once per
    row, k and column block (transformer_mlp: 0.93x onnxruntime at batch 64, against 1.17x)."""
    graph = load_model(ln_ffn())
    (group,) = plan_fusion(graph).groups
    func = relax_import.import_group(canonical_group(extract_group(graph, group)).model, "k").prim_func
    script = schedule.schedule_group(func)[0].script()
    updates = [line for line in script.splitlines() if "matmul_intermediate_local[" in line and "] + " in line]
    assert updates, script
    for line in updates:
        assert "sqrt" not in line and "/" not in line, line


def test_the_bundled_transformer_mlp_runs_in_one_kernel(tmp_path):
    """LayerNorm -> FFN -> residual: the LayerNorm is the first GEMM's prologue, the FFN a GEMM
    chain, and the residual reads the input, not the LayerNorm."""
    m = onnx.load(MODELS / "transformer_mlp.onnx")
    plan = plan_fusion(load_model(m))
    assert [len(g.op_types) for g in plan.groups] == [len(m.graph.node)]
    session = fused_session(m, tmp_path)
    for batch in (1, 5):
        x = np.random.default_rng(batch).standard_normal((batch, 8, 64)).astype(np.float32)
        assert_outputs_match(original_session(m).run(None, {"X": x}), session.run(None, {"X": x}))


def test_no_prologue_joins_a_group_past_the_weight_limit(monkeypatch):
    """Groups whose weights pass GROUP_WEIGHT_LIMIT stay with onnxruntime (pipeline.py): a prologue
    joined to one would go with it, so it compiles alone instead (test_ci_large_model.py, 2 GB)."""
    from onnxfuse.fusion import partition

    m = ln_ffn()
    monkeypatch.setattr(partition, "GROUP_WEIGHT_LIMIT", HIDDEN * HIDDEN * 4 - 1)  # less than w alone
    assert sorted(map(len, groups(m))) == [len(GEMM_GROUP), len(LN_NAMES)]
