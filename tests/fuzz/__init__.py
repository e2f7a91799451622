"""onnxfuse's differential fuzzer: random ONNX graphs from the ops it fuses (graphs.py), compiled
with `onnxfuse optimize` and run against onnxruntime on adversarial inputs (feeds.py,
execute.py), under one comparison rule (compare.py). `make fuzz` runs a campaign (campaign.py,
__main__.py); failures are minimised (minimise.py) and kept as regressions (regressions/,
known_bugs.py, tests/test_fuzz_regressions.py)."""
