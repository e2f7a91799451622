"""3-D GEMMs that fold_rows cannot fold still read their rows by exact indices.

PyTorch's nn.MultiheadAttention (dynamo export) projects q, k and v with one MatMul over
`[seq, batch, 64]` and splits the result into `[3, seq, batch, 64]`: the output is transposed, so
the group's two leading dims cannot fold into one row axis. Its Reshape read the source through
`(s * batch + b) // batch` (TVM's simplifier cannot bound b by the symbolic batch), which also
kept the epilogue from moving under the register tile (schedule_group now runs
fold_rows.exact_row_indices on every group).
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper as h
from test_codegen import f32, make_model, random_feeds

from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.register_file import AVX512
from onnxfuse.codegen.schedule import schedule_group
from onnxfuse.target import resolve_target

SIZES = [(1, 1), (5, 3), (16, 7), (16, 64)]  # (seq, batch): one row, ragged tiles, 1,024 rows


def packed_projection(k=64, parts=3):
    """x[seq, batch, k] @ w[k, parts * k] + b, split into `parts` planes: [parts, seq, batch, k]."""
    rng = np.random.default_rng(0)
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Reshape", ["a", "split"], ["r"]), h.make_node("Transpose", ["r"], ["y"], perm=[2, 0, 1, 3])]
    inits = {"w": (rng.standard_normal((k, parts * k)) * 0.1).astype(np.float32),
             "b": rng.standard_normal(parts * k).astype(np.float32),
             "split": np.array([0, 0, parts, k], np.int64)}
    return make_model(nodes, [f32("x", ["seq", "batch", k])], [f32("y", [parts, "seq", "batch", k])], inits)


def test_the_projection_is_not_folded_yet_reads_its_rows_exactly():
    scheduled, stats = schedule_group(relax_import.import_group(packed_projection(), "k").prim_func, registers=AVX512)
    script = scheduled.script()
    assert not stats.folded_rows
    assert "// batch" not in script and "% batch" not in script
    assert stats.skipped_steps == []  # the epilogue moved under the register tile
    assert stats.epilogues_per_tile == 1


@pytest.mark.parametrize("seq, batch", SIZES)
def test_the_projection_is_onnxruntimes_bits(seq, batch, tmp_path_factory):
    model = packed_projection()
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path_factory.mktemp("k"))
    feeds = random_feeds(model, seed=seq * 100 + batch, dims={"seq": seq, "batch": batch})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,), (expected,) = compiled.run(feeds), session.run(None, feeds)
    assert got.shape == expected.shape == (3, seq, batch, 64)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def head_split(heads=4, head=8, seq=17):
    """q of a packed projection `[3, seq, batch, heads * head]` split into heads and scaled, as the
    TorchScript exporter writes a ViT's attention: Gather(0), Reshape [seq, batch * heads, head],
    Transpose, Reshape [batch, heads, seq, head], Mul by a constant."""
    nodes = [h.make_node("Gather", ["x", "zero"], ["q"], axis=0), h.make_node("Reshape", ["q", "by_head"], ["r"]),
             h.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]), h.make_node("Reshape", ["t", "heads"], ["u"]),
             h.make_node("Mul", ["u", "scale"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "by_head": np.array([seq, -1, head], np.int64),
             "heads": np.array([-1, heads, seq, head], np.int64), "scale": np.array(0.5946, np.float32)}
    return make_model(nodes, [f32("x", [3, seq, "batch", heads * head])], [f32("y", ["batch", heads, seq, head])], inits)


def test_the_head_split_reads_its_source_without_dividing_by_the_batch():
    """Inlined, the Reshapes' reads meet as `(b * 4 + h) // 4 // batch` and `(... + s * batch) %
    batch`: exact_row_indices runs again on the scheduled kernel, which reads x[0, s, b, h * 8 + e]
    (a division per lane had made it 0.35x of onnxruntime's Transpose and Mul)."""
    scheduled, _ = schedule_group(relax_import.import_group(head_split(), "k").prim_func, registers=AVX512)
    code = [line for line in scheduled.script().splitlines() if "T.reads(" not in line]  # regions stay as TVM wrote them
    assert "x[T.int64(0), v_i2, v_i0, v_i1 * T.int64(8) + v_i3]" in "\n".join(code)
    assert not [line for line in code if "// batch" in line or "% batch" in line]


@pytest.mark.parametrize("batch", [1, 3, 9, 64])
def test_the_head_split_is_onnxruntimes_bits(batch, tmp_path_factory):
    model = head_split()
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path_factory.mktemp("k"))
    feeds = random_feeds(model, seed=batch, dims={"batch": batch})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,), (expected,) = compiled.run(feeds), session.run(None, feeds)
    assert got.shape == expected.shape == (batch, 4, 17, 8)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
