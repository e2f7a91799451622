"""Runs a Sigmoid model and its fused model on the inputs in X.npy in this process's onnxruntime
and saves both outputs and the ISA level the fused model's library chose to OUT.npz.

tests/test_sigmoid_levels.py runs it under `qemu-x86_64 -cpu Nehalem` (no AVX, no FMA), where
onnxruntime runs its generic Sigmoid kernel; like probe.py it imports only onnxruntime and numpy.

    python sigmoid_probe.py ORIGINAL FUSED LIBRARY X.npy OUT.npz
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import onnxruntime as ort


def main(original: str, fused: str, library: str, inputs: str, out: str) -> None:
    level = ctypes.CDLL(library).onnxfuse_isa_level
    level.restype = ctypes.c_char_p
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.register_custom_ops_library(library)
    candidate = ort.InferenceSession(fused, options, providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(original, providers=["CPUExecutionProvider"])
    x = np.load(inputs)
    np.savez(out, onnxruntime=reference.run(None, {"x": x})[0], fused=candidate.run(None, {"x": x})[0],
             level=np.array((level() or b"").decode()))


if __name__ == "__main__":
    main(*sys.argv[1:])
