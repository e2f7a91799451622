"""Gather chains (tree walks) get one loop per level (codegen/tree_schedule.py) and a one-row
small-batch variant; every kernel is checked against onnxruntime on the original model."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from conftest import MODELS, assert_outputs_match, run_both
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from tvm import s_tir

import onnxfuse
from onnxfuse.codegen import ieee_order, relax_import, schedule, tir_walk, tree_schedule
from onnxfuse.codegen.compile import compile_group, llvm_options
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.measure.inputs import index_limits, random_feeds_for_session
from onnxfuse.session import quiet_session_options
from onnxfuse.target import resolve_target

TREE_MODELS = ("tree_trav_d3", "perf_tree_trav_d3")
N_FEATURES = 28  # the bundled forests' input width
# 1 and 3 run the small-batch variant, 8 one full row tile, 13 and 37 a ragged last tile.
BATCHES = (1, 3, 8, 13, 37)


def _only_group_model(path) -> onnx.ModelProto:
    graph = load_model(path)
    plan = plan_fusion(graph)
    group = max(plan.groups, key=lambda g: len(g.node_indices))
    return extract_group(graph, group)


def _inlined_schedule_of(model: onnx.ModelProto):
    """The group's schedule after inlining, where schedule_group asks is_gather_chain."""
    func = relax_import.import_group(model, "k").prim_func
    sch = s_tir.Schedule(tvm.IRModule({"main": ieee_order.simplify(func)}))
    schedule.inline_cheap_producers(sch, schedule.ScheduleStats())
    return sch


def _features(batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, N_FEATURES)).astype(np.float32)


@pytest.mark.parametrize("name", TREE_MODELS)
def test_tree_programs_are_gather_chains(name):
    assert tree_schedule.is_gather_chain(_inlined_schedule_of(_only_group_model(MODELS / f"{name}.onnx")))


def test_an_embedding_lookup_is_not_a_gather_chain():
    """A Gather at indices the group is given (token ids) is one lookup, not a walk."""
    table = nh.from_array(np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32), "table")
    bias = nh.from_array(np.ones(8, np.float32), "bias")
    graph = h.make_graph([h.make_node("Gather", ["table", "ids"], ["e"]), h.make_node("Add", ["e", "bias"], ["y"])],
                         "embed", [h.make_tensor_value_info("ids", TP.INT64, ["N"])],
                         [h.make_tensor_value_info("y", TP.FLOAT, ["N", 8])], [table, bias])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    assert not tree_schedule.is_gather_chain(_inlined_schedule_of(model))


@pytest.mark.parametrize("name", TREE_MODELS)
def test_each_level_becomes_one_loop(name):
    """After tiling, fuse_level_loops moves every level's lookups into the block computing the
    level's next index: a depth-3 forest has a receiving block per level below the root, and
    fewer statements (loops over the tile's trees) right under the row tile than before."""
    model = _only_group_model(MODELS / f"{name}.onnx")
    func = relax_import.import_group(model, "k").prim_func

    def loops_under_tile(fuse: bool) -> tuple[int, frozenset]:
        sch = s_tir.Schedule(tvm.IRModule({"main": ieee_order.simplify(func)}))
        stats = schedule.ScheduleStats()
        schedule.inline_cheap_producers(sch, stats)
        schedule.separate_read_outputs(sch, stats)
        anchors, tile, _ = schedule.tile_rows(sch, stats, schedule.row_elements(sch), small_batch=True)
        schedule.compute_under_tile(sch, stats, anchors, tile)
        receivers = tree_schedule.fuse_level_loops(sch) if fuse else frozenset()
        body = sch.get(tile).body
        return len(body.seq) if hasattr(body, "seq") else 1, receivers

    loops_before, _ = loops_under_tile(fuse=False)
    loops_after, receivers = loops_under_tile(fuse=True)
    assert len(receivers) >= 3
    assert loops_after < loops_before


@pytest.mark.parametrize("name", TREE_MODELS)
def test_tree_kernel_matches_onnxruntime_at_every_batch(tmp_path, name):
    """The compiled group (main schedule and its small-batch variant) against onnxruntime on
    the group model, at batches that take each path."""
    model = _only_group_model(MODELS / f"{name}.onnx")
    compiled = compile_group(model, "k", resolve_target(), tmp_path)
    assert compiled.stats["gather_chain"]
    assert compiled.spec.small_batch_below == schedule.SMALL_BATCH_ROWS
    session = ort.InferenceSession(model.SerializeToString(), quiet_session_options(),
                                   providers=["CPUExecutionProvider"])
    limits = index_limits(model)  # tree_trav's group starts from a node index per tree: any node
    for batch in BATCHES:
        feeds = random_feeds_for_session(session, default_dim=batch, seed=batch, index_limits=limits)
        assert_outputs_match(session.run(None, feeds), compiled.run(feeds))


