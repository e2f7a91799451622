"""Pass: `logical_not(cmp(a, b))` on floats stays true where a or b is NaN.

TVM's simplifier turns `!(a < b)` into `a >= b`, and its LLVM backend emits `a != b` as an
ordered compare; both are false where a or b is NaN, while the negation is true there
(onnxruntime, IEEE). We write the negation as the opposite comparison or'ed with
`isnan(a) || isnan(b)`, which no later rewrite breaks.
"""

from __future__ import annotations

from tvm import relax

from .relax_rewrite import function_pass

_OPPOSITE = {
    "relax.less": relax.op.greater_equal, "relax.less_equal": relax.op.greater,
    "relax.greater": relax.op.less_equal, "relax.greater_equal": relax.op.less,
    "relax.equal": relax.op.not_equal, "relax.not_equal": relax.op.equal,
}


@relax.expr_functor.mutator
class _NegatedComparisonRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if getattr(call.op, "name", None) != "relax.logical_not" or not isinstance(call.args[0], relax.Var):
            return call
        comparison = self.lookup_binding(call.args[0])
        opposite = _OPPOSITE.get(getattr(getattr(comparison, "op", None), "name", None))
        if opposite is None or "float" not in str(comparison.args[0].ty.dtype):
            return call
        a, b = comparison.args
        if comparison.op.name == "relax.not_equal":  # not(a != b) is a == b, false on NaN either way
            return self.builder_.normalize(opposite(a, b))
        either_nan = relax.op.logical_or(relax.op.isnan(a), relax.op.isnan(b))
        return self.builder_.normalize(relax.op.logical_or(opposite(a, b), either_nan))


NanSafeNegatedComparisons = function_pass(
    "OnnxfuseNanSafeNegatedComparisons", _NegatedComparisonRewriter,
    "Rewrites `not(cmp(a, b))` on floats as `opposite(a, b) or isnan(a) or isnan(b)`.")
