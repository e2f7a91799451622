"""Pass: `take(shape_to_tensor(shape), k)` with a static dimension k becomes that dimension.

The ONNX frontend reads a dimension this way for the negative-index fix-up of GatherElements;
unfolded, it is a tiny run-time computation on a lifted constant inside the kernel.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .relax_rewrite import function_pass


@relax.expr_functor.mutator
class _ShapeTakeFolder(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.take":
            return call
        source, index = call.args[0], call.args[1]
        if not isinstance(source, relax.Var) or not isinstance(index, tvm.ir.GenericConst):
            return call
        binding = self.lookup_binding(source)
        if getattr(getattr(binding, "op", None), "name", None) != "relax.shape_to_tensor":
            return call
        values = getattr(binding.args[0].ty, "values", None)
        k = index.value.numpy() if hasattr(index.value, "numpy") else None
        if values is None or k is None or k.ndim != 0 or not -len(values) <= int(k) < len(values):
            return call
        dim = values[int(k)]
        if not isinstance(getattr(dim, "value", None), int):
            return call
        return relax.const(int(dim.value), str(call.ty.dtype))


FoldShapeTake = function_pass("OnnxfuseFoldShapeTake", _ShapeTakeFolder,
                              "Folds `take(shape_to_tensor(shape), k)` to the static dimension k.")
