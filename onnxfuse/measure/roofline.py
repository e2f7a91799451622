"""What a kernel asks of the machine, and what the machine can give: bytes and multiply-adds
against measured copy bandwidth and GEMM peak.

A measured kernel time means little alone. Next to these bounds it says whether anything is
left to gain: a GEMM-bound group already near the machine's GEMM peak can beat onnxruntime only
by as much as onnxruntime falls short of that peak plus the fixed cost of a call, which both
sides pay (`ratio_bound`).
"""

from __future__ import annotations

import time

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.utils import Extractor

from .timing import alternating_rounds, bound_call, timing_session

PEAK_MATMUL_SIZE = 512  # a square float32 MatMul this large runs near the GEMM routine's peak
PEAK_CALLS = 8
CALL_FLOOR_CALLS = 2000  # empty calls timed for call_floor_us (about 10 ms), in CALL_FLOOR_ROUNDS rounds
CALL_FLOOR_ROUNDS = 20


def bytes_moved(model: onnx.ModelProto, feeds: dict[str, np.ndarray], outputs) -> int:
    """Bytes a model's single kernel reads and writes once: its inputs, its initializers, its outputs.

    A lower bound on its memory traffic (intermediates kept in caches are free), which is what
    makes bytes / time comparable with the machine's copy bandwidth.
    """
    weights = sum(int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                  for t in model.graph.initializer)
    return weights + sum(np.asarray(a).nbytes for a in feeds.values()) + sum(np.asarray(a).nbytes for a in outputs)


