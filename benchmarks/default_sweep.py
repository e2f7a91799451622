"""The default against onnxruntime on every model we have (`make bench-default`, docs/selection.md).

    python benchmarks/default_sweep.py                     # bundled, corpus and light models
    python benchmarks/default_sweep.py --sets bundled      # one set (bundled, corpus, light)
    python benchmarks/default_sweep.py --only lstm_cell,hb_xgb_gemm

Each model is optimized with the default options (`--select auto`; kernels cached in
.cache/sweep-kernels), then timed at 1 thread with onnxfuse.bench's contenders (IOBinding,
outputs checked first) in alternating rounds, each round timed by the calling thread's CPU time
(measure/timing.round_clock: at 1 thread every node runs there, and other jobs' time on the core
is left out), at batch 1, 64 and 1000 where its batch is symbolic (a corpus model keeps its
recorded inputs, resized along the batch; a static model runs once at its own shape). Three
contenders take turns: onnxruntime on the original, onnxfuse's model, and onnxruntime on the
original again in a second session (the A/A control: how far two identical contenders drift
apart here).

Per run it prints the speedup (the median over rounds of onnxruntime's time / onnxfuse's in the
same round) with its 95% band (measure/timing.median_interval), and the A/A control's. A run
is *slower* when its whole band lies under 1 and under the A/A control's band (see verdict);
such runs are timed once more and stay flagged only if the repeat agrees. Results go to
benchmarks/results/default_sweep.{json,md}; exit 1 if any run stays slower.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's pool threads were seen busy while timing

import onnx  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from onnxfuse import optimize  # noqa: E402
from onnxfuse.atomic import write_text_atomic  # noqa: E402
from onnxfuse.bench import machine_info, with_speedups  # noqa: E402
from onnxfuse.errors import OnnxfuseError, short_reason  # noqa: E402
from onnxfuse.measure.contenders import BASELINE, FUSED, ort_contender  # noqa: E402
from onnxfuse.measure.inputs import (  # noqa: E402
    dim_values,
    has_free_dims,
    index_limits,
    load_model_skeleton,
    make_feeds,
    model_inputs,
)
from onnxfuse.measure.timing import Timing, race, round_clock  # noqa: E402
from onnxfuse.report import render_table  # noqa: E402

MODELS = ROOT / "models"
CORPUS = MODELS / "exported"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESULTS = ROOT / "benchmarks" / "results"
KERNELS = ROOT / ".cache" / "sweep-kernels"
WORK = ROOT / ".cache" / "sweep-work"
BATCHES = (1, 64, 1000)
CONTROL = "onnxruntime again"  # the original in a second session: the A/A control
TIMING = dict(rounds=15, round_seconds=0.02, budget_seconds=8.0)
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


def sizes_of(model: dict, batches: tuple[int, ...]) -> list[tuple[str, int | None, dict, str | None]]:
    """(label, batch, dims, inputs file) per timed size: bundled and light models take random
    inputs at each batch (a static model runs once, at its own shape); a corpus model keeps its
    recorded inputs, its batch dimension resized to each batch (other symbolic dims keep their
    recorded sizes)."""
    if "entry" not in model:
        if not has_free_dims(model_inputs(model["path"])):
            return [("static", None, {}, None)]
        return [(str(b), b, {}, None) for b in batches]
    inputs, batch_dim = str(model["inputs"]), batch_dimension(model["entry"])
    if batch_dim is None:
        return [("inputs", None, {}, inputs)]
    if batch_dim == "":  # unnamed batch: every unnamed dim takes the batch
        return [(str(b), b, {}, inputs) for b in batches]
    return [(str(b), None, {batch_dim: b}, inputs) for b in batches]


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

def sweep_model(name: str, model: dict, batches: tuple[int, ...], confirm: bool, select: str = "auto") -> dict:
    """Optimize with the defaults (or `select`), then time every size; slower runs are timed once more."""
    path = model["path"]
    fused = WORK / f"{name}.fused.onnx"
    row: dict = {"model": name, "runs": []}
    started = time.perf_counter()
    try:
        options = {} if select == "auto" else {"select": select, "select_batches": batches}
        report = optimize(path, fused, cache_dir=str(KERNELS), **options).report
    except OnnxfuseError as exc:
        return {**row, "error": f"optimize: {short_reason(exc)}"}
    row.update(optimize_seconds=round(time.perf_counter() - started, 1),
               kernels=report["groups_compiled"] + report["groups_cached"], groups=report["groups_total"])
    for size in sizes_of(model, batches):
        log(f"{name}: timing at {size[0]}")
        run = time_size(path, fused, *size)
        if confirm and run.get("verdict") == "slower":
            log(f"{name} {run['label']}: slower, timing it again")
            again = time_size(path, fused, *size)
            run = {**run, "repeat": again}
            if again.get("verdict") != "slower":
                run["verdict"] = "unsure"  # one timing said slower, the repeat did not
        row["runs"].append(run)
    return row


def time_size(path: Path, fused: Path, label: str, batch: int | None, dims: dict, inputs: str | None) -> dict:
    """onnxruntime, onnxfuse and the A/A control at one size, 1 thread, in alternating rounds
    timed by the calling thread's CPU time (measure/timing.round_clock)."""
    specs = model_inputs(path)
    limits = index_limits(load_model_skeleton(path)) if inputs is None else {}
    try:
        feeds = make_feeds(specs, batch, dims, inputs, 0, limits)
        baseline = ort_contender(BASELINE, path, feeds, 1)
        reference = baseline.outputs(baseline.call())
    except Exception as exc:  # e.g. a model whose declared outputs fix the batch
        return {"label": label, "error": f"onnxruntime cannot run the original here: {short_reason(exc, 160)}"}
    contenders, cells = [baseline], {}
    for name, model_path in ((FUSED, fused), (CONTROL, path)):
        try:
            contenders.append(ort_contender(name, model_path, feeds, 1, reference_outputs=list(reference)))
        except Exception as exc:
            cells[name] = {"na": f"failed: {short_reason(exc, 160)}"}
    timings = race(contenders, reference, **TIMING, clock=round_clock(1))
    cells.update({name: (t.to_json() if isinstance(t, Timing) else {"na": t}) for name, t in timings.items()})
    sizes = dim_values(specs, feeds)
    run = {"batch": batch, "label": ", ".join(f"{k}={v}" for k, v in sizes.items()) or label,
           "contenders": with_speedups(cells)}
    return judge_run(run)