@pytest.mark.parametrize("name", TREE_MODELS)
def test_optimized_forest_matches_onnxruntime(tmp_path, cache, name):
    """End to end: the fused model in onnxruntime against the original at every batch."""
    source = MODELS / f"{name}.onnx"
    result = onnxfuse.optimize(source, tmp_path / f"{name}.fused.onnx", cache_dir=cache, jobs=1)
    assert result.report["groups_total"] == 1 and not result.report["groups_failed"]
    for batch in BATCHES:
        expected, actual = run_both(source, tmp_path / f"{name}.fused.onnx", {"X": _features(batch, seed=batch)})
        assert_outputs_match(expected, actual)


@pytest.mark.parametrize("name", TREE_MODELS)
def test_level_loops_of_a_row_tile_run_rows_then_trees(name):
    """With several rows per tile, a level's flat rows x trees loop is split into a row loop of
    the tile's rows and a tree loop of the forest's trees."""
    model = _only_group_model(MODELS / f"{name}.onnx")
    sch = s_tir.Schedule(tvm.IRModule({"main": ieee_order.simplify(relax_import.import_group(model, "k").prim_func)}))
    stats = schedule.ScheduleStats()
    schedule.inline_cheap_producers(sch, stats)
    schedule.separate_read_outputs(sch, stats)
    anchors, tile, _ = schedule.tile_rows(sch, stats, schedule.row_elements(sch))
    schedule.compute_under_tile(sch, stats, anchors, tile)
    assert stats.tile_rows > 1
    receivers = tree_schedule.fuse_level_loops(sch)
    trees = _n_trees(model)
    nests = [[sch.get(loop).extent for loop in sch.get_loops(b)][1:3]
             for b in tir_walk.leaf_blocks(sch) if sch.get(b).name_hint in receivers]
    split = [n for n in nests if [getattr(e, "value", None) for e in n] == [stats.tile_rows, trees]]
    assert len(split) >= 3, nests


def _n_trees(model: onnx.ModelProto) -> int:
    """The forest's tree count: the second entry of the [-1, T] shape its Reshapes use."""
    shapes = [nh.to_array(t) for t in model.graph.initializer if t.data_type == TP.INT64 and tuple(t.dims) == (2,)]
    return next(int(s[1]) for s in shapes if s[0] == -1)


def _make_models():
    """models/make_models.py, imported by path (registered in sys.modules: its dataclasses need it)."""
    import importlib.util
    import sys

    if "make_models" not in sys.modules:
        spec = importlib.util.spec_from_file_location("make_models", MODELS / "make_models.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["make_models"] = module
        spec.loader.exec_module(module)
    return sys.modules["make_models"]


# Forests of other shapes than the bundled ones: tree counts that are not powers of two (the
# rows/trees split divides by them), three classes, few features; (trees, depth, features, classes).
FOREST_SHAPES = ((7, 2, 5, 3), (13, 5, 9, 2))


@pytest.mark.parametrize("program", ("tree_trav_model", "perf_tree_trav_model"))
@pytest.mark.parametrize("shape", FOREST_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_random_forests_match_onnxruntime(tmp_path, cache, program, shape):
    mm = _make_models()
    n_trees, depth, n_features, n_classes = shape
    forest = mm.make_forest(n_trees, depth, n_features, n_classes, seed=sum(shape))
    source = tmp_path / "forest.onnx"
    onnx.save(getattr(mm, program)(forest), str(source))
    result = onnxfuse.optimize(source, tmp_path / "forest.fused.onnx", cache_dir=cache, jobs=1)
    kernels = [g for g in result.report["groups"] if g["status"] in ("compiled", "cached")]
    assert any(g.get("stats", {}).get("gather_chain") for g in kernels), result.report["groups"]
    for batch in (1, 5, 19):
        x = np.random.default_rng(batch).standard_normal((batch, n_features)).astype(np.float32)
        expected, actual = run_both(source, tmp_path / "forest.fused.onnx", {"X": x})
        assert_outputs_match(expected, actual)


def test_tree_kernels_are_built_without_x86_cmov_conversion(tmp_path, cache):
    """A tree walk's child select is on data no predictor guesses: its kernel keeps cmovs on
    x86-64 (codegen/compile.py); the flag is x86's own, so aarch64 builds never get it, and
    other kernels keep LLVM's default."""
    result = onnxfuse.optimize(MODELS / "tree_trav_d3.onnx", tmp_path / "t.fused.onnx", cache_dir=cache, jobs=1)
    (group,) = result.report["groups"]
    assert group["stats"]["llvm_options"] == "-x86-cmov-converter=false"
    assert llvm_options(resolve_target("aarch64"), gather_chain=True) == ()
    assert llvm_options(resolve_target("x86_64"), gather_chain=False) == ()
