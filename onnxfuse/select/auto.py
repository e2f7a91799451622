"""`--select auto`: leave to onnxruntime the ops it still runs much faster, and only those.

Convolutions and pooling are planned as opaque (`leave_to_onnxruntime`, given to the planner), so
they never take their epilogue down with them: a residual Add + Relu after a Conv still fuses
into a kernel of its own. The exception: a graph whose every Conv is one our register-tiled
convolution runs faster than onnxruntime (small channel counts, stride 1: see
is_competitive_conv) keeps its Convs, which then fuse with their epilogues like any anchor.

Two kinds of neighbours of onnxruntime's convolutions stay with it too, because taking them out
measured slower:

- the epilogue onnxruntime folds into its own Conv kernel: BatchNormalization, an Add or Mul of
  a constant, then one activation its fused Conv applies (Relu, Clip, Sigmoid, ...);
- elementwise ops *between* convolutions (a SiLU from one Conv into the next): onnxruntime runs
  such a chain in its blocked NCHWc layout, with SiLU as one QuickGelu and a residual Add inside
  the Conv; a custom node there costs two layout conversions. mobilenet_tiny_ts with its three
  SiLUs as kernels ran at 0.50x of onnxruntime at batch 64 (0.91x at batch 1), although each
  SiLU kernel alone was 0.8-1.5x of onnxruntime's Sigmoid + Mul;
- a reduction of a convolution's result (a global average pool written as ReduceMean), which
  counts as a convolution for the rule above: mobilenet_tiny_dynamo's SiLU + ReduceMean kernel
  took 0.18-0.33x of onnxruntime's time on its own, and the model ran at 0.66-0.82x with it.

One more kind of node stays with onnxruntime for how our schedule handles it, not for its op:

- a node whose output holds the batch in its *last* axis behind a static first one (batch-last
  layout: Hummingbird's GEMM strategy for trees computes `W @ X^T`, [2550, 28] @ [28, N] ->
  [2550, N], and keeps that layout through its Reshape/Less/Equal/Cast epilogue). The row
  tiles then run over the batch, so every access strides by the batch: a GEMM gets no register
  tile (it needs static columns) and ran 4-8x slower than onnxruntime's; the elementwise
  epilogue alone 7-35x; and with a Reshape after the product every row tile recomputed the
  product over the whole batch, quadratic in it (hb_xgb_gemm's groups 100-850x slower at batch
  64-256; the model 0.01x of onnxruntime). A batch in a middle axis ([seq, N, H]) is fine.

- a MatMul or Gemm whose output's last axis (its columns) is symbolic, e.g. attention scores
  `Q @ K^T` = [N, heads, seq, seq], with the elementwise chain that only it reads (the scale,
  the mask): the register-tiled GEMM needs static columns, so the product runs an untiled
  loop. bert_tiny_2l_ts's score groups (MatMul, Mul) took 0.61x and 0.74x of onnxruntime's time
  at batch 64 (1 thread), and the model ran at 0.91-0.96x at batch 1 and 64.

- a MatMul or Gemm whose static columns fill no whole vectors and whose weight is too large to
  pad on every call (has_untiled_columns), with the elementwise ops after it: the product gets
  no register tile and runs scalar dot products, 30-50x slower than onnxruntime's at batch 64.
  Not only its one-reader chain: a GELU after it (`z / sqrt(2) -> Erf -> + 1 -> * z -> * 0.5`
  reads z twice) left as a kernel of its own ran 0.42-0.50x of onnxruntime's BiasGelu at batch 1.

- a matrix-vector product (a MatMul or Gemm with one static output row) over more than
  GEMV_WEIGHT_LIMIT elements in an operand, with its elementwise chain: memory-bound, where onnxruntime's GEMV
  streams the weights faster. The fully connected layers of light_bvlc_alexnet ([1, 9216] @
  [9216, 4096], 151 MB) and light_zfnet512 left them at 0.91x and 0.92x of onnxruntime at batch 1.

- a matrix product over more than 256 k's (MLAS_K_BLOCK: onnxruntime sums K in blocks of 256,
  and so does our kernel, which stores and reloads each block's sums per register tile), with
  its elementwise chain: onnxruntime's GEMM is at this machine's peak there and ours not faster.
  PyTorch's MNIST MLP (784 -> 320 -> 64 -> 10) ran 1.26-1.30x at batch 1 but 0.92-0.95x at 64
  and 0.94-0.97x at 1,000 (default sweep, 2026-11-28), once its kernel built at every level.

And one kind of group:

- a group that only moves data (every op injective: Transpose, Reshape, Gather, Concat, ...):
  it computes nothing, onnxruntime's Reshape and Unsqueeze cost nothing (they relabel a buffer)
  and its Transpose is a tuned copy, so a kernel can save a copy at best and pays a custom op's
  call. The Transpose + Reshape after a GRU (exporters' [seq, dirs, N, H] -> [seq, N, dirs*H])
  left gru_1l_dynamo at 0.93x and gru_2l_bi_state_ts at 0.74x of onnxruntime at batch 1, and
  gained at most 1.03x at batch 1000 (1 thread, CPU time, default_sweep).
  Unless it transposes a copy (transposes_a_copy): a ViT's v split into heads (Gather of the
  packed projection, Reshape, Transpose, Reshape) is two copies in onnxruntime and one in the
  kernel, which ran 2.9x onnxruntime's nodes at batch 64 and 6.3x at 1,000 (bench --groups).
"""

