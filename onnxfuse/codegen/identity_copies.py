"""ONNX Identity as a copy, not an alias.

TVM's converter returns an Identity's input itself. Where a group writes both (tf2onnx's Loop body
writes a GRU's new state as a scan output and, through an Identity, as the carried state), the
group's function returned one value twice, and FuseTIR made both outputs one buffer ("TIR is
ill-formed ... multiple nested definitions"). As a copy each output has its own buffer; the copy
of a value that is not an output is inlined by the schedule like any elementwise producer read
once, so it costs nothing there.
"""

from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.frontend.onnx import onnx_frontend


def _copy(data: te.Tensor) -> te.Tensor:
    return te.compute(data.shape, lambda *index: data(*index), name="T_identity")


class IdentityAsCopy(onnx_frontend.OnnxOpConverter):
    """ONNX Identity of a computed tensor: its copy (a constant, which later converters may need
    to see as one, or a shape value: TVM's alias)."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        data = inputs[0]
        ty = getattr(data, "ty", None)
        if (isinstance(data, tvm.ir.expr.Constant) or not isinstance(ty, relax.TensorType)
                or not isinstance(ty.shape, relax.ShapeExpr)):
            return onnx_frontend.Identity._impl_v1(bb, inputs, attr, params)
        return bb.emit_te(_copy, data, primfunc_name_hint="identity")
