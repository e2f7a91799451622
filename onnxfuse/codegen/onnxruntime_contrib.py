"""onnxruntime's own ops (domain com.microsoft) in a group model, imported as its kernels compute.

A group model holds such an op where onnxruntime fuses a chain of the model's ops into it
(fusion/onnxruntime_fused_ops.py): the original's results are that kernel's. TVM's ONNX
frontend imports SkipLayerNormalization as an Add and a LayerNormalization, whose lowering is
onnxruntime's LayerNormalization (a float64 mean, the squares in lanes), not its
SkipLayerNormalization (Welford's update over the whole row), so the converter here replaces
TVM's. The frontend takes converters from one table, built by a module function; `installed`
wraps that function once per process, adding ours. The table also takes our Gemm (gemm_blocks:
onnxruntime sums a long K in blocks, from the bias), GlobalAveragePool (row_sums: its own order,
not ReduceMean's), MatMul (one_row_products: its one-row kernel by a run-time weight),
Reshape (reshape_divisions: the kernel checks a split divides) and Identity (identity_copies: a
copy, not an alias), which are no contrib ops but go the same way.
"""

from __future__ import annotations

import functools

from tvm import relax
from tvm.relax.frontend.onnx import onnx_frontend

from .arm_reciprocal import ReciprocalAsOnnxruntime
from .contracted_gelu import MULTIPLY_ADD, MultiplyAdd
from .gemm_blocks import GemmInBlocks
from .identity_copies import IdentityAsCopy
from .layer_norm import skip_layer_norm_as_onnxruntime
from .one_row_products import MatMulAsOnnxruntime
from .reshape_divisions import ReshapeRecordingDivisions
from .row_sums import global_average_pool


class SkipLayerNormalization(onnx_frontend.OnnxOpConverter):
    """Inputs: data, skip, gamma, beta (optional), bias (optional); attribute epsilon."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        data, skip, gamma, beta, bias = (list(inputs) + [None] * 5)[:5]
        epsilon = float(attr.get("epsilon", 1e-12))

        def lowered(data, skip, gamma, *rest):
            given = iter(rest)
            beta_tensor = next(given) if beta is not None else None
            bias_tensor = next(given) if bias is not None else None
            return skip_layer_norm_as_onnxruntime(data, skip, gamma, beta_tensor, bias_tensor, epsilon)

        optional = [t for t in (beta, bias) if t is not None]
        output = bb.emit_te(lowered, data, skip, gamma, *optional, primfunc_name_hint="skip_layer_norm")
        placeholder = relax.const(0, dtype="float32")  # its mean, inverse std and sum outputs: unread
        return relax.Tuple([output, placeholder, placeholder, placeholder])


class GlobalAveragePool(onnx_frontend.OnnxOpConverter):
    """onnxruntime's summing order (row_sums.global_average_as_onnxruntime), else TVM's converter."""

    @classmethod
    def _impl_v1(cls, bb, inputs, attr, params):
        pooled = global_average_pool(bb, inputs[0])
        return pooled if pooled is not None else onnx_frontend.GlobalAveragePool._impl_v1(bb, inputs, attr, params)


CONVERTERS = {"SkipLayerNormalization": SkipLayerNormalization, "Gemm": GemmInBlocks,
              "GlobalAveragePool": GlobalAveragePool, "MatMul": MatMulAsOnnxruntime,
              "Reshape": ReshapeRecordingDivisions, "Identity": IdentityAsCopy,
              "Reciprocal": ReciprocalAsOnnxruntime, MULTIPLY_ADD: MultiplyAdd}


def installed() -> None:
    """Put our converters into TVM's ONNX frontend (idempotent)."""
    build = onnx_frontend._get_convert_map
    if getattr(build, "onnxfuse_contrib", False):
        return

    @functools.wraps(build)
    def with_ours():
        return {**build(), **CONVERTERS}

    with_ours.onnxfuse_contrib = True
    onnx_frontend._get_convert_map = with_ours
