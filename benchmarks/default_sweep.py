"""The default against onnxruntime on every model we have (`make bench-default`, docs/selection.md).

    python benchmarks/default_sweep.py                     # bundled, corpus and light models
    python benchmarks/default_sweep.py --sets bundled      # one set (bundled, corpus, light)
    python benchmarks/default_sweep.py --only lstm_cell,hb_xgb_gemm

Each model is optimized with the default options (`--select auto`; kernels cached in
.cache/sweep-kernels), then timed with onnxfuse.bench at 1 thread (IOBinding, alternating
rounds) at batch 1, 64 and 1000 where its batch is symbolic (a corpus model keeps its recorded
inputs, resized along the batch; a static model runs once at its own shape). Three contenders
take turns: onnxruntime on the original, onnxfuse's model, and onnxruntime on the original again
in a second session (the A/A control: how far two identical contenders drift apart here).

Per run it prints the speedup (the median over rounds of onnxruntime's time / onnxfuse's in the
same round) with its 95% band (measure/timing.median_interval), and the A/A control's. A run
is *slower* when the whole band is under 1 by more than the A/A control is off 1; such runs are
timed once more and stay flagged only if the repeat agrees. Results go to
benchmarks/results/default_sweep.{json,md}; exit 1 if any run stays slower.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxfuse import optimize  # noqa: E402
from onnxfuse.atomic import write_text_atomic  # noqa: E402
from onnxfuse.bench import BenchOptions, bench_model, machine_info  # noqa: E402
from onnxfuse.errors import OnnxfuseError, short_reason  # noqa: E402
from onnxfuse.measure.contenders import BASELINE, FUSED  # noqa: E402
from onnxfuse.report import render_table  # noqa: E402

MODELS = ROOT / "models"
CORPUS = MODELS / "exported"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESULTS = ROOT / "benchmarks" / "results"
KERNELS = ROOT / ".cache" / "sweep-kernels"
WORK = ROOT / ".cache" / "sweep-work"
BATCHES = (1, 64, 1000)
CONTROL = "onnxruntime again"  # the original in a second session: the A/A control
TIMING = dict(threads=(1,), rounds=15, budget_seconds=8.0, tvm=False, cache_dir=str(KERNELS))
SETS = ("bundled", "corpus", "light")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- which models, at which sizes -----------------------------------------------------------------

def bundled_models() -> dict[str, dict]:
    return {p.stem: {"path": p} for p in sorted(MODELS.glob("*.onnx"))}


def corpus_models() -> dict[str, dict]:
    entries = json.loads((CORPUS / "manifest.json").read_text())["models"]
    return {name: {"path": CORPUS / e["file"], "inputs": CORPUS / e["inputs_file"], "entry": e}
            for name, e in sorted(entries.items()) if e.get("status") == "ok"}


def light_models() -> dict[str, dict]:
    return {p.stem: {"path": p} for p in sorted(LIGHT.glob("*.onnx"))}


def runs_of(model: dict, batches: tuple[int, ...]) -> list[tuple[str, BenchOptions]]:
    """(label, bench options) per timed size: bundled and light models take the batches (bench
    runs a static model once); a corpus model keeps its recorded inputs, with its batch
    dimension resized to each batch (its other symbolic dims keep their recorded sizes)."""
    if "entry" not in model:
        return [("batches", BenchOptions(batches=batches, **TIMING))]
    inputs, batch_dim = str(model["inputs"]), batch_dimension(model["entry"])
    if batch_dim is None:
        return [("inputs", BenchOptions(batches=(None,), inputs=inputs, **TIMING))]
    if batch_dim == "":  # unnamed batch: every unnamed dim takes the batch
        return [(str(b), BenchOptions(batches=(b,), inputs=inputs, **TIMING)) for b in batches]
    return [(str(b), BenchOptions(batches=(None,), dims={batch_dim: b}, inputs=inputs, **TIMING)) for b in batches]


def batch_dimension(entry: dict) -> str | None:
    """The corpus model's batch dimension: `batch`, else its only named one, "" for an unnamed
    batch, None when its inputs are static (the same rule as benchmarks/corpus.py)."""
    named = entry.get("symbolic_dims") or []
    if "batch" in named:
        return "batch"
    if len(named) == 1:
        return named[0]
    unnamed = any(d is None for i in entry["inputs"] for d in i["shape"])
    return "" if unnamed and not named else None


# -- one model ------------------------------------------------------------------------------------

def sweep_model(name: str, model: dict, batches: tuple[int, ...], confirm: bool) -> dict:
    """Optimize with the defaults, then time every size; slower runs are timed once more."""
    path = model["path"]
    fused = WORK / f"{name}.fused.onnx"
    row: dict = {"model": name, "runs": []}
    started = time.perf_counter()
    try:
        report = optimize(path, fused, cache_dir=str(KERNELS)).report
    except OnnxfuseError as exc:
        return {**row, "error": f"optimize: {short_reason(exc)}"}
    row.update(optimize_seconds=round(time.perf_counter() - started, 1),
               kernels=report["groups_compiled"] + report["groups_cached"], groups=report["groups_total"])
    for label, options in runs_of(model, batches):
        for run in time_runs(name, path, fused, options, label):
            if confirm and run.get("verdict") == "slower":
                log(f"{name} {run['label']}: slower, timing it again")
                again = next((r for r in time_runs(name, path, fused, options_for(options, run), label)
                              if r["label"] == run["label"]), None)
                run = {**run, "repeat": again}
                if again is not None and again.get("verdict") != "slower":
                    run["verdict"] = "unsure"  # one timing said slower, the repeat did not
            row["runs"].append(run)
    return row


def options_for(options: BenchOptions, run: dict) -> BenchOptions:
    """The options of one run alone (a bundled model's batch of that run)."""
    if options.inputs is None and run.get("batch") is not None:
        return BenchOptions(**{**options.__dict__, "batches": (run["batch"],)})
    return options


def time_runs(name: str, path: Path, fused: Path, options: BenchOptions, label: str) -> list[dict]:
    log(f"{name}: timing at {label}")
    try:
        result = bench_model(path, fused, options, extra_models={CONTROL: str(path)}, name=name,
                             work_dir=WORK / "bench")
    except OnnxfuseError as exc:
        return [{"label": label, "error": short_reason(exc)}]
    return [judge_run(run) for run in result.runs]


def judge_run(run: dict) -> dict:
    """The run's speedup, band, the A/A control's, and the verdict (slower / not slower)."""
    cells = run["contenders"]
    fused, control = cells.get(FUSED, {}), cells.get(CONTROL, {})
    out = {"label": run.get("label", str(run["batch"])), "batch": run["batch"], "dims": run.get("dims"),
           "onnxruntime_ms": cells.get(BASELINE, {}).get("median_ms"), "onnxfuse_ms": fused.get("median_ms"),
           "speedup": fused.get("speedup"), "band": fused.get("paired_band"),
           "control": control.get("speedup"), "control_band": control.get("paired_band")}
    if "na" in fused:
        return {**out, "na": fused["na"], "verdict": "n/a"}
    out["verdict"] = verdict(out["speedup"], out["band"], out["control"])
    return out


def verdict(speedup: float | None, band, control: float | None) -> str:
    """'slower' when the speedup's whole band lies under 1 by more than the A/A control is off 1
    (two identical sessions drift a few % apart here); 'faster' when it lies above 1 by as much;
    else 'par'. A run timed once (no band) is judged on its speedup alone."""
    if speedup is None:
        return "n/a"
    drift = abs(1 - control) if control else 0.0
    lo, hi = band if band else (speedup, speedup)
    if hi < 1 - drift:
        return "slower"
    if lo > 1 + drift:
        return "faster"
    return "par"


# -- reporting ------------------------------------------------------------------------------------

def speedup_text(speedup, band) -> str:
    if speedup is None:
        return "—"
    return f"{speedup:.2f}× [{band[0]:.2f}, {band[1]:.2f}]" if band else f"{speedup:.2f}× (1 call)"


def table(rows: list[dict], markdown: bool = False) -> str:
    header = ["model", "batch", "kernels/groups", "onnxruntime ms", "onnxfuse ms", "speedup [95% band]",
              "A/A control", "verdict"]
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["model"], "—", "—", "—", "—", "—", "—", r["error"][:80]])
            continue
        for run in r["runs"]:
            kernels = f"{r['kernels']}/{r['groups']}"
            if "error" in run:
                out.append([r["model"], run["label"], kernels, "—", "—", "—", "—", f"n/a: {run['error'][:60]}"])
                continue
            ms = [f"{v:.4g}" if v is not None else "—" for v in (run["onnxruntime_ms"], run["onnxfuse_ms"])]
            verdict_text = run["verdict"] if "na" not in run else f"n/a: {run['na'][:60]}"
            if run.get("verdict") == "slower":
                verdict_text = "**SLOWER**" if markdown else "SLOWER"
            out.append([r["model"], run["label"], kernels, *ms, speedup_text(run["speedup"], run["band"]),
                        speedup_text(run["control"], run["control_band"]), verdict_text])
    return render_table(header, out, markdown)


