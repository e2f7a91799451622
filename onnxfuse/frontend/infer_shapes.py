"""Pass: shapes and dtypes from onnx's shape inference, inferred afresh each time.

onnx's inference keeps a shape already written on a value over the one it infers. Between two
rounds of the front end's fixed point, a Pad's pads may have become a constant: the dims it
named `unk__0` while the pads were unknown must not outlive that. So every shape inference
derived is cleared first: the shapes of intermediate values, and on graph outputs the dims onnx
named itself (`unk__N`); shapes the model declares on inputs and outputs stay.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

INFERRED_SYMBOL_PREFIX = "unk__"


class InferShapesPass(ir.passes.InPlacePass):
    """Guarantee: every value's shape and dtype is what onnx infers from the inputs' declared
    shapes and the constants, with data propagation; `modified` only if one changed."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        values = [o for node in model.graph for o in node.outputs]
        before = {v: (v.shape, v.dtype) for v in values}
        for value in values:
            if value.is_graph_output():
                if value.shape is not None:
                    value.shape = ir.Shape([None if _inferred(d) else d for d in value.shape])
            else:
                value.shape = None
        ShapeInferencePass(strict_mode=False, data_prop=True)(model)
        modified = any(before[v] != (v.shape, v.dtype) for v in values)
        return ir.passes.PassResult(model, modified=modified)


def _inferred(dim) -> bool:
    return isinstance(dim, ir.SymbolicDim) and bool(dim.value) and dim.value.startswith(INFERRED_SYMBOL_PREFIX)
