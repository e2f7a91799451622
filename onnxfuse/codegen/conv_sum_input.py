"""aarch64: a Conv with a bias whose output only a residual Add reads, as onnxruntime fuses it.

onnxruntime's optimizer on Arm fuses `Conv(x, w, b) + z` (the Conv's output read by that Add
alone) into one Conv with a sum input: MLAS's product then starts from z, each K block's sum is
added to it in turn and the bias last, `((z + s0) + s1) + b`, where the two ops compute
`((s0 + s1) + b) + z`. A ResNet block (the bundled conv_block) came out 2.4e-7 off on the arm64
onnxruntime. A Conv without a bias is not fused there (measured), nor is any Conv on x86-64,
whose NCHWc kernels add the residual after the bias (conv_blocks), so this rewrite runs only
where the level's Conv is MLAS's im2col product (sum_orders.conv_k_block).

The Relax rewrite replaces `add(add(conv2d(x, w), b), z)` (either operand order of both adds)
by one TE call, conv_blocks.conv2d_with_sum, for the convs conv_blocks lowers itself.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

from . import sum_orders
from .conv_blocks import conv2d_with_sum
from .relax_rewrite import function_pass


@relax.expr_functor.visitor
class _UseCounter(relax.PyExprVisitor):
    def __init__(self):
        super().__init__()
        self.uses: dict = {}

    def visit_var_(self, var):
        self.uses[var] = self.uses.get(var, 0) + 1

    def visit_dataflow_var_(self, var):
        self.uses[var] = self.uses.get(var, 0) + 1


def _is_call(expr, op_name: str) -> bool:
    return isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == op_name


def _static_shape(expr) -> list[int] | None:
    shape = getattr(expr.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr):
        return None
    dims = [d.value if isinstance(d, tvm.tirx.IntImm) else None for d in shape.values]
    return None if None in dims else dims


def _lowered_by_conv_blocks(conv) -> bool:
    """A float32 NCHW/OIHW conv of one group, stride and dilation 1, static weights
    (conv_blocks.is_blocked_conv's convs, seen from Relax)."""
    attrs = conv.attrs
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or attrs.out_layout != "NCHW":
        return False
    if int(attrs.groups) != 1 or any(int(v) != 1 for v in list(attrs.strides) + list(attrs.dilation)):
        return False
    data, weights = conv.args
    if str(data.ty.dtype) != "float32" or str(weights.ty.dtype) != "float32" or len(data.ty.shape.values) != 4:
        return False
    return _static_shape(weights) is not None


def _is_channel_bias(bias, channels: int) -> bool:
    """A bias broadcast over a conv's output: [K, 1, 1] or [1, K, 1, 1]."""
    shape = _static_shape(bias)
    return shape is not None and shape in ([channels, 1, 1], [1, channels, 1, 1])


@relax.expr_functor.mutator
class _ConvSumInputRewriter(relax.PyExprMutator):
    def visit_function_(self, func):
        counter = _UseCounter()
        counter.visit_expr(func)
        self.uses = counter.uses
        return super().visit_function_(func)

    def _read_once(self, var):
        """The value bound to `var` if only one expression reads it, else None."""
        if not isinstance(var, relax.Var) or self.uses.get(var, 0) != 1:
            return None
        return self.lookup_binding(var)

    def visit_call_(self, call):
        call = super().visit_call_(call)
        if sum_orders.current().conv_k_block is None or not _is_call(call, "relax.add"):
            return call
        for biased_var, addend in (call.args, call.args[::-1]):
            biased = self._read_once(biased_var)
            if not _is_call(biased, "relax.add"):
                continue
            for conv_var, bias in (biased.args, biased.args[::-1]):
                conv = self._read_once(conv_var)
                if not _is_call(conv, "relax.nn.conv2d") or not _lowered_by_conv_blocks(conv):
                    continue
                channels = _static_shape(conv.args[1])[0]
                if not tvm_ffi.structural_equal(addend.ty, conv.ty) or not _is_channel_bias(bias, channels):
                    continue
                data, weights = conv.args
                return self.builder_.call_te(conv2d_with_sum, data, weights, bias, addend,
                                             list(conv.attrs.padding), primfunc_name_hint="conv2d_with_sum")
        return call


ConvSumInput = function_pass(
    "OnnxfuseConvSumInput", _ConvSumInputRewriter,
    "On levels whose Conv is MLAS's im2col product, conv + bias + residual as one sum from the residual.")
