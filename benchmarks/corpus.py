"""The corpus check behind `make corpus-check` and `make bench-corpus`: every model of the
exported corpus (models/exported/manifest.json) optimized with default options, verified on its
recorded inputs and on them cut to one along every symbolic dim (one row: onnxruntime takes
kernels of its own there), and with --time timed against onnxruntime.

    python benchmarks/corpus.py                      # optimize + verify every model
    python benchmarks/corpus.py --time               # and time them (1 thread)
    python benchmarks/corpus.py --only a,b --time    # a subset
    python benchmarks/corpus.py --time-only a,b      # verify all, time a and b

Per model it prints compute nodes, how many of them run inside compiled kernels, groups compiled
and fallen back (with the reasons), the verify verdict on `<name>.inputs.npz`, and with --time
the speedup over onnxruntime (the median of round-by-round ratios, onnxfuse.bench's machinery,
1 thread) at the recorded inputs' own sizes and at batch 64 where the batch is symbolic (the
recorded rows repeated to 64; other symbolic dims such as BERT's `seq` keep the recorded size),
and for Hummingbird's tree_trav / perf_tree_trav models also at batch 1,000 (the size issue
#20's ≥5× criterion names).
Kernels are cached in .cache/corpus-kernels, fused models go to .cache/corpus-work; results to
benchmarks/results/corpus.{md,json}. Exits 1 if a model fails to optimize or verify.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnxruntime as ort

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxfuse import optimize  # noqa: E402
from onnxfuse.atomic import write_text_atomic  # noqa: E402
from onnxfuse.bench import BenchOptions, bench_model, machine_info  # noqa: E402
from onnxfuse.errors import OnnxfuseError  # noqa: E402
from onnxfuse.measure.contenders import BASELINE, FUSED  # noqa: E402
from onnxfuse.measure.inputs import load_inputs, model_inputs, resize_inputs  # noqa: E402
from onnxfuse.report import render_table  # noqa: E402
from onnxfuse.verify import verify_models  # noqa: E402

CORPUS = ROOT / "models" / "exported"
RESULTS = ROOT / "benchmarks" / "results"
KERNELS = ROOT / ".cache" / "corpus-kernels"
WORK = ROOT / ".cache" / "corpus-work"
BATCH = 64
TREE_BATCH = 1000
TREE_MODELS = ("hb_", "tree_trav")  # Hummingbird's exports with a traversal strategy
TIMING = dict(threads=(1,), rounds=11, budget_seconds=6.0, tvm=False, cache_dir=str(KERNELS))


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def corpus_models() -> dict[str, dict]:
    """The manifest's models that exported (a failed export has no file)."""
    entries = json.loads((CORPUS / "manifest.json").read_text())["models"]
    return {name: e for name, e in sorted(entries.items()) if e.get("status") == "ok"}


def check_model(name: str, entry: dict, timed: bool) -> dict:
    """Optimize, verify on the recorded inputs and, if `timed`, time one corpus model."""
    path, inputs = CORPUS / entry["file"], CORPUS / entry["inputs_file"]
    fused = WORK / f"{name}.fused.onnx"
    row: dict = {"model": name}
    started = time.perf_counter()
    try:
        report = optimize(path, fused, cache_dir=str(KERNELS)).report
    except OnnxfuseError as exc:
        return {**row, "error": f"optimize: {exc}"}
    fallbacks = [g["reason"] for g in report["groups"] if g["status"] == "fallback"]
    row.update(optimize_seconds=round(time.perf_counter() - started, 1),
               compute_nodes=report["compute_node_count"], fused_compute_nodes=report["fused_compute_node_count"],
               fused_fraction=report["fused_fraction"], groups=report["groups_total"],
               groups_compiled=report["groups_compiled"] + report["groups_cached"],
               groups_fallback=report["groups_fallback"], fallback_reasons=dict(Counter(r[:200] for r in fallbacks)))
    try:
        verdict = verify_models(path, fused, inputs=inputs)
        row["verify"] = verdict.to_json()
    except OnnxfuseError as exc:
        row["verify"] = {"ok": False, "error": str(exc)}
    row["verify_one"] = verify_at_one(path, fused, inputs)
    if timed:
        row["timing"] = time_model(name, entry, path, fused, inputs)
    return row