def judge_run(run: dict) -> dict:
    """The run's speedup, band, the A/A control's, and the verdict (slower / not slower)."""
    cells = run["contenders"]
    fused, control = cells.get(FUSED, {}), cells.get(CONTROL, {})
    out = {"label": run["label"], "batch": run["batch"],
           "onnxruntime_ms": cells.get(BASELINE, {}).get("median_ms"), "onnxfuse_ms": fused.get("median_ms"),
           "speedup": fused.get("speedup"), "band": fused.get("paired_band"),
           "control": control.get("speedup"), "control_band": control.get("paired_band")}
    if "na" in fused:
        return {**out, "na": fused["na"], "verdict": "n/a"}
    out["verdict"] = verdict(out["speedup"], out["band"], out["control"], out["control_band"])
    return out


def verdict(speedup: float | None, band, control: float | None, control_band=None) -> str:
    """'slower' when the speedup's whole band lies under 1 and under the A/A control's band (slower
    than either onnxruntime session beyond both bands); 'faster' when it lies above both; else
    'par'. The control shows how far the baseline itself is off: at microseconds, by the wall
    clock, one session of a model ran up to 4x faster than a second one of the very same model
    for a while (branchy_cell_ts at batch 1: 10 us vs 40 us). A run too slow for rounds (one
    call each, no band) is not judged: '1 call'."""
    if speedup is None:
        return "n/a"
    if not band:
        return "1 call"  # too slow for rounds: one call each, no band to judge by
    lo, hi = band
    control_lo, control_hi = control_band if control_band else (control or 1.0, control or 1.0)
    if hi < min(1.0, control_lo):
        return "slower"
    if lo > max(1.0, control_hi):
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


