"""nan_propagation and UnfoldStackReductions: Clip, Max and Min keep NaN as onnxruntime does,
at the cost of the plain max, and variadic Max/Min import as elementwise ops. Negated float
comparisons are true on NaN (nan_safe_comparisons.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from onnx_builder import model, node
from test_codegen import check_against_ort
from tvm import s_tir

from onnxfuse.codegen import relax_import
from onnxfuse.codegen.compile import _schedule_or_plain, compile_group
from onnxfuse.codegen.nan_propagation import propagate_nan
from onnxfuse.codegen.register_file import AVX512
from onnxfuse.codegen.tir_walk import expr_size
from onnxfuse.target import resolve_target

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 88.5, -88.5, 0.5, -0.5, 2.5, -2.5,
                    3e38, -3e38, 1.0, -1.0], np.float32)
CONSTANTS = {"lo": np.array(-1.0, np.float32), "hi": np.array(1.0, np.float32),
             "one": np.array(1.0, np.float32), "two": np.array(2.0, np.float32),
             "row": np.linspace(-2, 2, 16).astype(np.float32)}

CASES = {
    "clip_inputs": ([node("Clip", ["x", "lo", "hi"], "a")], 18),
    "clip_attributes": ([node("Clip", ["x"], "a", min=-1.0, max=1.0)], 10),
    "clip_low_only": ([node("Clip", ["x", "lo"], "a")], 18),
    "max_data_first": ([node("Max", ["x", "one"], "a")], 18),
    "max_constant_first": ([node("Max", ["one", "x"], "a")], 18),
    "min_data_first": ([node("Min", ["x", "one"], "a")], 18),
    "max_two_inputs": ([node("Max", ["x", "z"], "a")], 18),
    "min_three_inputs_broadcast": ([node("Min", ["z", "row", "x"], "a")], 18),
    "relu6_chain": ([node("Clip", ["x", "lo", "hi"], "c1"), node("Mul", ["c1", "two"], "m"),
                     node("Clip", ["m", "lo", "hi"], "a")], 18),
}


def _model(nodes, opset, with_z):
    graph_nodes = nodes + [node("Mul", ["a", "two"], "y")]
    used = {i for n in graph_nodes for i in n.input}
    inputs = {"x": ("N", 16)} | ({"z": ("N", 16)} if with_z else {})
    return model(graph_nodes, inputs, {"y": ("N", 16)}, {k: v for k, v in CONSTANTS.items() if k in used}, opset=opset)


@pytest.mark.parametrize("case", list(CASES))
def test_nan_and_infinities_match_onnxruntime(tmp_path, case):
    nodes, opset = CASES[case]
    with_z = any("z" in n.input for n in nodes)
    m = _model(nodes, opset, with_z)
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    feeds = {"x": np.stack([SPECIAL, SPECIAL[::-1], np.roll(SPECIAL, 5)])}
    if with_z:  # NaN on each side of the comparison, and on both
        feeds["z"] = np.stack([SPECIAL[::-1], SPECIAL, np.roll(SPECIAL, 5)])
    check_against_ort(cg, m, feeds)


def _scheduled(onnx_model):
    return _schedule_or_plain(relax_import.import_group(onnx_model, "k").prim_func, AVX512)[0]


def _count(func, node_type) -> int:
    found = []

    def visit(node, visitor):
        found.append(node)
        visitor.default_visit(node)

    tvm_ffi.structural_visit(func, [(node_type, visit)])
    return len(found)


def _count_isnan(func) -> int:
    return func.script().count("T.isnan")


def test_a_constant_bound_costs_no_check():
    """Clip against constants only reorders max/min: no isnan, no select."""
    func = _scheduled(_model(CASES["relu6_chain"][0], 18, with_z=False))
    assert _count_isnan(func) == 0
    assert _count(func, tvm.tirx.Select) == 0
    assert _count(func, tvm.tirx.Max) + _count(func, tvm.tirx.Min) == 4


def test_a_row_reduction_keeps_its_plain_update_but_its_input_is_checked():
    m = model([node("Max", ["x", "z"], "a"), node("ReduceMax", ["a", "axes"], "y", keepdims=1)],
              {"x": ("N", 64), "z": ("N", 64)}, {"y": ("N", 1)}, {"axes": np.array([1], np.int64)}, opset=18)
    func = _scheduled(m)
    assert _count_isnan(func) == 1  # the elementwise Max(x, z); not the row max's update
    updates = []

    def visit_block(block, visitor):
        store = block.body
        if isinstance(store, tvm.tirx.BufferStore) and isinstance(store.value, tvm.tirx.Max) and any(
                isinstance(op, tvm.ir.TensorLoad) and op.source.same_as(store.buffer) for op in (store.value.a, store.value.b)):
            updates.append(store)
        visitor.default_visit(block)

    tvm_ffi.structural_visit(func, [(s_tir.SBlock, visit_block)])
    assert updates, "the row max's accumulator update is a plain max"


def test_a_chain_of_maxima_grows_linearly():
    """Max over eight inputs: each level repeats only its small operand."""
    names = [f"x{i}" for i in range(8)]
    m = model([node("Max", names, "y")], {n: ("N", 16) for n in names}, {"y": ("N", 16)}, opset=18)
    func = relax_import.import_group(m, "k").prim_func
    before = sum(expr_size(s.value) for s in _stores(func))
    after = sum(expr_size(s.value) for s in _stores(propagate_nan(func)))
    assert _count_isnan(propagate_nan(func)) == 7
    assert after <= 4 * before


def _stores(func) -> list:
    found = []

    def visit(store, visitor):
        found.append(store)

    tvm_ffi.structural_visit(func, [(tvm.tirx.BufferStore, visit)])
    return found


def test_variadic_max_imports_without_a_stack():
    m = model([node("Max", ["x", "z", "row"], "y")], {"x": ("N", 16), "z": ("N", 16)}, {"y": ("N", 16)},
              {"row": CONSTANTS["row"]}, opset=18)
    func = relax_import.import_group(m, "k").prim_func
    reductions = []

    def visit_block(block, visitor):
        if any(int(iv.iter_type) == 2 for iv in block.iter_vars):
            reductions.append(block.name_hint)
        visitor.default_visit(block)

    tvm_ffi.structural_visit(func, [(s_tir.SBlock, visit_block)])
    assert reductions == []
    assert "stack" not in func.script()


@pytest.mark.parametrize("op", ["Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_negated_comparisons_are_true_on_nan(tmp_path, op, dtype):
    """Not(Less(NaN, 1)) is true. TVM's simplifier made it `NaN >= 1` and its LLVM backend
    emits `!=` as an ordered compare: both false (found by a dtype sweep)."""
    elem = 1 if dtype == np.float32 else 11
    m = model([node(op, ["x", "z"], "c"), node("Not", ["c"], "y")], {"x": ("N", 16), "z": ("N", 16)},
              {"y": ("N", 16)}, dtype=elem, opset=18)
    m.graph.output[0].type.tensor_type.elem_type = 9  # bool
    cg = compile_group(m, "k", resolve_target("native"), tmp_path)
    values = SPECIAL.astype(dtype)
    check_against_ort(cg, m, {"x": np.stack([values, values[::-1]]), "z": np.stack([values[::-1], np.roll(values, 3)])})