def verify_at_one(path: Path, fused: Path, inputs: Path) -> dict:
    """verify on the recorded inputs cut to 1 along every symbolic dim; {"skipped": why} where
    there is none or onnxruntime rejects such inputs for the original model."""
    specs = model_inputs(path)
    if all(isinstance(d, int) and d > 0 for spec in specs for d in spec.shape):
        return {"skipped": "no symbolic dim"}
    feeds = resize_inputs(load_inputs(inputs, specs), specs, batch=1)
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - the original's own failure: nothing to compare
        return {"skipped": f"onnxruntime rejects them for the original: {str(exc).splitlines()[0][:120]}"}
    at_one = WORK / f"{path.stem}.at_one.npz"
    np.savez(at_one, **feeds)
    try:
        return verify_models(path, fused, inputs=at_one).to_json()
    except OnnxfuseError as exc:
        return {"ok": False, "error": str(exc)}


def time_model(name: str, entry: dict, path: Path, fused: Path, inputs: Path) -> list[dict]:
    """Speedups at the recorded inputs' sizes and, where the batch is symbolic, at batch 64."""
    runs = [("inputs", BenchOptions(batches=(None,), inputs=str(inputs), **TIMING))]
    batch_dim = batch_dimension(entry)
    is_tree_program = name.startswith(TREE_MODELS[0]) and TREE_MODELS[1] in name
    sizes = [BATCH] + ([TREE_BATCH] if is_tree_program else [])
    for size in sizes:
        if batch_dim is not None and recorded_batch(entry, batch_dim) != size:
            dims, batches = ({batch_dim: size}, (None,)) if batch_dim else ({}, (size,))
            runs.append((f"batch {size}", BenchOptions(batches=batches, dims=dims, inputs=str(inputs), **TIMING)))
    out = []
    for what, options in runs:
        log(f"{name}: timing at {what}")
        try:
            result = bench_model(path, fused, options, name=name, work_dir=WORK / "bench")
        except OnnxfuseError as exc:
            out.append({"at": what, "error": str(exc)})
            continue
        run = result.runs[0]
        cells = run["contenders"]
        out.append({"at": what, "label": run["label"], "dims": run["dims"],
                    "onnxruntime_ms": cells[BASELINE].get("median_ms"), "onnxfuse_ms": cells[FUSED].get("median_ms"),
                    "speedup": cells[FUSED].get("speedup"), "na": cells[FUSED].get("na")})
    return out


def batch_dimension(entry: dict) -> str | None:
    """The symbolic dimension that is the batch: `batch`, else the only named one; "" when the
    batch is unnamed (skl2onnx), None when the inputs have no symbolic dimension."""
    named = entry.get("symbolic_dims") or []
    if "batch" in named:
        return "batch"
    if len(named) == 1:
        return named[0]
    unnamed = any(d is None for i in entry["inputs"] for d in i["shape"])
    return "" if unnamed and not named else None


def recorded_batch(entry: dict, batch_dim: str) -> int | None:
    for spec, shape in zip(entry["inputs"], (entry.get("feed_shapes") or {}).values()):
        for declared, size in zip(spec["shape"], shape):
            if declared == batch_dim or (batch_dim == "" and declared is None):
                return size
    return None


# -- reporting ----------------------------------------------------------------------------------

def speedup_text(timing: list[dict], at: str) -> str:
    run = next((t for t in timing if t["at"] == at), None)
    if run is None:
        return "—"
    if run.get("speedup") is None:
        return f"n/a ({(run.get('na') or run.get('error') or '')[:40]})"
    return f"{run['speedup']:.2f}× ({run['label']})"


def verdict_text(row: dict, key: str = "verify") -> str:
    v = row.get(key, {})
    if "skipped" in v:
        return "—"
    if v.get("ok") and v.get("bitwise"):
        return "match, same bits"
    if v.get("ok"):
        outputs = v.get("outputs", [])
        differing, elements = (sum(o.get(k) or 0 for o in outputs) for k in ("differing_elements", "elements"))
        return f"match ({differing:,} of {elements:,} elements differ)"
    if "error" in v:
        return f"error: {v['error'][:60]}"
    worst = next((o for o in v.get("outputs", []) if o["name"] == v.get("worst")), {})
    return f"MISMATCH {v.get('worst')} (max abs {worst.get('max_abs_error')})"