from __future__ import annotations

import numpy as np

from ..codegen import gemm_shapes
from ..fusion.forward_graph import is_row_mean_pool
from ..fusion.onnxruntime_fused_ops import MLAS_K_BLOCK
from ..fusion.plan import FusedGroup
from ..gates import is_compute_op
from ..ir import Graph, Node
from ..ops import OpKind, op_info, uncompetitive_ops

CONV_FOLDS = frozenset({"BatchNormalization", "Add", "Mul"})
"""Ops onnxruntime folds into a Conv's weights or bias (an Add or Mul only of a constant)."""

CONV_ACTIVATIONS = frozenset({"Relu", "Clip", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid"})
"""Activations onnxruntime's CPU Conv applies itself (its Conv + activation fusion)."""


def _why(op_types) -> str:
    return (f"auto: onnxruntime's {'/'.join(op_types)} is faster than our kernel today "
            f"(--select all compiles it, --select measured times it)")


def auto_rejects(group: FusedGroup, graph: Graph | None = None) -> str | None:
    """Why `auto` leaves this group to onnxruntime, or None to compile it. `graph`: the scope
    the group is in, whose competitive_convolutions count as competitive."""
    ours = competitive_convolutions(graph) if graph is not None and "Conv" in group.op_types else set()
    if graph is not None and "GlobalAveragePool" in group.op_types:
        ours |= row_means(graph)
    slow = uncompetitive_ops(op for index, op in zip(group.node_indices, group.op_types) if index not in ours)
    if slow:
        return _why(slow)
    if only_moves_data(group.op_types) and not transposes_a_copy(group.op_types):
        return ("auto: it only moves data (no op computes a value): onnxruntime's copies and reshapes are "
                "as fast, and a kernel adds a custom op's call")
    return None


def only_moves_data(op_types) -> bool:
    """Every op is injective: each output element is one input element (see the module doc)."""
    infos = [op_info(op) for op in op_types]
    return bool(infos) and all(info is not None and info.kind == OpKind.INJECTIVE for info in infos)


def transposes_a_copy(op_types) -> bool:
    """A Transpose and another op that copies (a Gather, a Slice, a second Transpose): onnxruntime
    copies the data twice, the kernel once (see the module doc). Reshapes and the like relabel a
    buffer (gates.SHAPE_PLUMBING) and copy nothing."""
    copies = [op for op in op_types if is_compute_op(op)]
    return "Transpose" in copies and len(copies) >= 2


def leave_to_onnxruntime(graph: Graph) -> dict[int, str]:
    """The nodes of `graph` that `auto` plans as opaque (by index), with the reason: the ops
    onnxruntime runs much faster, and the epilogue it fuses into a Conv of its own."""
    reasons: dict[int, str] = {}
    ours = competitive_convolutions(graph) | row_means(graph)
    for node in graph.nodes:
        if is_long_product(graph, node):
            for index in [node.index, *(n.index for n in _elementwise_chain(graph, node))]:
                reasons[index] = ("auto: a matrix product over more than 256 k's, or its elementwise epilogue: "
                                  "onnxruntime's blocked GEMM is as fast there, and faster from 64 rows")
        if is_large_gemv(graph, node):
            for index in [node.index, *(n.index for n in _elementwise_chain(graph, node))]:
                reasons[index] = ("auto: a matrix-vector product over large weights, or its elementwise epilogue: "
                                  "memory-bound, onnxruntime's GEMV is faster")
        if has_symbolic_columns(graph, node):
            for index in [node.index, *(n.index for n in _elementwise_chain(graph, node))]:
                reasons[index] = ("auto: a matrix product with symbolic columns (e.g. attention scores), or its "
                                  "elementwise epilogue: our GEMM schedule needs static columns, onnxruntime's is faster")
        if has_untiled_columns(graph, node):
            for index in [node.index, *sorted(_elementwise_reach(graph, {node.index}, graph.successors))]:
                reasons[index] = ("auto: a matrix product whose columns fill no whole vectors and whose weight is too "
                                  "large to pad on every call, or its elementwise epilogue: our GEMM schedule "
                                  "would run scalar dot products, onnxruntime's is many times faster")
        if has_batch_last_layout(graph, node):
            reasons[node.index] = ("auto: its output holds the batch in the last axis (batch-last layout, e.g. W @ X^T): "
                                   "our schedule strides every access by the batch there, onnxruntime is many times "
                                   "faster")
        if not uncompetitive_ops([node.op_type]) or node.domain not in ("", "ai.onnx") or node.index in ours:
            continue
        reasons[node.index] = _why([node.op_type])
        if node.op_type == "Conv":
            for follower in _conv_epilogue(graph, node):
                reasons[follower.index] = (f"auto: onnxruntime fuses it into {node.label}, which it runs "
                                           f"faster than our kernel")
    convolutions = set(reasons)
    after = _elementwise_reach(graph, convolutions, graph.successors)
    for index in _reductions_of(graph, convolutions | after):
        reasons[index] = ("auto: a reduction of a convolution's result: onnxruntime's is faster than our "
                          "kernel today")
        convolutions.add(index)
    after = _elementwise_reach(graph, convolutions, graph.successors)
    before = _elementwise_reach(graph, convolutions, graph.predecessors)
    for index in sorted(after & before):
        reasons[index] = ("auto: elementwise or data movement between convolutions, which onnxruntime runs in "
                          "its blocked layout; a kernel here would cost two layout conversions")
    return reasons


WHOLE_VECTORS = 16
"""float32 widths that are a multiple of this fill whole vectors on every level (AVX-512's 16
lanes, AVX2's 8, SSE's and NEON's 4): what codegen/conv_schedule needs of a convolution's output
width, and a GEMM's columns for a register tile without padding."""
MAX_CONV_INPUT_CHANNELS = 16
MAX_CONV_OUTPUT_CHANNELS = 32


def row_means(graph: Graph) -> set[int]:
    """The GlobalAveragePool nodes that are row means (forward_graph.is_row_mean_pool: over a 3-D
    input, as tf2onnx writes a Keras LayerNormalization's moments). onnxruntime runs those in
    plain NCHW, with no blocked layout to keep, and our kernel (codegen/row_sums, onnxruntime's
    order) takes them with the normalization around them. keras_encoder, paired rounds, ratio
    over onnxruntime at batch 1 / 64 / 1,000: 1.39x / 1.44x / 1.39x with both pools and the ops
    between them left to onnxruntime, 1.59x / 1.76x / 1.65x with them in kernels, 1.70x / 1.81x /
    1.73x with each layer norm one kernel (the pools planned as row reductions); the same bits.
    Pools over images (4-D and up) stay with onnxruntime."""
    return {node.index for node in graph.nodes if is_row_mean_pool(node, graph)}


def competitive_convolutions(graph: Graph) -> set[int]:
    """The Conv nodes of `graph` our register-tiled convolution (codegen/conv_schedule) runs
    faster than onnxruntime, if every Conv of the graph is one (else none). All or none, since
    onnxruntime runs its own Convs in its blocked layout: a kernel beside them costs two layout
    conversions (module doc). Measured on PyTorch's CIFAR-style ResNet (models/exported
    resnet_cifar_tiny_ts: a 16-channel stride-1 first stage at 32 x 32, then strided 32- and
    64-channel stages): `--select measured` found each of the first stage's five Conv groups
    faster than onnxruntime's nodes alone, and the model with any of them at 0.85-0.94x of
    onnxruntime's at batch 64, so it dropped them all."""
    convs = [n for n in graph.nodes if n.op_type == "Conv" and n.domain in ("", "ai.onnx")]
    if not convs or not all(is_competitive_conv(graph, n) for n in convs):
        return set()
    return {n.index for n in convs}


def is_competitive_conv(graph: Graph, node: Node) -> bool:
    """A Conv that codegen/conv_schedule register-tiles (2-D, one group, stride and dilation 1,
    float32, static weights and an output width that fills whole vectors; a window wider than
    1 x 1) with at most 16 input and 32 output channels. Measured, Conv (+ bias) + Relu, paired
    rounds, batch 1 / 64 against onnxruntime: [N, 16, 16, 16] 3x3 to 16 channels 1.10x / 1.27x
    (32 wide), 5x5 1.39x / 1.48x, 3 -> 16 channels 1.28x / 1.36x, 8 -> 8 2.06x / 2.53x; to 32
    channels 1.02x / 1.09x. Past those sizes onnxruntime's blocked kernel wins: 16 -> 64
    channels 1.05x / 0.93x, 32 -> 32 0.93x / 1.07x, 64 -> 64 0.87x / 0.95x, 128 -> 128 0.59x."""
    if len(node.inputs) < 2 or not node.outputs or node.attributes.get("group", 1) != 1:
        return False
    if any(s != 1 for s in node.attributes.get("strides", [])) or any(d != 1 for d in node.attributes.get("dilations", [])):
        return False
    weights, out = graph.value(node.inputs[1]), graph.value(node.outputs[0])
    if out.dtype != "float32" or not weights.shape or len(weights.shape) != 4 or not out.shape or len(out.shape) != 4:
        return False
    if not all(isinstance(d, int) for d in weights.shape) or not isinstance(out.shape[3], int):
        return False
    out_channels, in_channels, height, width = weights.shape
    return (out.shape[3] % WHOLE_VECTORS == 0 and height * width > 1
            and in_channels <= MAX_CONV_INPUT_CHANNELS and out_channels <= MAX_CONV_OUTPUT_CHANNELS)


def has_batch_last_layout(graph: Graph, node: Node) -> bool:
    """Whether the node's first output has a static first axis over 1 and a symbolic last one: the
    batch runs along its contiguous axis (see the module doc)."""
    if not node.outputs or not node.outputs[0]:
        return False
    shape = graph.value(node.outputs[0]).shape
    return bool(shape) and len(shape) >= 2 and isinstance(shape[0], int) and shape[0] > 1 and not isinstance(shape[-1], int)


MATRIX_PRODUCTS = frozenset({"MatMul", "Gemm"})
GEMV_WEIGHT_LIMIT = 2**20  # elements (4 MB of floats): past the L2 cache a GEMV streams its weights


def is_large_gemv(graph: Graph, node: Node) -> bool:
    """A MatMul or Gemm with one static output row and an operand of more than GEMV_WEIGHT_LIMIT
    elements (see the module doc; the light models take their weights as inputs)."""
    if node.op_type not in MATRIX_PRODUCTS or node.domain not in ("", "ai.onnx") or not node.outputs:
        return False
    out = graph.value(node.outputs[0])
    if not out.is_static or len(out.shape) < 2 or int(np.prod(out.shape[:-1])) != 1:
        return False
    return any(name and (graph.value(name).numel or 0) > GEMV_WEIGHT_LIMIT for name in node.inputs)


def is_long_product(graph: Graph, node: Node) -> bool:
    """A MatMul or Gemm whose K (the weight's reduced axis) is static and over MLAS_K_BLOCK."""
    if node.op_type not in MATRIX_PRODUCTS or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2:
        return False
    weight = graph.value(node.inputs[1]).shape
    if not weight or len(weight) < 2:
        return False
    transposed = node.op_type == "Gemm" and node.attributes.get("transB", 0)
    k = weight[-1] if transposed else weight[-2]
    return isinstance(k, int) and k > MLAS_K_BLOCK


def has_symbolic_columns(graph: Graph, node: Node) -> bool:
    """A MatMul or Gemm whose output's last axis is symbolic (see the module doc)."""
    if node.op_type not in MATRIX_PRODUCTS or node.domain not in ("", "ai.onnx") or not node.outputs:
        return False
    shape = graph.value(node.outputs[0]).shape
    return bool(shape) and len(shape) >= 2 and not isinstance(shape[-1], int)


def has_untiled_columns(graph: Graph, node: Node) -> bool:
    """A MatMul or Gemm whose static columns are no multiple of WHOLE_VECTORS and that the schedule
    cannot pad to whole vectors (gemm_shapes.padded_columns: the padded weight is copied on every
    call, so only small weights are; or K is symbolic). It gets no register tile: its dot
    products run scalar, along the weight's columns. Default output, 1 thread, against
    onnxruntime at batch 1 / 64 / 1,000: [N, 100] @ [100, 100] + bias + Relu 0.36x / 0.03x / 0.02x,
    [N, 128] @ [128, 200] 0.20x / 0.03x / 0.02x, [N, 512] @ [512, 10] 1.03x / 0.28x / 0.27x. A
    weight computed at run time counts as too large: attention's probabilities @ V with heads of
    8 (vit_block_ts, `[N, 4, 17, 17] @ [N, 4, 17, 8]` and the Transpose after it) ran 0.62x / 0.56x
    of onnxruntime at batch 64 / 1,000 (AMD EPYC, 1 thread)."""
    if node.op_type not in MATRIX_PRODUCTS or node.domain not in ("", "ai.onnx") or len(node.inputs) < 2 \
            or not node.outputs:
        return False
    out, weight = graph.value(node.outputs[0]).shape, graph.value(node.inputs[1]).shape
    if not out or len(out) < 2 or not isinstance(out[-1], int) or out[-1] % WHOLE_VECTORS == 0:
        return False
    if not weight or len(weight) < 2 or graph.value(node.inputs[1]).producer is not None:
        return True  # a weight a node computes (attention's V with heads of 8) is padded on every call
    transposed = node.op_type == "Gemm" and node.attributes.get("transB", 0)
    k = weight[-1] if transposed else weight[-2]
    return not isinstance(k, int) or gemm_shapes.padded_columns(out[-1], k, WHOLE_VECTORS) is None


def _elementwise_chain(graph: Graph, node: Node) -> list[Node]:
    """The elementwise and broadcast nodes after `node`, each the only reader of the one before."""
    chain: list[Node] = []
    current = _only_reader(graph, node)
    while current is not None and _is_elementwise(current):
        chain.append(current)
        current = _only_reader(graph, current)
    return chain


def _reductions_of(graph: Graph, producers: set[int]) -> list[int]:
    """Reductions that read a value of one of `producers`."""
    return [i for p in producers for i in graph.successors(p)
            if (info := op_info(graph.nodes[i].op_type, graph.nodes[i].domain)) and info.kind == OpKind.COMM_REDUCE]


def _elementwise_reach(graph: Graph, sources: set[int], step) -> set[int]:
    """Elementwise, broadcast and data-movement (injective) nodes reached from `sources` through
    such nodes only, following `step` (successors: downstream; predecessors: upstream). Data
    movement between convolutions counts too: as kernels, DenseNet's Concat -> BatchNormalization
    -> Relu -> Conv left light_densenet121 at 0.85x of onnxruntime, and ShuffleNet's BatchNormalization
    -> Relu -> Reshape -> Transpose -> Reshape (the channel shuffle) light_shufflenet at 0.71x
    (batch 1, 1 thread; each repeat agreed)."""
    reached: set[int] = set()
    frontier = [n for s in sources for n in step(s)]
    while frontier:
        index = frontier.pop()
        node = graph.nodes[index]
        info = op_info(node.op_type, node.domain)
        if index in reached or index in sources or info is None or info.kind > OpKind.INJECTIVE:
            continue
        reached.add(index)
        frontier.extend(step(index))
    return reached


def _is_elementwise(node: Node) -> bool:
    info = op_info(node.op_type, node.domain)
    return info is not None and info.kind <= OpKind.BROADCAST


def _conv_epilogue(graph: Graph, conv: Node) -> list[Node]:
    """The chain after `conv` that onnxruntime fuses into its Conv kernel: folds, then at most
    one activation, each the only reader of the value before it."""
    chain: list[Node] = []
    current = conv
    while True:
        follower = _only_reader(graph, current)
        if follower is None:
            return chain
        if follower.op_type in CONV_ACTIVATIONS:
            return [*chain, follower]
        if follower.op_type not in CONV_FOLDS or not _folds_into_conv(graph, follower, current):
            return chain
        chain.append(follower)
        current = follower


def _only_reader(graph: Graph, node: Node) -> Node | None:
    """The one node reading `node`'s only output, once, when that output is not a graph output."""
    outputs = [o for o in node.outputs if o]
    if len(outputs) != 1 or graph.value(outputs[0]).is_graph_output:
        return None
    readers = graph.value(outputs[0]).consumers
    if len(readers) != 1:
        return None
    reader = graph.nodes[readers[0]]
    return reader if reader.domain in ("", "ai.onnx") else None


def _folds_into_conv(graph: Graph, node: Node, producer: Node) -> bool:
    """BatchNormalization with constant statistics, or Add/Mul whose other operand is a constant."""
    others = [name for name in node.inputs if name and name not in producer.outputs]
    if node.op_type == "BatchNormalization":
        return all(graph.value(name).is_constant for name in others)
    return len(others) == 1 and graph.value(others[0]).is_constant
