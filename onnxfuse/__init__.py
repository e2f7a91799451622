"""onnxfuse: post-dominator operator fusion for ONNX models, compiled with Apache TVM.

    >>> import onnxfuse
    >>> result = onnxfuse.optimize("model.onnx", "out/model.fused.onnx")   # fuse, compile, package
    >>> result.report["fused_node_count"], result.library_path
    >>> plan = onnxfuse.plan("model.onnx")                                  # the fusion plan only
    >>> onnxfuse.verify_models("model.onnx", "out/model.fused.onnx").ok     # compare under onnxruntime
    >>> sess = onnxfuse.InferenceSession("out/model.fused.onnx")            # onnxruntime + the library

The command line (`onnxfuse --help`, or `python -m onnxfuse`) wraps the same functions.
"""

__version__ = "0.1.0"

# Imported on first use: TVM and onnxruntime take seconds to import, and `plan` needs neither.
_LAZY_EXPORTS = {
    "optimize": "onnxfuse.pipeline",
    "OptimizeResult": "onnxfuse.pipeline",
    "plan": "onnxfuse.api",
    "FusionOptions": "onnxfuse.fusion.partition",
    "verify_models": "onnxfuse.verify",
    "InferenceSession": "onnxfuse.session",
    "session_options": "onnxfuse.session",
}

__all__ = sorted(_LAZY_EXPORTS)


def __getattr__(name):
    if name in _LAZY_EXPORTS:
        import importlib

        value = getattr(importlib.import_module(_LAZY_EXPORTS[name]), name)
        globals()[name] = value  # later lookups skip __getattr__
        return value
    raise AttributeError(f"module 'onnxfuse' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY_EXPORTS])