def rejudged(rows: list[dict]) -> list[dict]:
    """Saved rows with every verdict taken again by the current rule (a run and its repeat)."""
    for row in rows:
        for run in row.get("runs", []):
            if "speedup" not in run or "na" in run:
                continue
            run["verdict"] = verdict(run["speedup"], run["band"], run["control"], run["control_band"])
            again = run.get("repeat")
            if again and "speedup" in again and "na" not in again:
                again["verdict"] = verdict(again["speedup"], again["band"], again["control"], again["control_band"])
                if run["verdict"] == "slower" and again["verdict"] != "slower":
                    run["verdict"] = "unsure"
    return rows


def slower_runs(rows: list[dict]) -> list[str]:
    return [f"{r['model']} at {run['label']}" for r in rows for run in r.get("runs", [])
            if run.get("verdict") == "slower"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help=f"Comma-separated sets of models ({', '.join(SETS)}).")
    parser.add_argument("--only", help="Comma-separated model names (from any set).")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="Batch sizes (symbolic models).")
    parser.add_argument("--no-confirm", action="store_true", help="Do not time slower runs again.")
    parser.add_argument("--select", default="auto", help="optimize --select (default: the default, auto); "
                                                         "measured selects at --batches.")
    parser.add_argument("--out", default="default_sweep", help="Name of the result files in benchmarks/results/.")
    parser.add_argument("--render", help="Comma-separated result JSON files of earlier sweeps: print them as one "
                                         "table (a model in a later file replaces it in an earlier one), verdicts "
                                         "taken again (no timing).")
    args = parser.parse_args(argv)
    if args.render:
        return render([Path(f) for f in args.render.split(",")], args.out)
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
    if not models:
        parser.error("no model to sweep")
    batches = tuple(int(b) for b in args.batches.split(","))
    WORK.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = []
    command = "python benchmarks/default_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name, model in models.items():
        rows.append(sweep_model(name, model, batches, not args.no_confirm, args.select))
        log(f"{name}: " + ", ".join(f"{r['label']} {r.get('speedup') or 'n/a'} {r.get('verdict', r.get('error', ''))}"
                                    for r in rows[-1].get("runs", [])) or rows[-1].get("error", ""))
        seconds = time.perf_counter() - started
        report = {"machine": machine, "command": command.strip(),
                  "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": round(seconds, 1),
                  "timing": {**TIMING, "batches": batches}, "models": rows, "slower": slower_runs(rows)}
        write_text_atomic(RESULTS / f"{args.out}.json", json.dumps(report, indent=1, default=str))  # after each model
    head = (f"{report['date']}, `{report['command']}`, {seconds / 60:.1f} min. {machine['cpu']}, {machine['cores']} "
            f"cores; onnxruntime {machine['onnxruntime']}, TVM {machine.get('tvm', '?')}. 1 thread, IOBinding, "
            f"up to {TIMING['rounds']} alternating rounds. Speedup: onnxruntime's time / onnxfuse's, median over "
            f"rounds, with its 95% band; A/A control: the original against itself in a second session.")
    write_text_atomic(RESULTS / f"{args.out}.md", "\n\n".join([head, table(rows, markdown=True)]) + "\n")
    print(head, table(rows), sep="\n\n")
    if report["slower"]:
        print(f"\nslower than onnxruntime beyond noise: {', '.join(report['slower'])}")
    return 1 if report["slower"] else 0


def render(files: list[Path], out: str) -> int:
    reports = [json.loads(f.read_text()) for f in files]
    latest = {row["model"]: row for r in reports for row in r["models"]}  # a later sweep of a model replaces it
    rows = rejudged(list(latest.values()))
    head = "\n".join(f"{r['date']}, `{r['command']}`, {r['seconds'] / 60:.1f} min." for r in reports)
    machine = reports[0]["machine"]
    head += (f"\n{machine['cpu']}, {machine['cores']} cores; onnxruntime {machine['onnxruntime']}, TVM "
             f"{machine.get('tvm', '?')}. 1 thread, IOBinding, up to {reports[0]['timing']['rounds']} alternating rounds.")
    write_text_atomic(RESULTS / f"{out}.md", "\n\n".join([head, table(rows, markdown=True)]) + "\n")
    print(head, table(rows), sep="\n\n")
    slower = slower_runs(rows)
    if slower:
        print(f"\nslower than onnxruntime beyond noise: {', '.join(slower)}")
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
