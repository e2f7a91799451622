"""Pass: a BatchNormalization right after a Conv is folded into the Conv's weights and bias,
with onnxruntime's float32 arithmetic.

onnxruntime does this fold itself (its ConvBNFusion) before running a model, so its Conv output
is computed from the folded weights: `s = scale / sqrt(var + eps)`, `W' = W * s` per output
channel, `B' = bias - mean * s` (with a Conv bias b: `B' = (b - mean) * s + bias`), each step
one float32 operation. Folding the same way here gives the Conv the same weights, so a kernel
that sums in onnxruntime's order returns its bits (codegen/conv_schedule); as a separate
normalisation after the Conv the result differed in the last bits. A written model holding the
folded Conv computes what the original computes under onnxruntime, which folds it the same way.

Only where onnxruntime folds (its SatisfyCondition): a float32 Conv whose weights (and bias) and
the BatchNormalization's four inputs are constants, 1-D and as long as the output channels, the
Conv's output read by that BatchNormalization alone and no graph output, and only the
BatchNormalization's first output used. Opsets as onnxruntime's rule lists them.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from .tensors import add_initializer, constant_array, take_over, used_names_everywhere

BATCH_NORM_VERSIONS = (1, 6, 7, 9, 14, 15)
BATCH_NORM_FOLDED = (7, 9, 14, 15)
"""The BatchNormalization versions onnxruntime folds."""
DEFAULT_EPSILON = 1e-5


def folded_weights(weights, scale, bias, mean, var, epsilon: float, conv_bias=None):
    """onnxruntime's folded (W', B'), every step a float32 operation in its order."""
    f32 = np.float32
    s = scale.astype(f32) / np.sqrt(var.astype(f32) + f32(epsilon))
    new_weights = weights * s.reshape((-1,) + (1,) * (weights.ndim - 1))
    if conv_bias is None:
        new_bias = bias - mean * s
    else:
        new_bias = (conv_bias - mean) * s + bias
    return new_weights.astype(f32), new_bias.astype(f32)


class FoldBatchNormsPass(ir.passes.InPlacePass):
    """Guarantee: every Conv -> BatchNormalization pair of the main graph that onnxruntime folds
    (above) is one Conv with folded weights and bias, writing the BatchNormalization's output."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        opset = model.opset_imports.get("", None)
        if opset is None:
            return ir.passes.PassResult(model, modified=False)
        taken = used_names_everywhere(model.graph)
        folded = 0
        for conv in list(model.graph):
            batch_norm = _foldable_batch_norm(conv, opset)
            if batch_norm is not None and _fold(model.graph, conv, batch_norm, taken):
                folded += 1
        return ir.passes.PassResult(model, modified=folded > 0)


def _is_op(node: ir.Node, op: str) -> bool:
    return node.op_type == op and node.domain in ("", "ai.onnx")


def _since_version(opset: int, versions: tuple[int, ...]) -> int:
    """The version of an op a model importing `opset` uses: its newest change at or before it."""
    return max((v for v in versions if v <= opset), default=0)


def _foldable_batch_norm(conv: ir.Node, opset: int) -> ir.Node | None:
    if not _is_op(conv, "Conv") or len(conv.outputs) != 1:
        return None
    output = conv.outputs[0]
    uses = list(output.uses())
    if output.is_graph_output() or len(uses) != 1:
        return None
    batch_norm, slot = uses[0].node, uses[0].idx
    if not _is_op(batch_norm, "BatchNormalization") or slot != 0:
        return None
    # Every Conv version (1, 11, 22) is one onnxruntime folds; of BatchNormalization, not 1 and 6.
    if _since_version(opset, BATCH_NORM_VERSIONS) not in BATCH_NORM_FOLDED:
        return None
    if any(out.uses() or out.is_graph_output() for out in batch_norm.outputs[1:] if out is not None):
        return None
    return batch_norm


def _fold(graph: ir.Graph, conv: ir.Node, batch_norm: ir.Node, taken: set[str]) -> bool:
    weights = constant_array(conv.inputs[1]) if len(conv.inputs) > 1 else None
    conv_bias = constant_array(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None
    params = [constant_array(v) for v in batch_norm.inputs[1:5]]
    if weights is None or weights.dtype != np.float32 or any(p is None for p in params):
        return False
    if len(conv.inputs) > 2 and conv.inputs[2] is not None and conv_bias is None:
        return False
    channels = weights.shape[0]
    if any(p.dtype != np.float32 or p.shape != (channels,) for p in params):
        return False
    if conv_bias is not None and (conv_bias.dtype != np.float32 or conv_bias.shape != (channels,)):
        return False
    epsilon = batch_norm.attributes.get("epsilon")
    new_weights, new_bias = folded_weights(weights, *params, DEFAULT_EPSILON if epsilon is None else epsilon.value,
                                           conv_bias)
    weight_value = add_initializer(graph, f"{conv.inputs[1].name}_bn_folded", new_weights, taken)
    bias_value = add_initializer(graph, f"{batch_norm.inputs[2].name}_bn_folded", new_bias, taken)
    inputs = [conv.inputs[0], weight_value, bias_value]
    folded = ir.Node("", "Conv", inputs, attributes=list(conv.attributes.values()), name=conv.name, num_outputs=1)
    take_over(graph, folded, batch_norm.outputs[0], [conv, batch_norm])
    return True
