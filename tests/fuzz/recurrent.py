"""`python -m fuzz.recurrent [CONFIGS] [SEED]` (from tests/): random LSTM and GRU ops against
onnxruntime, bit for bit (docs/recurrent.md, "Numerics"); exit 1 on any difference.

The graph fuzzer draws no recurrent ops (one op is a whole kernel with attributes of its own),
so this draws their configurations instead: sizes around the vector width and MLAS's k block,
directions, layouts, initial states, sequence_lens, peepholes, input_forget, clip, no bias,
linear_before_reset, activations (the ones the kernel implements, without alpha / beta so
onnxruntime's defaults apply), weight spreads that saturate the gates, and static or symbolic
sequences. Each prints one line when it differs; 260 configurations of seeds 1-4 found two bugs
(an Affine default, a stale GRU linear output) and none since.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from test_recurrent_ops import feeds_for, recurrent_model, seq_first_reference, without_bias

import onnxfuse

ACTIVATIONS = ["Sigmoid", "Tanh", "Relu", "HardSigmoid", "Affine", "LeakyRelu", "Softsign"]


def random_spec(rnd: random.Random) -> dict:
    op = rnd.choice(["LSTM", "GRU"])
    direction = rnd.choice(["forward", "reverse", "bidirectional"])
    spec = dict(op=op, direction=direction, layout=rnd.choice([0, 0, 1]), states=rnd.random() < 0.5,
                seq_lens=rnd.random() < 0.3, steps=rnd.choice([None, 3, 17]),
                sizes=(rnd.choice([1, 5, 16, 64, 255, 270]), rnd.choice([1, 3, 16, 17, 33, 64, 100, 257])),
                scale=rnd.choice([0.1, 0.4, 3.0]))
    if op == "LSTM":
        spec["peepholes"] = rnd.random() < 0.4
        if rnd.random() < 0.3:
            spec["input_forget"] = 1
    else:
        spec["linear_before_reset"] = rnd.choice([0, 1])
    if rnd.random() < 0.3:
        spec["clip"] = rnd.choice([0.5, 2.0, 50.0])
    if rnd.random() < 0.3:
        per_direction = 3 if op == "LSTM" else 2
        spec["activations"] = [rnd.choice(ACTIVATIONS) for _ in range(per_direction)] * (2 if direction == "bidirectional" else 1)
    return spec


def differing_elements(expected: list, actual: list) -> list[int]:
    """Per output: elements whose bits differ (NaN matching NaN)."""
    counts = []
    for e, a in zip(expected, actual):
        nan = np.isnan(e)
        counts.append(int(np.sum(nan != np.isnan(a))) + int(np.sum(e[~nan].view(np.uint32) != a[~nan].view(np.uint32))))
    return counts


def run(configs: int, seed: int) -> int:
    rnd = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="fuzz-recurrent-"))
    findings = 0
    for i in range(configs):
        spec = random_spec(rnd)
        model = recurrent_model(**spec)
        if rnd.random() < 0.2:
            spec["bias"] = False
            model = without_bias(model)
        original = work / f"op{i}.onnx"
        onnx.save(model, original)
        result = onnxfuse.optimize(original, work / f"op{i}.fused.onnx", verify=False, cache_dir=str(work / "cache"))
        if result.outcomes[0].status not in ("compiled", "cached"):
            print(f"fell back: {spec}: {result.outcomes[0].status}", flush=True)
            continue
        reference = original
        if spec["layout"] == 1:  # onnxruntime refuses layout 1: its layout-0 twin on the same numbers
            reference = work / f"op{i}.reference.onnx"
            onnx.save(seq_first_reference(model), reference)
        steps, batch = spec["steps"] or rnd.choice([1, 4, 20]), rnd.choice([1, 2, 5, 8])
        feeds = feeds_for(model, steps, batch, i)
        expected = ort.InferenceSession(str(reference), providers=["CPUExecutionProvider"]).run(None, feeds)
        actual = onnxfuse.InferenceSession(str(result.model_path), providers=["CPUExecutionProvider"]).run(None, feeds)
        counts = differing_elements(expected, actual)
        if any(counts):
            findings += 1
            print(f"differs {counts}: {spec}, sequence {steps}, batch {batch}", flush=True)
    print(f"fuzz.recurrent: {configs} configurations, seed {seed}, {findings} differing")
    return 1 if findings else 0


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    sys.exit(run(args[0] if args else 40, args[1] if len(args) > 1 else 1))
