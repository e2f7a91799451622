"""Fast polynomial math for exp / tanh / erf / sigmoid / softmax, as a Relax rewrite before legalization.

Why our own pass: TVM's FastMathTransform leaves `sigmoid` alone, which then lowers to a scalar
libm `expf` call per element (no vectorization). Accuracy was measured against onnxruntime
(see tests/test_codegen.py): within rtol 1e-4 / atol 1e-5 for float32.
"""

from __future__ import annotations

import tvm
from tvm import relax, te, topi

from .relax_rewrite import rewrite_functions


def _fast_sigmoid(x: te.Tensor) -> te.Tensor:
    one = tvm.tirx.const(1.0, x.dtype)
    e = topi.fast_exp(topi.negative(x))
    return te.compute(x.shape, lambda *i: one / (one + e(*i)), name="fast_sigmoid")


def _keeping_nan(x: te.Tensor, approximation: te.Tensor) -> te.Tensor:
    """NaN where x is NaN: topi's fast erf clamps its input with max/min, which turns NaN into 1."""
    return te.compute(x.shape, lambda *i: tvm.tirx.Select(tvm.tirx.isnan(x(*i)), x(*i), approximation(*i)), name="keep_nan")


def _fast_softmax(x: te.Tensor, axis: int) -> te.Tensor:
    """exp(x - max) / sum: topi's softmax calls libm's expf once per element (not vectorized)."""
    peak = topi.max(x, axis=axis, keepdims=True)
    e = topi.fast_exp(topi.subtract(x, peak))
    return topi.divide(e, topi.sum(e, axis=axis, keepdims=True))


def _fast_log_softmax(x: te.Tensor, axis: int) -> te.Tensor:
    """x - max - log(sum(exp(x - max))): a fast exp per element, libm's log once per row."""
    shifted = topi.subtract(x, topi.max(x, axis=axis, keepdims=True))
    return topi.subtract(shifted, topi.log(topi.sum(topi.fast_exp(shifted), axis=axis, keepdims=True)))


_REWRITES = {
    "relax.exp": lambda x, attrs: topi.fast_exp(x),
    "relax.tanh": lambda x, attrs: topi.fast_tanh(x),
    "relax.erf": lambda x, attrs: _keeping_nan(x, topi.fast_erf(x)),
    "relax.sigmoid": lambda x, attrs: _fast_sigmoid(x),
    "relax.nn.softmax": lambda x, attrs: _fast_softmax(x, int(attrs.axis)),
    "relax.nn.log_softmax": lambda x, attrs: _fast_log_softmax(x, int(attrs.axis)),
}


@relax.expr_functor.mutator
class _FastMathRewriter(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        op = getattr(call.op, "name", None)
        rewrite = _REWRITES.get(op)
        if rewrite is None or call.args[0].ty.dtype != "float32":
            return call
        return self.builder_.call_te(rewrite, call.args[0], call.attrs)


@tvm.transform.module_pass(opt_level=0, name="OnnxfuseFastMath")
class FastMath:
    """Rewrites float32 exp/tanh/erf/sigmoid/softmax/log_softmax in every Relax function to fast
    approximations."""

    def transform_module(self, mod, ctx):
        return rewrite_functions(mod, _FastMathRewriter)
