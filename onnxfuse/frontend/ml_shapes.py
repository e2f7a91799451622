"""Pass: shapes (and dtypes) of the `ai.onnx.ml` ops whose output shape follows from their input.

onnx's shape inference gives no shape for `Scaler`, `Normalizer`, `Imputer`, the opset-1
`LabelEncoder`, nor an `ArrayFeatureExtractor` of a 1-D tensor (skl2onnx's class lookup).
skl2onnx puts a `Scaler` first in every pipeline with a StandardScaler, so every value after it
had an unknown shape and every group of the network behind it fell back ("shape of input is
unknown"). `Binarizer` and the later `LabelEncoder`s onnx does infer; they are here since they
cost a line each. The shapes written here are the ones onnxruntime's kernels produce:

1. `Scaler`, `Normalizer`: the input's shape, float;
2. `Binarizer`, `Imputer`: the input's shape and dtype;
3. `LabelEncoder`: the input's shape; the dtype of its values (`values_*` / `values_tensor`,
   opset 2+), or for opset 1 int64 from strings and strings from int64;
4. `ArrayFeatureExtractor(X, Y)`: `X.shape[:-1] + [n]` with `n` the number of indices (Y's
   element count, when it is one dim: all of Y's other dims are 1); `[1, n]` for a 1-D X.

A shape already on a value is kept, but for its unknown dims, which a known one from here
replaces (the input's shape may become known only in a later round); a dtype already there is kept.
"""

from __future__ import annotations

import math

import onnx_ir as ir

ML_DOMAIN = "ai.onnx.ml"
SAME_SHAPE_FLOAT = {"Scaler", "Normalizer"}
SAME_SHAPE_SAME_DTYPE = {"Binarizer", "Imputer"}
LABEL_ENCODER_VALUES = {"values_strings": ir.DataType.STRING, "values_int64s": ir.DataType.INT64,
                        "values_floats": ir.DataType.FLOAT}


class InferMlShapesPass(ir.passes.InPlacePass):
    """Guarantee: every output of a listed `ai.onnx.ml` node whose input has a known shape has
    the shape onnxruntime gives it (and a dtype); `modified` only if a shape or dtype was added."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.domain != ML_DOMAIN or not node.outputs or node.inputs[0] is None:
                continue
            out = node.outputs[0]
            shape, dtype = _shape_and_dtype(node, model.opset_imports.get(ML_DOMAIN, 1))
            if shape is not None and _refines(shape, out.shape):
                out.shape = ir.Shape(shape)
                modified = True
            if out.dtype in (None, ir.DataType.UNDEFINED) and dtype not in (None, ir.DataType.UNDEFINED):
                out.dtype = dtype
                modified = True
        return ir.passes.PassResult(model, modified=modified)


def _shape_and_dtype(node: ir.Node, ml_opset: int) -> tuple[list | None, ir.DataType | None]:
    x = node.inputs[0]
    x_shape = list(x.shape) if x.shape is not None else None
    if node.op_type in SAME_SHAPE_FLOAT:
        return x_shape, ir.DataType.FLOAT
    if node.op_type in SAME_SHAPE_SAME_DTYPE:
        return x_shape, x.dtype
    if node.op_type == "LabelEncoder":
        return x_shape, _label_encoder_dtype(node, x.dtype, ml_opset)
    if node.op_type == "ArrayFeatureExtractor" and len(node.inputs) == 2 and node.inputs[1] is not None:
        return _array_feature_extractor_shape(x_shape, node.inputs[1].shape), x.dtype
    return None, None


def _known(dim) -> bool:
    return isinstance(dim, int) or bool(dim.value)


def _refines(new: list, old: ir.Shape | None) -> bool:
    """Whether `new` says more than `old` and contradicts none of its known dims."""
    if old is None:
        return True
    if len(new) != len(old):
        return False
    if any(_known(o) and _known(n) and o != n for n, o in zip(new, old)):
        return False
    return any(_known(n) and not _known(o) for n, o in zip(new, old))


def _label_encoder_dtype(node: ir.Node, x_dtype: ir.DataType | None, ml_opset: int) -> ir.DataType | None:
    if ml_opset < 2:
        return {ir.DataType.STRING: ir.DataType.INT64, ir.DataType.INT64: ir.DataType.STRING}.get(x_dtype)
    values_tensor = node.attributes.get("values_tensor")
    if values_tensor is not None:
        return values_tensor.as_tensor().dtype
    return next((dtype for name, dtype in LABEL_ENCODER_VALUES.items() if name in node.attributes), None)


def _array_feature_extractor_shape(x_shape: list | None, y_shape: ir.Shape | None) -> list | None:
    if x_shape is None or not x_shape or y_shape is None:
        return None
    not_one = [d for d in y_shape if d != 1]
    if not all(_known(d) for d in not_one):
        return None
    if all(isinstance(d, int) for d in not_one):
        count = math.prod(not_one)
    elif len(not_one) == 1:
        count = not_one[0]
    else:
        return None  # a product of symbols is not one dim
    return [1, count] if len(x_shape) == 1 else x_shape[:-1] + [count]
