"""Elementwise vector loops are as wide as the runs their loads read (codegen/vector_runs.py).

A ViT's attention, as the TorchScript exporter writes it, splits q, k and v into heads of 8
floats: a 16-lane vector over the output [batch, 4, 17, 8] spans two rows that lie 32 * batch
floats apart in the source. Those groups ran at 0.65-0.74x of onnxruntime's Transpose + Mul.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper as h
from test_codegen import f32, make_model, random_feeds

from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import compile_group
from onnxfuse.codegen.register_file import AVX2, AVX512
from onnxfuse.codegen.schedule import schedule_group
from onnxfuse.target import resolve_target

BATCHES = [1, 3, 9, 64]


def split_heads(perm, heads=4, head=8, seq=17):
    """Plane 0 of a packed projection `[3, seq, batch, heads * head]` split into heads and scaled,
    as the TorchScript exporter writes a ViT's attention: Gather(0), Reshape [seq, batch * heads,
    head], Transpose(perm), Reshape to [batch, heads, ...], Mul by a constant. perm [1, 0, 2]
    gives q and v ([.., seq, head]); [1, 2, 0] gives k transposed ([.., head, seq])."""
    tail = [seq, head] if perm == [1, 0, 2] else [head, seq]
    nodes = [h.make_node("Gather", ["x", "zero"], ["q"], axis=0), h.make_node("Reshape", ["q", "by_head"], ["r"]),
             h.make_node("Transpose", ["r"], ["t"], perm=perm), h.make_node("Reshape", ["t", "heads"], ["u"]),
             h.make_node("Mul", ["u", "scale"], ["y"])]
    inits = {"zero": np.array(0, np.int64), "by_head": np.array([seq, -1, head], np.int64),
             "heads": np.array([-1, heads, *tail], np.int64), "scale": np.array(0.5946, np.float32)}
    return make_model(nodes, [f32("x", [3, seq, "batch", heads * head])], [f32("y", ["batch", heads, *tail])], inits)


def dense(shape=(4, 17, 8)):
    """x * 2 + y over [batch, *shape]: every load one run at any width."""
    nodes = [h.make_node("Mul", ["x", "two"], ["m"]), h.make_node("Add", ["m", "y"], ["z"])]
    dims = ["batch", *shape]
    return make_model(nodes, [f32("x", dims), f32("y", dims)], [f32("z", dims)], {"two": np.array(2.0, np.float32)})


def every_other_column():
    """x[:, ::2] + 1 over [batch, 64]: a strided load inside each row."""
    nodes = [h.make_node("Slice", ["x", "start", "end", "axis", "step"], ["s"]), h.make_node("Add", ["s", "one"], ["y"])]
    inits = {"start": np.array([0], np.int64), "end": np.array([64], np.int64), "axis": np.array([1], np.int64),
             "step": np.array([2], np.int64), "one": np.array(1.0, np.float32)}
    return make_model(nodes, [f32("x", ["batch", 64])], [f32("y", ["batch", 32])], inits)


def schedule(model, registers=AVX512):
    return schedule_group(relax_import.import_group(model, "k").prim_func, registers=registers)


def test_the_head_split_runs_vectors_of_one_head():
    scheduled, stats = schedule(split_heads([1, 0, 2]))
    assert stats.narrowed_to_runs == 1
    assert "T.vectorized(T.int64(8))" in scheduled.script()
    assert "T.vectorized(T.int64(16))" not in scheduled.script()


def test_the_transposed_head_split_runs_no_vector_loop():
    """Its output rows (17 positions) are columns of the source: no width reads runs, and a vector
    spanning two rows computed each lane's position with a division (78 us, against 33 scalar)."""
    scheduled, _ = schedule(split_heads([1, 2, 0]))
    assert "T.vectorized" not in scheduled.script()


def test_the_one_row_variant_narrows_the_same_splits():
    """The small-batch variant tiles one row at a time: its row loop of one step moves no address
    and used to make vector_runs keep 16 lanes (vit_block_ts at batch 1, paired rounds: 1.99x
    onnxruntime, narrowed 2.31x)."""
    func = relax_import.import_group(split_heads([1, 0, 2]), "k").prim_func
    scheduled, stats = schedule_group(func, small_batch=True, registers=AVX512)
    assert stats.narrowed_to_runs == 1 and "T.vectorized(T.int64(16))" not in scheduled.script()
    func = relax_import.import_group(split_heads([1, 2, 0]), "k").prim_func
    scheduled, _ = schedule_group(func, small_batch=True, registers=AVX512)
    assert "T.vectorized" not in scheduled.script()


def test_avx2_vectors_already_hold_one_head():
    scheduled, stats = schedule(split_heads([1, 0, 2]), AVX2)
    assert stats.narrowed_to_runs == 0
    assert "T.vectorized(T.int64(8))" in scheduled.script()


def test_dense_loads_keep_whole_registers_across_rows():
    scheduled, stats = schedule(dense())
    assert stats.narrowed_to_runs == 0
    assert "T.vectorized(T.int64(16))" in scheduled.script()


def test_a_strided_load_inside_each_row_keeps_its_vectors():
    """No width reads runs, but a vector stays inside one row: vectorized as before."""
    scheduled, stats = schedule(every_other_column())
    assert stats.narrowed_to_runs == 0
    assert "T.vectorized(T.int64(16))" in scheduled.script()


@pytest.mark.parametrize("perm", [[1, 0, 2], [1, 2, 0]], ids=["q", "k"])
@pytest.mark.parametrize("batch", BATCHES)
def test_split_heads_are_onnxruntimes_bits(perm, batch, tmp_path_factory):
    model = split_heads(perm)
    compiled = compile_group(model, "k", resolve_target("native"), tmp_path_factory.mktemp("k"))
    feeds = random_feeds(model, batch=batch, seed=batch)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,), (expected,) = compiled.run(feeds), session.run(None, feeds)
    assert got.shape == expected.shape and got.shape[0] == batch
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
