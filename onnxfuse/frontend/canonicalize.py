"""The front end's canonicalization: what exporters write → what fusion and code generation read.

Real exporters (PyTorch's two, Hummingbird, skl2onnx) write the same computation many ways:
small tensors as Constant nodes, pads built by a chain of ops over constants, reshape targets
computed from `Shape(x)` at run time, inputs with a dim of -1, local functions. Each of those
made a compile-time input look computed at run time, or a shape unknown, and broke fusion.
The passes, in order (each file states its guarantee):

1. local functions inlined (onnx-ir's InlinePass);
2. Constant nodes → initializers (`lift_constants.py`, onnx-ir's pass);
3. unknown graph-input dims → named symbols (`name_input_dims.py`);
4. to a fixed point: shape inference afresh (`infer_shapes.py`, with `ml_shapes.py` for the
   ai.onnx.ml ops onnx gives no shape), Casts to the dtype their input has removed
   (`drop_noop_casts.py`), constant-only nodes folded (`fold_constants.py`), a
   BatchNormalization after a Conv folded into it as onnxruntime folds it
   (`fold_batch_norms.py`), shape plumbing
   resolved (`shape_plumbing.py`), dims sized by that plumbing named where exact
   (`plumbed_dims.py`), an unnamed dim across a Reshape solved from its other side
   (`reshape_products.py`), a Slice of an axis' last element and the Squeeze of that axis written as
   one Gather (`last_element_gathers.py`), the axes a Slice takes whole dropped from it
   (`whole_axis_slices.py`), a Loop's carried dims made its initial value's where the body
   keeps them (`loop_carried_dims.py`), dead nodes and initializers removed (onnx-ir's
   RemoveUnusedNodesPass);
5. Hummingbird's GEMM strategy for trees computed batch first, a few trees per product
   (`batch_first_trees.py`; the caller may turn it off: the pipeline does when its products
   would not all become kernels).

Everything works on onnx-ir's in-memory model; the loader hands in and gets back a ModelProto.
"""

from __future__ import annotations

import warnings

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import (
    InlinePass,
    RemoveUnusedNodesPass,
    RemoveUnusedOpsetsPass,
)

from ..errors import first_line
from .batch_first_trees import BatchFirstTreesPass
from .drop_noop_casts import DropNoOpCastsPass
from .fold_batch_norms import FoldBatchNormsPass
from .fold_constants import MAX_FOLDED_ELEMENTS, FoldConstantsPass
from .infer_shapes import InferShapesPass
from .last_element_gathers import LastElementGathersPass
from .lift_constants import LiftConstantsPass
from .loop_carried_dims import LoopCarriedDimsPass
from .name_input_dims import NameUnknownInputDimsPass
from .plumbed_dims import NamePlumbedDimsPass
from .reshape_products import ReshapeProductsPass
from .shape_plumbing import ResolveShapePlumbingPass
from .sparse_constants import densify_sparse_constants, has_sparse_tensors
from .whole_axis_slices import WholeAxisSlicesPass

MAX_ROUNDS = 8
"""Rounds of the fixed-point loop; each round that changes nothing ends it early."""


def canonical_passes(max_folded_elements: int = MAX_FOLDED_ELEMENTS, batch_first_trees: bool = True) -> ir.passes.PassManager:
    to_fixed_point = ir.passes.PassManager(
        [
            InferShapesPass(),
            DropNoOpCastsPass(),
            FoldConstantsPass(max_folded_elements),
            FoldBatchNormsPass(),
            ResolveShapePlumbingPass(),
            NamePlumbedDimsPass(),
            ReshapeProductsPass(),
            LastElementGathersPass(),
            WholeAxisSlicesPass(),
            LoopCarriedDimsPass(),
            RemoveUnusedNodesPass(),
        ],
        steps=MAX_ROUNDS,
        early_stop=True,
    )
    trees = [BatchFirstTreesPass(), InferShapesPass(), RemoveUnusedNodesPass()] if batch_first_trees else []
    return ir.passes.PassManager(
        [InlinePass(), LiftConstantsPass(), NameUnknownInputDimsPass(), to_fixed_point, *trees, RemoveUnusedOpsetsPass()]
    )


def canonicalize(model: onnx.ModelProto, batch_first_trees: bool = True) -> onnx.ModelProto:
    """A canonical copy of `model` (the argument is not changed); `model` itself if the passes
    cannot handle it, with a warning saying why. `batch_first_trees`: run that pass (step 5)."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model)
    densify_sparse_constants(proto, MAX_FOLDED_ELEMENTS)
    if has_sparse_tensors(proto):
        warnings.warn("the model holds large sparse tensors; it is used as it is, not canonicalized", stacklevel=2)
        return model
    try:
        ir_model = ir.serde.deserialize_model(proto)
        canonical_passes(batch_first_trees=batch_first_trees)(ir_model)
        return ir.serde.serialize_model(ir_model)
    except Exception as exc:  # a model onnx-ir cannot read or write: use it as it is
        warnings.warn(f"front-end passes failed, the model is used as it is: {first_line(exc)}", stacklevel=2)
        return model
