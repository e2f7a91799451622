"""The errors onnxfuse raises on purpose: each one is a clear, one-line message for the user."""


class OnnxfuseError(Exception):
    """Base class: the CLI prints the message and exits with `exit_code`, no traceback."""

    exit_code = 1


class ModelLoadError(OnnxfuseError):
    """The input is not a readable ONNX model (corrupt, truncated, missing, not ONNX)."""

    exit_code = 2


class UsageError(OnnxfuseError):
    """An option or environment the user must fix (e.g. a missing cross toolchain)."""

    exit_code = 2


class CompileError(OnnxfuseError):
    """One group could not be lowered or compiled; the group falls back to onnxruntime."""
