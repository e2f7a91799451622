"""onnxfuse: post-dominator operator fusion for ONNX models, compiled with Apache TVM.

Fuse and compile a model, then run it (the fused model needs its library, written beside it):

    >>> import onnxfuse
    >>> result = onnxfuse.optimize("model.onnx", "out/model.fused.onnx", report="out/report.json")
    >>> result.report["fused_fraction"], result.model_path, result.library_path
    >>> sess = onnxfuse.InferenceSession("out/model.fused.onnx")   # onnxruntime + the library
    >>> outputs = sess.run(None, {"x": x})

The public functions (each has its own help):

    optimize(model, output=None, *, report=None, target="native", select="auto", cache_dir=True,
             jobs=None, compile_timeout=None, max_depth=256, ...) -> OptimizeResult
        fuse, compile, verify each kernel, write the model + library (+ the JSON report)
    plan(model, *, max_depth=256, max_inputs=64, max_duplication=1) -> FusionPlan
        the fusion plan only, no compiling: plan.groups, plan.unfused (with reasons)
    verify_models(original, fused, *, rtol=1e-4, atol=1e-5, runs=3, inputs=None, dims=None)
        -> VerifyResult: both models under onnxruntime, output by output; .ok, .worst, .to_json()
    InferenceSession(path, sess_options=None, **kwargs)
        onnxruntime.InferenceSession with the model's kernel library registered

Errors are onnxfuse.errors.OnnxfuseError subclasses with one-line messages (ModelLoadError for
an unreadable or invalid model, UsageError for options and outputs that cannot be written).
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
