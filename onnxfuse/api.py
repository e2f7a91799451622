"""Small conveniences of the Python API that sit on top of the stages."""

from __future__ import annotations

import os

import onnx

from .fusion.partition import FusionOptions
from .fusion.plan import FusionPlan
from .fusion.tree_rewrite import plan_with_trees


def plan(model: str | os.PathLike | onnx.ModelProto, *, max_depth: int = 256, max_inputs: int = 64,
         max_duplication: int = 1) -> FusionPlan:
    """The fusion plan of a model file or ModelProto (what `onnxfuse inspect` prints); nothing is
    compiled, and neither TVM nor onnxruntime is imported.

        >>> p = onnxfuse.plan("model.onnx", max_depth=64)
        >>> [(g.name, g.op_types) for g in p.groups], [(u.op_type, u.reason) for u in p.unfused]
    """
    options = FusionOptions(max_depth=max_depth, max_inputs=max_inputs, max_duplication=max_duplication)
    return plan_with_trees(model, options)[1]
