"""Pass: shapes and dtypes from onnx's shape inference, inferred afresh each time.

onnx's inference keeps a shape already written on a value over the one it infers. Between two
rounds of the front end's fixed point, a Pad's pads may have become a constant: the dims it
named `unk__0` while the pads were unknown must not outlive that. So the dims onnx named itself
(`unk__N`) are made unknown again first, in Loop and If bodies too (a body's Slice rewritten to
keep its batch dim kept its old unknown one). Shapes the exporter declared (PyTorch's dynamo exporter
writes every intermediate's, often with symbols onnx cannot derive) stay: clearing them lost
fusions.

onnx infers no shape for most `ai.onnx.ml` ops; `ml_shapes.py` fills those in, and onnx's
inference runs again from them until no ML op gains a shape.
"""

from __future__ import annotations

import onnx_ir as ir
from onnx_ir.passes.common import ShapeInferencePass

from .ml_shapes import InferMlShapesPass

INFERRED_SYMBOL_PREFIX = "unk__"


class InferShapesPass(ir.passes.InPlacePass):
    """Guarantee: every value's shape and dtype is what onnx infers from the inputs' declared
    shapes and the constants, with data propagation; `modified` only if one changed."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        values = [o for node in ir.traversal.RecursiveGraphIterator(model.graph) for o in node.outputs]
        before = {v: (v.shape, v.dtype) for v in values}
        for value in values:
            if value.shape is not None and any(_inferred(d) for d in value.shape):
                value.shape = ir.Shape([None if _inferred(d) else d for d in value.shape])
        infer = ShapeInferencePass(strict_mode=False, data_prop=True)
        infer(model)
        while InferMlShapesPass()(model).modified:  # each round adds a shape to an ML op's output
            infer(model)
        modified = any(before[v] != (v.shape, v.dtype) for v in values)
        return ir.passes.PassResult(model, modified=modified)


def _inferred(dim) -> bool:
    return isinstance(dim, ir.SymbolicDim) and bool(dim.value) and dim.value.startswith(INFERRED_SYMBOL_PREFIX)
