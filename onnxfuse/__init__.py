"""onnxfuse: post-dominator operator fusion for ONNX models, compiled with Apache TVM."""

__version__ = "0.1.0"

# Imported on first use: onnxruntime is only needed to run models, not to fuse them.
_LAZY_EXPORTS = {
    "InferenceSession": "onnxfuse.session",
    "session_options": "onnxfuse.session",
    "optimize": "onnxfuse.optimize",
    "plan": "onnxfuse.api",
    "FusionOptions": "onnxfuse.fusion.partition",
}


def __getattr__(name):
    if name in _LAZY_EXPORTS:
        import importlib

        return getattr(importlib.import_module(_LAZY_EXPORTS[name]), name)
    raise AttributeError(f"module 'onnxfuse' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY_EXPORTS])