def slower_runs(rows: list[dict]) -> list[str]:
    return [f"{r['model']} at {run['label']}" for r in rows for run in r.get("runs", [])
            if run.get("verdict") == "slower"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help=f"Comma-separated sets of models ({', '.join(SETS)}).")
    parser.add_argument("--only", help="Comma-separated model names (from any set).")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="Batch sizes (symbolic models).")
    parser.add_argument("--no-confirm", action="store_true", help="Do not time slower runs again.")
    parser.add_argument("--out", default="default_sweep", help="Name of the result files in benchmarks/results/.")
    args = parser.parse_args(argv)
    sets = {"bundled": bundled_models, "corpus": corpus_models, "light": light_models}
    chosen = args.sets.split(",")
    if unknown := [s for s in chosen if s not in sets]:
        parser.error(f"unknown sets: {', '.join(unknown)}")
    models = {name: m for s in chosen for name, m in sets[s]().items()}
    if args.only:
        wanted = args.only.split(",")
        every = {name: m for s in SETS for name, m in sets[s]().items()}
        if unknown := [m for m in wanted if m not in every]:
            parser.error(f"no such model: {', '.join(unknown)}")
        models = {m: every[m] for m in wanted}
    batches = tuple(int(b) for b in args.batches.split(","))
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = []
    for name, model in models.items():
        rows.append(sweep_model(name, model, batches, not args.no_confirm))
        log(f"{name}: " + ", ".join(f"{r['label']} {r.get('speedup') or 'n/a'} {r.get('verdict', r.get('error', ''))}"
                                    for r in rows[-1].get("runs", [])) or rows[-1].get("error", ""))
    seconds = time.perf_counter() - started
    command = "python benchmarks/default_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    report = {"machine": machine, "command": command.strip(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "seconds": round(seconds, 1), "timing": {**TIMING, "batches": batches}, "models": rows,
              "slower": slower_runs(rows)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_text_atomic(RESULTS / f"{args.out}.json", json.dumps(report, indent=1, default=str))
    head = (f"{report['date']}, `{report['command']}`, {seconds / 60:.1f} min. {machine['cpu']}, {machine['cores']} "
            f"cores; onnxruntime {machine['onnxruntime']}, TVM {machine.get('tvm', '?')}. 1 thread, IOBinding, "
            f"up to {TIMING['rounds']} alternating rounds. Speedup: onnxruntime's time / onnxfuse's, median over "
            f"rounds, with its 95% band; A/A control: the original against itself in a second session.")
    write_text_atomic(RESULTS / f"{args.out}.md", "\n\n".join([head, table(rows, markdown=True)]) + "\n")
    print(head, table(rows), sep="\n\n")
    if report["slower"]:
        print(f"\nslower than onnxruntime beyond noise: {', '.join(report['slower'])}")
    return 1 if report["slower"] else 0


if __name__ == "__main__":
    sys.exit(main())
