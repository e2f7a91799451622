"""View epilogues (fusion/partition.py): a group that only moves an anchored group's results
joins it. PyTorch's nn.MultiheadAttention splits its packed q/k/v projection with Gathers,
Reshapes and Transposes whose branches never rejoin; each branch was a copy-only group that
`auto` left to onnxruntime, after the projection had gone to memory once."""

from __future__ import annotations

import numpy as np
import onnx
from onnx_builder import const_i64, model, node, weights
from test_fusion_rules import groups
from test_optimize import run_both

from onnxfuse import optimize


def packed_heads(index_of_graph_input: bool = False, key_perm=(1, 0, 2)) -> onnx.ModelProto:
    """x[N, 16] @ w[16, 48] + b → Reshape [N, 3, 16] → Gather(axis 1) q, k, v → each Reshape
    [N, 4, 4] → Transpose [4, N, 4] (k: by `key_perm`): three outputs, as an attention layer
    feeds its products."""
    nodes = [node("MatMul", ["x", "w"], "mm"), node("Add", ["mm", "b"], "biased"),
             node("Reshape", ["biased", "split"], "packed")]
    for i, name in enumerate("qkv"):
        index = "picked" if index_of_graph_input and name == "v" else f"i{i}"
        nodes += [node("Gather", ["packed", index], f"{name}_flat", axis=1),
                  node("Reshape", [f"{name}_flat", "heads"], f"{name}_heads"),
                  node("Transpose", [f"{name}_heads"], name, perm=list(key_perm if name == "k" else (1, 0, 2)))]
    inits = {"w": weights(16, 48), "b": weights(48, seed=1), "split": const_i64(0, 3, 16),
             "heads": const_i64(0, 4, 4), **{f"i{i}": np.array(i, np.int64) for i in range(3)}}
    inputs = {"x": ("N", 16), **({"picked": ()} if index_of_graph_input else {})}
    dims = {"q": (4, "N", 4), "v": (4, "N", 4), "k": tuple(("N", 4, 4)[a] for a in key_perm)}
    m = model(nodes, inputs, dims, inits)
    if index_of_graph_input:
        m.graph.input[1].type.tensor_type.elem_type = onnx.TensorProto.INT64
    return m


QKV_BRANCHES = {f"{name}{suffix}" for name in "qkv" for suffix in ("_flat", "_heads", "")}


def test_the_split_into_heads_joins_the_projection():
    (group,) = groups(packed_heads())
    assert group == {"mm", "biased", "packed"} | QKV_BRANCHES


def test_without_view_epilogues_each_branch_is_a_group_of_its_own():
    plan = groups(packed_heads(), view_epilogues=False)
    assert {"mm", "biased", "packed"} in plan
    assert {"q_flat", "q_heads", "q"} in plan and len(plan) == 4


def test_a_transpose_that_brings_a_static_axis_last_joins_and_a_symbolic_one_stays_apart():
    """[N, 4, 4] → [N, 4, 4] by perm (0, 2, 1): rows of four written in place of columns (Keras's
    key, tf2onnx, seq static). → [4, 4, N]: every element scattered by a run-time stride (a
    dynamo BERT's key to [b, h, d, seq])."""
    (group,) = groups(packed_heads(key_perm=(0, 2, 1)))
    assert group == {"mm", "biased", "packed"} | QKV_BRANCHES
    plan = groups(packed_heads(key_perm=(1, 2, 0)))
    assert {"k_flat", "k_heads", "k"} in plan
    assert {"mm", "biased", "packed", "q_flat", "q_heads", "q", "v_flat", "v_heads", "v"} in plan


def test_a_branch_that_also_reads_a_graph_input_stays_apart():
    plan = groups(packed_heads(index_of_graph_input=True))
    assert {"v_flat", "v_heads", "v"} in plan
    assert {"mm", "biased", "packed", "q_flat", "q_heads", "q", "k_flat", "k_heads", "k"} in plan


def test_the_projection_with_its_heads_is_onnxruntimes_bits(tmp_path):
    source = tmp_path / "heads.onnx"
    onnx.save(packed_heads(), str(source))
    result = optimize(source, tmp_path / "heads.fused.onnx", cache_dir=False, jobs=1, select="all")
    (group,) = result.report["groups"]
    assert group["status"] == "compiled", group.get("reason")
    assert sorted(group["outputs"]) == ["k", "q", "v"]
    for rows in (1, 7, 64):
        x = np.random.default_rng(rows).standard_normal((rows, 16)).astype(np.float32)
        expected, actual = run_both(source, result.model_path, {"x": x})
        for e, a in zip(expected, actual):
            assert a.shape == e.shape == (4, rows, 4)
            np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(e).view(np.uint32))


def test_a_reshape_that_divides_a_product_of_symbolic_sizes_stays_out_of_the_gemms_group():
    """x[S, N, 64] @ w, read by two branches: Reshape [16, -1, 16] (the -1 is S * N // 4, which a
    kernel checks at run time; with a GEMM such a kernel fails to build in TVM 0.27:
    forward_graph.divides_a_symbolic_size) stays out; Reshape [0, -1, 16] (-1 = N * 4) joins."""
    m = model([node("MatMul", ["x", "w"], "mm"),
               node("Reshape", ["mm", "baked"], "r1"), node("Transpose", ["r1"], "y1", perm=[1, 0, 2]),
               node("Reshape", ["mm", "heads"], "r2"), node("Transpose", ["r2"], "y2", perm=[1, 0, 2])],
              {"x": ("S", "N", 64)}, {"y1": ("R", 16, 16), "y2": ("Q", "S", 16)},
              {"w": weights(64, 64), "baked": const_i64(16, -1, 16), "heads": const_i64(0, -1, 16)})
    plan = groups(m)
    assert {"mm", "r2", "y2"} in plan and {"r1", "y1"} in plan
