"""Pass: `max(stack([a, b, ...]), axis=0)` (and min) becomes `maximum(maximum(a, b), ...)`.

The ONNX frontend imports the variadic Max and Min ops (whenever shapes are static) as a
reduction over their stacked inputs. As elementwise ops their max can propagate NaN
(nan_propagation keeps a reduction's own max plain), and the schedule sees no stack.
"""

from __future__ import annotations

from tvm import relax

from .relax_rewrite import function_pass

_PAIRWISE = {"relax.max": relax.op.maximum, "relax.min": relax.op.minimum}


@relax.expr_functor.mutator
class _StackReductionUnfolder(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        pairwise = _PAIRWISE.get(getattr(call.op, "name", None))
        stacked = call.args[0] if pairwise is not None else None
        if not isinstance(stacked, relax.Var) or call.attrs.keepdims or [int(a) for a in (call.attrs.axis or [])] != [0]:
            return call
        binding = self.lookup_binding(stacked)
        if getattr(getattr(binding, "op", None), "name", None) != "relax.stack" or int(binding.attrs.axis) != 0:
            return call
        parts = binding.args[0]
        if isinstance(parts, relax.Var):
            parts = self.lookup_binding(parts)
        if not isinstance(parts, relax.Tuple) or len(parts.fields) < 2:
            return call
        result = parts.fields[0]
        for part in parts.fields[1:]:
            result = self.builder_.normalize(pairwise(result, part))
        return result


UnfoldStackReductions = function_pass(
    "OnnxfuseUnfoldStackReductions", _StackReductionUnfolder,
    "Rewrites `max(stack(xs), axis=0)` (and min) as a chain of elementwise maximum (minimum).")