def multiply_add_flops(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> int:
    """Floating-point operations of the model's MatMul, Gemm and Conv nodes at the shapes of
    `feeds` (2 per multiply-add); nodes whose shapes cannot be inferred count 0.

    These dominate any group that has them, so flops / time is comparable with the GEMM peak."""
    shapes = _inferred_shapes(model, feeds)
    total = 0
    for node in model.graph.node:
        count = _FLOP_COUNTERS.get(node.op_type)
        if count is None:
            continue
        dims = [shapes.get(name) for name in list(node.input) + list(node.output)]
        if all(d is not None for d in dims[:2]) and dims[len(node.input)] is not None:
            total += count(node, dims[: len(node.input)], dims[len(node.input)])
    return total


def _matmul_flops(node, inputs, output) -> int:
    a = inputs[0]
    return 2 * _size(output) * a[-1]


def _gemm_flops(node, inputs, output) -> int:
    trans_a = next((attr.i for attr in node.attribute if attr.name == "transA"), 0)
    a = inputs[0]
    return 2 * _size(output) * (a[0] if trans_a else a[1])


def _conv_flops(node, inputs, output) -> int:
    weight = inputs[1]  # [C_out, C_in / group, k...]: every output element reads one filter
    return 2 * _size(output) * _size(weight[1:])


_FLOP_COUNTERS = {"MatMul": _matmul_flops, "Gemm": _gemm_flops, "Conv": _conv_flops}


GEMM_OPS = ("MatMul", "Gemm")


def gemm_only_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model cut down to its MatMul/Gemm nodes and what feeds them: their outputs become the
    graph outputs, everything after them is gone. None if it has no such node.

    Timed in onnxruntime next to the whole model, it is a measured floor: a fused kernel whose
    GEMMs run only as fast as onnxruntime's, with every other op free, is still this slow."""
    outputs = [node.output[0] for node in model.graph.node if node.op_type in GEMM_OPS]
    if not outputs:
        return None
    return _cut(model, _real_inputs(model), outputs)


def gemm_free_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """The model without its MatMul/Gemm nodes: their outputs become graph inputs, everything
    else (a cell's gate math) stays. None if it has no such node, or if onnx cannot infer the
    shapes of their outputs.

    Compiled and timed alone, it measures what the work besides the GEMMs costs at its best,
    which "everything else free" leaves out: an IEEE-exact sigmoid or tanh ends in a division
    per element, as onnxruntime's does."""
    gemm_outputs = [node.output[0] for node in model.graph.node if node.op_type in GEMM_OPS]
    if not gemm_outputs:
        return None
    try:
        return _cut(model, _real_inputs(model) + gemm_outputs, [o.name for o in model.graph.output])
    except ValueError:  # a GEMM output without an inferred type
        return None


def _real_inputs(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]


def _cut(model: onnx.ModelProto, inputs: list[str], outputs: list[str]) -> onnx.ModelProto:
    """The part of `model` from `inputs` to `outputs`; inputs that nothing kept reads are dropped."""
    inferred = onnx.shape_inference.infer_shapes(model)
    cut = Extractor(inferred).extract_model(inputs, outputs)
    needed = {name for node in cut.graph.node for name in node.input} | set(outputs)
    kept = [i for i in cut.graph.input if i.name in needed]
    del cut.graph.input[:]
    cut.graph.input.extend(kept)
    cut.ir_version = model.ir_version
    return cut


def _size(dims) -> int:
    return int(np.prod(dims, dtype=np.int64))


def _inferred_shapes(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    """Every value's static shape once the graph inputs take the feeds' shapes."""
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for value in fixed.graph.input:
        if value.name in feeds:
            dims = value.type.tensor_type.shape.dim
            del dims[:]
            for extent in np.shape(feeds[value.name]):
                dims.add().dim_value = int(extent)
    del fixed.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(fixed)
    except Exception:  # a model onnx cannot infer: count what its declared shapes give
        inferred = fixed
    shapes = {t.name: tuple(t.dims) for t in inferred.graph.initializer}
    g = inferred.graph
    for value in list(g.input) + list(g.value_info) + list(g.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def copy_bandwidth_gbs(megabytes: int = 256, repeats: int = 5) -> float:
    """This machine's memory bandwidth as numpy sees it: bytes read + written by a large copy."""
    src = np.ones(megabytes * 2**20 // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return round(2 * src.nbytes / best / 1e9, 2)


def _one_node_call(op_type: str, x: np.ndarray, output_shape, threads: int, weight: np.ndarray | None = None):
    """A timed call (bench's bound_call, like every timed call) of a one-node float32 model:
    `op_type`(x) or `op_type`(x, weight) with the weight as an initializer."""
    inputs = ["x"] + (["w"] if weight is not None else [])
    weights = [numpy_helper.from_array(weight, "w")] if weight is not None else []
    graph = helper.make_graph([helper.make_node(op_type, inputs, ["y"])], f"one_{op_type}",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, list(output_shape))], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return bound_call(timing_session(model.SerializeToString(), threads), {"x": x})


def gemm_peak_gflops(threads: int, size: int = PEAK_MATMUL_SIZE, calls: int = PEAK_CALLS) -> float:
    """GFLOP/s of onnxruntime's own GEMM on a large square float32 MatMul at `threads` threads
    (best of `calls`): the practical compute peak both onnxruntime and our kernels are held to."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((size, size)).astype(np.float32)
    x = rng.standard_normal((size, size)).astype(np.float32)
    call = _one_node_call("MatMul", x, (size, size), threads, weight)
    call()
    best = min(alternating_rounds([call], [1], calls)[0])
    return round(2 * size**3 / best / 1e9, 1)


def call_floor_us(threads: int, calls: int = CALL_FLOOR_CALLS) -> float:
    """Median µs of an onnxruntime call that does nothing (Identity of one float) at `threads`,
    called like every timed call (bench's bound_call): the fixed cost of a call from Python,
    which the kernel's side of every ratio pays too, whatever its kernel."""
    call = _one_node_call("Identity", np.zeros(1, np.float32), (1,), threads)
    per_round = max(1, calls // CALL_FLOOR_ROUNDS)
    alternating_rounds([call], [per_round], 1)  # warm-up
    return round(float(np.median(alternating_rounds([call], [per_round], CALL_FLOOR_ROUNDS)[0])) * 1e6, 2)


def ratio_bound(flops: int, onnxruntime_us: float, peak_gflops: float, call_us: float = 0.0) -> float | None:
    """The largest speedup over onnxruntime any kernel could reach: onnxruntime's time over the
    time of `flops` at the GEMM peak plus `call_us`, the fixed cost of the call around the kernel
    (call_floor_us). None when there is nothing to bound."""
    if flops <= 0 or peak_gflops <= 0:
        return None
    floor_us = flops / peak_gflops / 1e3
    return onnxruntime_us / (floor_us + max(0.0, call_us))
