"""The front end: an ONNX file → onnxfuse's IR, checked and canonicalized for fusion."""