def table(rows: list[dict], timed: bool, markdown: bool = False) -> str:
    header = ["model", "compute nodes", "in kernels", "groups compiled / fell back", "verify", "verify at one"]
    if timed:
        header += ["speedup at inputs", f"speedup at batch {BATCH}", f"speedup at batch {TREE_BATCH}"]
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["model"], "—", "—", "—", r["error"][:80], "—"] + (["—"] * 3 if timed else []))
            continue
        line = [r["model"], str(r["compute_nodes"]), f"{r['fused_compute_nodes']} ({r['fused_fraction']:.0%})",
                f"{r['groups_compiled']} / {r['groups_fallback']}", verdict_text(r), verdict_text(r, "verify_one")]
        if timed:
            timing = r.get("timing", [])
            at = ["inputs", f"batch {BATCH}", f"batch {TREE_BATCH}"]
            line += [speedup_text(timing, a) for a in at] if timing else ["—"] * 3
        out.append(line)
    return render_table(header, out, markdown)


def reasons_text(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        for reason, count in r.get("fallback_reasons", {}).items():
            lines.append(f"- {r['model']}: {count}× {reason}")
    return "Groups that fell back, and why:\n" + ("\n".join(lines) if lines else "- none")


def failed(rows: list[dict]) -> list[str]:
    return [r["model"] for r in rows if "error" in r or not r.get("verify", {}).get("ok")
            or r.get("verify_one", {}).get("ok") is False]


def write_results(rows: list[dict], timed: set[str], command: str, seconds: float, done: bool) -> str:
    """benchmarks/results/corpus.{json,md} for the rows so far; returns the markdown's header."""
    report = {"machine": machine_info(), "command": command, "date": time.strftime("%Y-%m-%d"),
              "seconds": round(seconds, 1), "complete": done, "timed": sorted(timed),
              "timing_options": {**TIMING, "batch": BATCH, "tree_batch": TREE_BATCH},
              "models": rows, "failed": failed(rows)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_text_atomic(RESULTS / "corpus.json", json.dumps(report, indent=1, default=str))
    machine = report["machine"]
    head = (f"{report['date']}, `{command}`, {seconds / 60:.1f} min{'' if done else f' (stopped after {len(rows)} models)'}. "
            f"{machine['cpu']}, {machine['cores']} cores; onnxruntime {machine['onnxruntime']}, TVM "
            f"{machine.get('tvm', '?')}. Compute nodes: all but shape plumbing (docs/report.md); in kernels: those "
            f"inside compiled kernels. Verify: onnxfuse verify on the model's recorded inputs; at one: on them cut to 1 along "
            f"every symbolic dim (— where there is none, or onnxruntime rejects that for the original). Speedup: onnxruntime's "
            f"time / onnxfuse's, median over alternating rounds, 1 thread, IOBinding.")
    write_text_atomic(RESULTS / "corpus.md", "\n\n".join([head, table(rows, bool(timed), markdown=True),
                                                          reasons_text(rows)]) + "\n")
    return head


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="Comma-separated model names (default: the whole corpus).")
    parser.add_argument("--time", action="store_true", help="Also time every model against onnxruntime.")
    parser.add_argument("--time-only", help="Time only these models (comma-separated); verify all.")
    args = parser.parse_args(argv)
    models = corpus_models()
    if args.only:
        wanted = args.only.split(",")
        unknown = [m for m in wanted if m not in models]
        if unknown:
            parser.error(f"not in the corpus: {', '.join(unknown)}")
        models = {m: models[m] for m in wanted}
    timed = set(models) if args.time else set((args.time_only or "").split(",")) & set(models)
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    command = "python benchmarks/corpus.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows = []
    for name, entry in models.items():
        log(f"{name}: optimizing and verifying")
        rows.append(check_model(name, entry, name in timed))
        head = write_results(rows, timed, command.strip(), time.perf_counter() - started,
                             done=len(rows) == len(models))  # after each model: a long run stopped keeps what it did
    timed_any = bool(timed)
    print(head, table(rows, timed_any), reasons_text(rows), sep="\n\n")
    if failed(rows):
        print(f"\nfailed: {', '.join(failed(rows))}")
    print(f"\nwrote {RESULTS / 'corpus.json'} and {RESULTS / 'corpus.md'}")
    return 1 if failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
