"""Whether a plan keeps the batch_first_trees rewrite: only if every product it wrote runs in a kernel.

The front end's batch_first_trees pass (frontend/batch_first_trees.py) rewrites Hummingbird's
GEMM-strategy trees into a form that is slower than the original under plain onnxruntime. A plan
that leaves one of its products to onnxruntime (a group bound such as `--max-depth 1`, an `auto`
rule, a compile that fell back, a kernel the shipped check dropped) is therefore worse than
optimizing the original: the model is loaded and planned again without the pass. `optimize`
checks its plan before compiling and its kept kernels after (products_left); `inspect` and
`onnxfuse.plan` decide on the plan alone (plan_with_trees: no `auto` rule, nothing compiled), so
they show the original's plan wherever the bounds already leave a product out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

import onnx

from ..frontend.batch_first_trees import NODE_PREFIX
from ..frontend.loader import load_model
from ..ir import Graph
from .partition import FusionOptions
from .plan import FusedGroup, FusionPlan, plan_fusion


def products_left(graph: Graph, kept: Iterable[FusedGroup]) -> bool:
    """Whether a product the pass wrote would run in onnxruntime: in no group of `kept`."""
    in_kernels = {index for group in kept if not group.scope for index in group.node_indices}
    return any(node.name.startswith(NODE_PREFIX) and node.op_type == "MatMul" and node.index not in in_kernels
               for node in graph.nodes)


def plan_with_trees(model: str | os.PathLike | onnx.ModelProto, options: FusionOptions, leave: Callable | None = None,
                    batch_first_trees: bool = True) -> tuple[Graph, FusionPlan]:
    """The model's graph and plan, with the pass where its products all land in groups, else
    (or with batch_first_trees=False) without it. `leave` is plan_fusion's rule for nodes left
    to onnxruntime."""
    if batch_first_trees:
        graph = load_model(model, batch_first_trees=True)
        plan = plan_fusion(graph, options, leave)
        if not products_left(graph, plan.groups):
            return graph, plan
    graph = load_model(model, batch_first_trees=False)
    return graph, plan_fusion(graph, options, leave)
