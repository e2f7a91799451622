"""Dense layers of many shapes under the default, against onnxruntime: `make bench-dense`.

The bundled and exported models have GEMMs whose sizes are multiples of 16 (BERT-tiny's 64 and
256, the cells' 64-wide gates). A user's MLP has 100 or 200 or 784 of them. This sweep writes
`x @ W + b -> activation` for a grid of K x N (2D `[N, K]` at batch 1 / 64 / 1,000, and 3D
`[N, 16, K]` at batch 1 / 64) and four activations (Relu, Tanh, Sigmoid, and GELU as PyTorch
exports it), optimizes each with default options and times it against onnxruntime (1 thread,
alternating rounds, onnxfuse.bench). The table says how many groups compiled, the speedup (the
median of round-by-round ratios) and whether the outputs are onnxruntime's bits.

    python benchmarks/dense_layers.py                 # every shape (about 15 minutes)
    python benchmarks/dense_layers.py --only k100,k784 # names containing any of these

Results: benchmarks/results/dense.{md,json}. Models and fused outputs go to .cache/dense-work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxfuse import optimize  # noqa: E402
from onnxfuse.atomic import write_text_atomic  # noqa: E402
from onnxfuse.bench import BenchOptions, bench_model, machine_info  # noqa: E402
from onnxfuse.measure.contenders import BASELINE, FUSED  # noqa: E402
from onnxfuse.report import render_table  # noqa: E402

WORK = ROOT / ".cache" / "dense-work"
RESULTS = ROOT / "benchmarks" / "results"
SHAPES_2D = [(16, 16), (32, 100), (64, 72), (100, 100), (128, 10), (128, 200), (200, 50), (256, 384), (300, 300),
             (512, 10), (784, 128)]
SHAPES_3D = [(40, 40), (64, 256), (96, 96), (120, 60), (128, 20), (256, 64), (384, 384)]
ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "Gelu")
SEQ = 16


def dense_layer(rank: int, k: int, n: int, activation: str, seed: int = 0) -> onnx.ModelProto:
    """x @ W + b -> activation over [batch, K] (rank 2) or [batch, seq, K] (rank 3)."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["z"])]
    scalars = {}
    if activation == "Gelu":  # x * 0.5 * (1 + erf(x / sqrt(2))), as PyTorch's exporters write it
        nodes += [helper.make_node("Div", ["z", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["z", "e1"], ["m"]),
                  helper.make_node("Mul", ["m", "half"], ["y"])]
        scalars = {"sqrt2": 1.4142135, "one": 1.0, "half": 0.5}
    else:
        nodes.append(helper.make_node(activation, ["z"], ["y"]))
    lead = ["batch", "seq"] if rank == 3 else ["batch"]
    inits = [numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal(n) * 0.1).astype(np.float32), "b")]
    inits += [numpy_helper.from_array(np.array(v, np.float32), name) for name, v in scalars.items()]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*lead, n])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def cases() -> list[tuple[str, int, int, int, str]]:
    out = []
    for rank, shapes in ((2, SHAPES_2D), (3, SHAPES_3D)):
        for k, n in shapes:
            for activation in ACTIVATIONS:
                out.append((f"r{rank}_k{k}_n{n}_{activation.lower()}", rank, k, n, activation))
    return out


def run_case(name: str, rank: int, k: int, n: int, activation: str) -> list[dict]:
    WORK.mkdir(parents=True, exist_ok=True)
    source, fused = WORK / f"{name}.onnx", WORK / f"{name}.fused.onnx"
    onnx.save(dense_layer(rank, k, n, activation), str(source))
    result = optimize(source, fused)
    options = BenchOptions(batches=(1, 64) if rank == 3 else (1, 64, 1000), dims={"seq": SEQ} if rank == 3 else {},
                           tvm=False, budget_seconds=6.0)
    bench = bench_model(source, result.model_path, options, name=name, work_dir=WORK / "bench")
    rows = []
    for run in bench.runs:
        cells = run["contenders"]
        rows.append({"model": name, "at": run["label"], "groups": result.report["groups_compiled"]
                     + result.report["groups_cached"], "onnxruntime_ms": cells[BASELINE].get("median_ms"),
                     "onnxfuse_ms": cells[FUSED].get("median_ms"), "speedup": cells[FUSED].get("speedup"),
                     "bitwise": cells[FUSED].get("bitwise_equal"), "na": cells[FUSED].get("na")})
    return rows


def table(rows: list[dict], markdown: bool) -> str:
    header = ["model", "at", "groups", "onnxruntime ms", "onnxfuse ms", "speedup", "bits"]
    body = [[r["model"], r["at"], str(r["groups"]), str(r["onnxruntime_ms"]), str(r["onnxfuse_ms"]),
             f"{r['speedup']:.2f}x" if r.get("speedup") else str(r.get("na")),
             {True: "same", False: "close", None: "-"}[r.get("bitwise")]] for r in rows]
    return render_table(header, body, markdown)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="Comma-separated substrings: run the cases whose names contain one.")
    args = parser.parse_args()
    wanted = args.only.split(",") if args.only else None
    started = time.time()
    rows = []
    for case in cases():
        if wanted and not any(w in case[0] for w in wanted):
            continue
        for row in run_case(*case):
            rows.append(row)
            print(table([row], markdown=False).splitlines()[-1], flush=True)
    minutes = (time.time() - started) / 60
    command = "python benchmarks/dense_layers.py" + (f" --only {args.only}" if args.only else "")
    report = {"machine": machine_info(), "command": command, "date": time.strftime("%Y-%m-%d"), "rows": rows}
    write_text_atomic(RESULTS / "dense.json", json.dumps(report, indent=1, default=str))
    head = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, `{command}`, {minutes:.1f} min."
    write_text_atomic(RESULTS / "dense.md", head + "\n\n" + table(rows, markdown=True) + "\n")
    slower = [r for r in rows if r.get("speedup") and r["speedup"] < 1.0]
    print(f"{len(rows)} runs, {len(slower)} with a median speedup under 1.0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
