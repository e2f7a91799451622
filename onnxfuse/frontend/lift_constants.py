"""Pass: Constant nodes become initializers.

Exporters write small tensors (a Reshape's shape, a ReduceSum's axes, a Clip's bounds) as
`Constant` nodes. Fusion and code generation read compile-time inputs from initializers only, so
a Constant node made every such input "computed at run time". onnx-ir's pass does the lifting;
configured here to lift every kind (`value`, `value_float(s)`, `value_int(s)`, strings) at any
size. (Sparse constants were made dense before onnx-ir read the model: `sparse_constants.py`.)
"""

from __future__ import annotations

from onnx_ir.passes.common import LiftConstantsToInitializersPass


class LiftConstantsPass(LiftConstantsToInitializersPass):
    """Guarantee: every `Constant` node of the main graph and its subgraphs is gone, its output
    now an initializer of the same name and value; except a Constant that is a graph output,
    which ONNX lets no initializer be."""

    def __init__(self):
        super().__init__(lift_all_constants=True, size_limit=0)

