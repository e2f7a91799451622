"""Runs an original model and its fused model in this process's onnxruntime and prints, as JSON,
the ISA level the fused model's library chose and each output's largest difference.

The portable tests run it under qemu-user with an emulated CPU (`qemu-x86_64 -cpu Haswell`), so
it imports only onnxruntime and numpy: everything runs emulated, slowly.

    python probe.py ORIGINAL FUSED LIBRARY BATCH [BATCH ...]
"""

from __future__ import annotations

import ctypes
import json
import sys

import numpy as np
import onnxruntime as ort

TYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_}


def feeds_for(session: ort.InferenceSession, batch: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for meta in session.get_inputs():
        shape = [d if isinstance(d, int) else batch for d in meta.shape]
        dtype = TYPES[meta.type]
        feeds[meta.name] = (rng.standard_normal(shape).astype(dtype) if dtype == np.float32
                            else rng.integers(0, 2, shape).astype(dtype))
    return feeds


def main(original: str, fused: str, library: str, *batches: str) -> dict:
    level = ctypes.CDLL(library).onnxfuse_isa_level
    level.restype = ctypes.c_char_p
    chosen = level()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        options.register_custom_ops_library(library)
        candidate = ort.InferenceSession(fused, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # what a CPU without the library's level must get: an error, no crash
        return {"level": None, "session_error": str(exc)}
    reference = ort.InferenceSession(original, providers=["CPUExecutionProvider"])
    errors = []
    for seed, batch in enumerate(int(b) for b in batches):
        feeds = feeds_for(reference, batch, seed)
        for expected, actual in zip(reference.run(None, feeds), candidate.run(None, feeds)):
            expected, actual = np.asarray(expected, np.float64), np.asarray(actual, np.float64)
            errors.append({"batch": batch, "shape": list(actual.shape), "same_shape": expected.shape == actual.shape,
                           "max_abs": float(np.max(np.abs(expected - actual), initial=0.0)),
                           "max_expected": float(np.max(np.abs(expected), initial=0.0))})
    return {"level": chosen.decode() if chosen else None, "outputs": errors}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:])))
