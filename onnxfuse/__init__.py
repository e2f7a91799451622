"""onnxfuse: post-dominator operator fusion for ONNX models, compiled with Apache TVM."""

__version__ = "0.1.0"
