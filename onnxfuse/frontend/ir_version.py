"""Whether the installed onnxruntime can load a model's IR version, asked before any compiling.

Why: `onnx.helper.make_model` stamps the newest IR version the onnx package knows, which can be
newer than what onnxruntime reads (onnx 1.23 writes 14, onnxruntime 1.31 reads up to 13). Such
a model cannot run before or after `optimize`; without this check every group's verification
failed on it and the whole model fell back, with a truncated onnxruntime message as the reason.
"""

from __future__ import annotations

import functools
import re

import onnx
from onnx import TensorProto, helper

from ..errors import ModelLoadError, first_line

_MAX_SUPPORTED = re.compile(r"max supported IR version: (\d+)")


@functools.cache
def onnxruntime_rejects(ir_version: int) -> str | None:
    """onnxruntime's reason for refusing a model of `ir_version`, or None if it loads one."""
    import onnxruntime as ort

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=ir_version)
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        return first_line(exc)
    return None


def require_loadable_ir_version(model: onnx.ModelProto, where) -> None:
    """A ModelLoadError (exit 2) naming the versions if onnxruntime cannot load `model`'s IR."""
    reason = onnxruntime_rejects(int(model.ir_version))
    if reason is None or "IR version" not in reason:
        return
    found = _MAX_SUPPORTED.search(reason)
    supported = f"up to {found.group(1)}" if found else "an older one"
    raise ModelLoadError(
        f"{where}: IR version {model.ir_version} is newer than the installed onnxruntime loads ({supported}); "
        f"re-export with an older onnx, or set model.ir_version lower if the model uses nothing newer")
