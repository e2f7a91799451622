"""int64 lookup tables stored as uint32 and widened after the lookup (codegen/narrow_tables): the
rewritten group computes the very same bits as the original (onnxruntime on both), tables that
cannot be narrowed are left alone, the kernel still rejects an out-of-range index, and a tree
program optimized with narrowed tables matches onnxruntime on the original."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import MODELS, assert_outputs_match, run_both
from onnx import TensorProto as TP
from onnx import numpy_helper as nh
from onnx_builder import model, node

import onnxfuse
from onnxfuse.codegen import narrow_tables
from onnxfuse.codegen.compile import compile_group
from onnxfuse.frontend.loader import load_model
from onnxfuse.fusion.extract import extract_group
from onnxfuse.fusion.plan import plan_fusion
from onnxfuse.session import quiet_session_options
from onnxfuse.target import resolve_target

N_NODES = 12


def _run(m: onnx.ModelProto, feeds):
    session = ort.InferenceSession(m.SerializeToString(), quiet_session_options(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


SIGNED_TABLE = np.arange(N_NODES, dtype=np.int64) - N_NODES // 2  # has negative values


def _lookup_model(table: np.ndarray | None = None, extra_reader: str | None = None) -> onnx.ModelProto:
    """Two lookups into an int64 node table (Gather, GatherElements), as a tree level does:
    children = table[idx]; grand = table[children] gathered row-wise."""
    table = np.arange(N_NODES, dtype=np.int64)[::-1].copy() if table is None else table
    nodes = [node("Gather", ["table", "idx"], "children"),
             node("GatherElements", ["table2d", "children"], "grand", axis=1),
             node("Add", ["grand", "children"], "y")]
    inits = {"table": table, "table2d": np.tile(table, (1, 1))}
    if extra_reader == "add":  # the table read as an operand too: not a lookup table only
        nodes[-1] = node("Add", ["grand", "table"], "y")
    elif extra_reader == "as_index":  # the table as Gather *indices*: must stay int64
        nodes.append(node("Gather", ["idx", "table"], "z"))
    outputs = {"y": (1, 5)} | ({"z": (N_NODES, 5)} if extra_reader == "as_index" else {})
    return model(nodes, {"idx": (1, 5)}, outputs, inits, dtype=TP.INT64)


def _initializer_types(m: onnx.ModelProto) -> dict[str, int]:
    return {t.name: t.data_type for t in m.graph.initializer}


def _indices(seed: int = 0) -> dict[str, np.ndarray]:
    return {"idx": np.random.default_rng(seed).integers(-N_NODES, N_NODES, size=(1, 5)).astype(np.int64)}


def test_tables_become_uint32_and_lookups_are_widened():
    m = _lookup_model()
    rewritten = narrow_tables.narrowed_tables(m)
    assert _initializer_types(rewritten) == {"table__uint32": TP.UINT32, "table2d__uint32": TP.UINT32}
    assert [n.op_type for n in rewritten.graph.node] == ["Gather", "Cast", "GatherElements", "Cast", "Add"]
    for seed in range(4):
        feeds = _indices(seed)
        expected, actual = _run(m, feeds), _run(rewritten, feeds)
        assert actual[0].dtype == np.int64
        np.testing.assert_array_equal(actual[0], expected[0])


def test_extreme_values_are_narrowed_exactly():
    table = np.array([0, np.iinfo(np.uint32).max, 2**31, 2**31 - 1] + [1] * (N_NODES - 4), np.int64)
    m = model([node("Gather", ["table", "idx"], "y")], {"idx": (1, 5)}, {"y": (1, 5)}, {"table": table},
              dtype=TP.INT64)
    rewritten = narrow_tables.narrowed_tables(m)
    assert _initializer_types(rewritten) == {"table__uint32": TP.UINT32}
    feeds = {"idx": np.array([[0, 1, 2, 3, -1]], np.int64)}
    np.testing.assert_array_equal(_run(rewritten, feeds)[0], _run(m, feeds)[0])


@pytest.mark.parametrize("why, m", [
    ("a value beyond uint32", _lookup_model(np.array([2**32] + [0] * (N_NODES - 1), np.int64))),
    ("a negative value: int32 was measured slower than int64", _lookup_model(SIGNED_TABLE)),
    ("read by another op", _lookup_model(extra_reader="add")),
])
def test_tables_that_cannot_be_narrowed_stay(why, m):
    types = _initializer_types(narrow_tables.narrowed_tables(m))
    assert types.get("table") == TP.INT64, why


def test_a_table_used_as_indices_stays_int64():
    rewritten = narrow_tables.narrowed_tables(_lookup_model(extra_reader="as_index"))
    types = _initializer_types(rewritten)
    assert types["table"] == TP.INT64 and types["table2d__uint32"] == TP.UINT32


def test_nothing_to_narrow_gives_the_same_model():
    floats = model([node("Gather", ["w", "idx"], "y")], {"idx": (3,)}, {"y": (3, 2)},
                   {"w": np.ones((4, 2), np.float32)})
    assert narrow_tables.narrowed_tables(floats) is floats


def test_kernel_reads_uint32_tables_and_still_rejects_bad_indices(tmp_path):
    """compile_group applies the rewrite: the kernel takes the uint32 copy as its own weight,
    computes onnxruntime's bits on the original (negative indices wrap, as ONNX says), and an
    index out of range is still an error."""
    m = _lookup_model()
    compiled = compile_group(m, "narrowed", resolve_target("native"), tmp_path)
    assert any(a.dtype == np.uint32 for a in compiled.extra_weights.values())
    assert all(a.dtype != np.int64 or a.size < N_NODES for a in compiled.extra_weights.values())
    for seed in range(4):
        feeds = _indices(seed)
        np.testing.assert_array_equal(compiled.run(feeds)[0], _run(m, feeds)[0])
    for bad in (N_NODES, -N_NODES - 1):
        feeds = _indices()
        feeds["idx"][0, 2] = bad
        with pytest.raises(Exception, match="out of data bounds"):
            _run(m, feeds)
        with pytest.raises(Exception, match="index out of range"):
            compiled.run(feeds)


def _forest_group(name: str) -> onnx.ModelProto:
    graph = load_model(MODELS / f"{name}.onnx")
    group = max(plan_fusion(graph).groups, key=lambda g: len(g.node_indices))
    return extract_group(graph, group)


@pytest.mark.parametrize("name, narrowed", [("tree_trav_d3", {"nodes_features", "nodes_lefts", "nodes_rights"}),
                                            ("perf_tree_trav_d3", {"nodes_1", "nodes_2"})])
def test_forest_tables_are_narrowed(name, narrowed):
    """Hummingbird's node tables are narrowed; offsets (added) and root features (Gather
    indices) stay int64."""
    assert set(narrow_tables.narrowable_tables(_forest_group(name))) == narrowed


@pytest.mark.parametrize("name", ["tree_trav_d3", "perf_tree_trav_d3"])
def test_optimized_forest_with_narrow_tables_matches_onnxruntime(tmp_path, cache, name):
    """End to end: the fused model holds int32 node tables and matches onnxruntime on the original."""
    source = MODELS / f"{name}.onnx"
    fused = tmp_path / f"{name}.fused.onnx"
    result = onnxfuse.optimize(source, fused, cache_dir=cache, jobs=1)
    assert result.report["groups_total"] == 1 and not result.report["groups_failed"]
    tables = [nh.to_array(t) for t in onnx.load(str(fused)).graph.initializer]
    assert any(t.dtype == np.uint32 and t.size >= 8 for t in tables)
    for batch in (1, 3, 8, 37):
        x = np.random.default_rng(batch).standard_normal((batch, 28)).astype(np.float32)
        expected, actual = run_both(source, fused, {"X": x})
        np.testing.assert_array_equal(actual[0], expected[0])  # the label
        assert_outputs_match(expected, actual)
