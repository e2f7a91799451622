"""`onnxfuse bench`: how fast a model runs under onnxruntime, under onnxfuse, under TVM's own
pipeline (the contenders: measure/contenders.py) and, on request, under IREE and OpenVINO
(measure/peers.py), timed side by side (measure/timing.py).

Every contender gets the same inputs per run: the user's (`--inputs`, resized where `--batch` or
`--dim` say) or random, seeded ones (measure/inputs.py says how sizes and integer ranges are
chosen); onnxfuse's model is optimized first unless given; "n/a (reason)" marks a contender that
could not be timed, and any such contender makes `onnxfuse bench` exit 1.

- Thread counts are fixed per process (TVM reads TVM_NUM_THREADS once, when its pool starts),
  so every thread count is measured in a fresh subprocess; a crash there (e.g. in TVM) becomes
  "n/a" for the contenders of that process instead of killing the whole benchmark.
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx

from .errors import ModelLoadError, OnnxfuseError, UsageError, short_reason
from .fatal_signals import die_promptly_on_fatal_signals
from .measure.contenders import BASELINE, FLOOR, FUSED, TVM, build_tvm, floor_model, ort_contender, tvm_contender
from .measure.inputs import (
    InputSpec,
    check_dim_names,
    dim_values,
    has_free_dims,
    index_limits,
    load_model_skeleton,
    make_feeds,
    model_inputs,
)
from .measure.peers import IREE, OPENVINO, iree_build_worker, not_installed, peer_contenders
from .measure.timing import BUDGET_SECONDS, CHECK_RTOL, ROUND_SECONDS, ROUNDS, Timing, race
from .pipeline import optimize
from .report import render_table


class OutputMismatch(OnnxfuseError):
    """The fused model's outputs differ from the original's: its time would mean nothing."""


# -- one process per thread count ---------------------------------------------------------------

def measure(job: dict) -> dict:
    """Run in a worker process (TVM_NUM_THREADS set by the parent): every run of one model at
    one thread count. Returns {"batches": [{"batch", "contenders": {name: timing json | {"na"}}}]}."""
    reference_path = job["model"]
    specs = model_inputs(reference_path)
    limits = index_limits(load_model_skeleton(reference_path)) if not job.get("inputs") else {}
    call_style = job.get("call_style", "iobinding")
    out = []
    for key, batch in enumerate(job["batches"]):
        feeds = make_feeds(specs, batch, job.get("dims"), job.get("inputs"), job.get("seed", 0), limits)
        baseline = ort_contender(BASELINE, reference_path, feeds, job["threads"], call_style)
        reference = baseline.outputs(baseline.call())
        contenders, not_run = [baseline], {}
        for name, path in job["ort_models"].items():
            try:
                contenders.append(ort_contender(name, path, feeds, job["threads"], call_style, list(reference)))
            except Exception as exc:
                not_run[name] = f"failed: onnxruntime cannot run it: {short_reason(exc)}"
        if job.get("floor_model"):
            floor = ort_contender(FLOOR, job["floor_model"], feeds, job["threads"], call_style)
            contenders.append(replace(floor, checked=False))
        tvm_library = job.get("tvm_libraries", {}).get(str(key))
        if tvm_library:
            try:
                contenders.append(tvm_contender(tvm_library, reference_path, feeds))
            except Exception as exc:
                not_run[TVM] = f"TVM VM failed: {short_reason(exc)}"
        peers, peers_not_run = peer_contenders(job, str(key), feeds)
        contenders += peers
        not_run.update(peers_not_run)
        timings = race(contenders, reference, job["rounds"], job["round_seconds"], job["budget_seconds"])
        cells = {name: (t.to_json() if isinstance(t, Timing) else {"na": t}) for name, t in timings.items()}
        cells.update({name: {"na": why} for name, why in not_run.items()})
        out.append({"batch": batch, "dims": dim_values(specs, feeds), "contenders": cells})
    return {"batches": out}


def run_worker(task: str, job: dict, env: dict[str, str] | None = None, timeout: float | None = None) -> dict:
    """Run `task` ("measure" or "build_tvm") in a fresh Python; {"error": ...} if it died."""
    with tempfile.TemporaryDirectory(prefix="onnxfuse-bench-") as tmp:
        job_file, result_file = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_file.write_text(json.dumps(job))
        try:
            proc = subprocess.run([sys.executable, "-m", "onnxfuse.bench", task, str(job_file), str(result_file)],
                                  env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"took over {timeout:.0f}s"}
        if proc.returncode != 0 or not result_file.is_file():
            return {"error": worker_failure(proc.returncode, proc.stderr)}
        return json.loads(result_file.read_text())


def worker_failure(returncode: int, stderr: str) -> str:
    """One line on a worker that died: the signal that killed it and, from faulthandler's
    traceback, the innermost Python frame; or its exit code and last line of stderr."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        frames = [ln for ln in lines if ln.startswith("File ")]
        return f"worker killed by {name}" + (f" ({frames[0][:200]})" if frames else "")
    return f"worker exited with {returncode}: {lines[-1][:200] if lines else 'no message'}"


def _worker_main(argv: Sequence[str]) -> None:
    die_promptly_on_fatal_signals()
    task, job_file, result_file = argv
    job = json.loads(Path(job_file).read_text())
    if task == "measure":
        result = measure(job)
    elif task == "build_tvm":
        try:
            result = {"seconds": build_tvm(job["model"], job["shapes"], job["library"])}
        except Exception as exc:
            result = {"error": short_reason(exc)}
    elif task == "build_iree":
        result = iree_build_worker(job)
    else:
        raise SystemExit(f"unknown task {task!r}")
    Path(result_file).write_text(json.dumps(result))


# -- a whole model --------------------------------------------------------------------------------

@dataclass
class BenchOptions:
    """batches: one run per value, which every symbolic dimension not in `dims` takes; None keeps
    the sizes of `inputs` (the user's .npz; random inputs when None)."""

    batches: tuple[int | None, ...] = (1, 64, 1000)
    dims: dict[str, int] = field(default_factory=dict)  # named symbolic dimensions, fixed for every run
    inputs: str | None = None
    threads: tuple[int, ...] = (1,)
    rounds: int = ROUNDS
    round_seconds: float = ROUND_SECONDS
    budget_seconds: float = BUDGET_SECONDS
    tvm: bool = True
    cache_dir: str | None = None  # onnxfuse kernel cache; None → onnxfuse's default
    seed: int = 0
    tvm_build_timeout: float = 600.0  # seconds for one TVM build (and one IREE build)
    select: str = "auto"  # onnxfuse's group selection (`optimize --select`); measured times at `batches`
    call_style: str = "iobinding"  # how onnxruntime contenders are called (CALL_STYLES)
    peers: tuple[str, ...] = ()  # other compilers to time too: measure/peers.py PEERS
    floor: bool = False  # also time onnxruntime's call floor (contenders.floor_model), unchecked


@dataclass
class ModelBench:
    """Everything measured for one model, in the shape of the JSON report."""

    name: str
    model: str
    fused: str | None
    compile: dict = field(default_factory=dict)  # optimize seconds, TVM build seconds per batch
    runs: list[dict] = field(default_factory=list)  # {"batch", "threads", "contenders": {...}}
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"name": self.name, "model": self.model, "fused": self.fused, "compile": self.compile,
                "runs": self.runs, "notes": self.notes}


def bench_model(model_path, fused_path=None, options: BenchOptions | None = None,
                extra_models: dict[str, str] | None = None, name: str | None = None, work_dir=None,
                with_fused: bool = True, log=lambda message: None) -> ModelBench:
    """Measure one model: optimize it (unless `fused_path` is given), build it with TVM, time all.

    with_fused=False leaves onnxfuse out (for a model that is itself a reference).
    """
    options = options or BenchOptions()
    model_path = Path(model_path)
    if not model_path.is_file():
        raise ModelLoadError(f"{model_path}: no such model file")
    name = name or model_path.name.removesuffix(".onnx")
    work = Path(work_dir or tempfile.mkdtemp(prefix="onnxfuse-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    result = ModelBench(name, str(model_path), str(fused_path) if fused_path else None)
    specs = model_inputs(model_path)
    check_dim_names(specs, options.dims)
    batches = run_batches(specs, options, result.notes)
    shapes, labels = {}, {}  # per run; making its feeds here also checks --inputs before anything compiles
    for key, batch in enumerate(batches):
        feeds = make_feeds(specs, batch, options.dims, options.inputs, options.seed)
        shapes[key] = {n: list(a.shape) for n, a in feeds.items()}
        labels[key] = batch_label(batch, dim_values(specs, feeds), options)

    ort_models: dict[str, str] = {}
    if with_fused:
        if fused_path is None:
            log(f"{name}: optimizing")
            fused_path, result.compile["optimize"] = _optimize(model_path, work / f"{model_path.stem}.fused.onnx", options)
            result.fused = str(fused_path)
            summary = result.compile["optimize"]
            if summary.get("groups_fallback"):
                result.notes.append(f"onnxfuse: {summary['groups_fallback']} of {summary['groups_total']} groups fell "
                                    f"back to onnxruntime ({summary['fallback_reasons'][0]})")
        ort_models[FUSED] = str(fused_path)
    ort_models.update(extra_models or {})

    tvm_libraries: dict[str, str] = {}
    if options.tvm:
        builds = result.compile.setdefault("tvm_build_seconds", {})
        for key, label in labels.items():
            log(f"{name}: TVM build at {label}")
            library = work / f"{model_path.stem}.tvm.{key}.so"
            built = run_worker("build_tvm", {"model": str(model_path), "shapes": shapes[key], "library": str(library)},
                               timeout=options.tvm_build_timeout)
            if "seconds" in built:
                builds[label] = round(built["seconds"], 3)
                tvm_libraries[str(key)] = str(library)
            else:
                builds[label] = {"na": built["error"]}

    iree_modules = _build_iree(model_path, name, shapes, labels, work, options, result, log)
    floor_path = None
    if options.floor:
        floor_path = work / f"{model_path.stem}.floor.onnx"
        onnx.save_model(floor_model(model_path), str(floor_path))

    for threads in options.threads:
        log(f"{name}: timing at {threads} thread(s), {'; '.join(labels.values())}")
        job = {"model": str(model_path), "ort_models": ort_models, "tvm_libraries": tvm_libraries,
               "batches": list(batches), "dims": options.dims, "inputs": options.inputs, "threads": threads,
               "rounds": options.rounds, "round_seconds": options.round_seconds,
               "budget_seconds": options.budget_seconds, "seed": options.seed, "call_style": options.call_style,
               "peers": list(options.peers), "iree_modules": iree_modules,
               "floor_model": str(floor_path) if floor_path else None}
        # numpy's OpenBLAS pool threads were seen busy in the timing process: keep them out.
        env = {"TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": "1"}
        measured = run_worker("measure", job, env)
        if "error" in measured and (tvm_libraries or options.peers):  # maybe TVM or a peer took it down
            crash = measured["error"]
            measured = run_worker("measure", {**job, "tvm_libraries": {}, "peers": []}, env)
            suspects = ([TVM] if tvm_libraries else []) + list(options.peers)
            for b in measured.get("batches", []):
                b["contenders"].update({s: {"na": f"crashed the benchmark process ({crash})"} for s in suspects})
        if "error" in measured:  # not even onnxruntime on the original ran: nothing to compare with
            raise OnnxfuseError(f"{model_path}: cannot measure at {threads} thread(s): {measured['error']}")
        for key, b in enumerate(measured["batches"]):
            label = labels[key]
            if options.tvm and TVM not in b["contenders"]:
                b["contenders"][TVM] = {"na": f"TVM build failed: {result.compile['tvm_build_seconds'][label]['na']}"}
            if IREE in options.peers and IREE not in b["contenders"]:
                why = result.compile["iree_build_seconds"][label]["na"]
                b["contenders"][IREE] = {"na": why if why.startswith("not installed") else f"IREE build failed: {why}"}
            result.runs.append({"batch": b["batch"], "label": label, "dims": b["dims"], "threads": threads,
                                "contenders": with_speedups(b["contenders"])})
    return result


def _build_iree(model_path: Path, name: str, shapes: dict, labels: dict, work: Path, options: BenchOptions,
                result: ModelBench, log) -> dict[str, str]:
    """IREE's module per run when options.peers asks for IREE (a worker process each, as TVM's
    builds): run key → module path; each run's build seconds or reason in result.compile."""
    if IREE not in options.peers:
        return {}
    builds = result.compile.setdefault("iree_build_seconds", {})
    missing = not_installed(IREE)
    modules = {}
    for key, label in labels.items():
        if missing:
            builds[label] = {"na": missing}
            continue
        log(f"{name}: IREE build at {label}")
        module = work / f"{model_path.stem}.iree.{key}.vmfb"
        built = run_worker("build_iree", {"model": str(model_path), "shapes": shapes[key], "module": str(module)},
                           timeout=options.tvm_build_timeout)
        if "seconds" in built:
            builds[label] = round(built["seconds"], 3)
            modules[str(key)] = str(module)
        else:
            builds[label] = {"na": built["error"]}
    return modules


def run_batches(specs: Sequence[InputSpec], options: BenchOptions, notes: list[str]) -> tuple[int | None, ...]:
    """The batch of each run. A model with no dimension left for the batch runs once."""
    if None in options.batches and options.inputs is None:
        raise UsageError("a run at the inputs' own sizes needs --inputs")
    if has_free_dims(specs, options.dims):
        return tuple(options.batches)
    once = (None,) if options.inputs or has_free_dims(specs) else (_static_batch(specs),)
    if tuple(options.batches) not in (once, (None,)):
        notes.append("every symbolic dimension is set by --dim: measured once" if has_free_dims(specs)
                     else f"static input shapes: measured at batch {once[0]} only")
    return once


def batch_label(batch: int | None, dims: dict[str, int], options: BenchOptions) -> str:
    """What a run's row says: the batch, or the size of each symbolic dimension where --dim or the
    user's inputs chose them ('inputs batch=2, seq=16')."""
    if options.inputs is None and not options.dims and batch is not None:
        return str(batch)
    sizes = ", ".join(f"{k}={v}" for k, v in dims.items()) or (str(batch) if batch is not None else "static")
    return f"inputs {sizes}" if options.inputs else sizes


def _optimize(model_path: Path, out_path: Path, options: BenchOptions) -> tuple[Path, dict]:
    started = time.perf_counter()
    optimized = optimize(model_path, out_path, cache_dir=options.cache_dir or True, select=options.select,
                         threads=options.threads, **_select_batches(options))
    report = optimized.report
    summary = {"seconds": round(time.perf_counter() - started, 3),
               **{k: report[k] for k in ("groups_total", "groups_compiled", "groups_cached", "groups_fallback",
                                         "fused_node_count", "node_count")}}
    reasons = [g["reason"] for g in report["groups"] if g["status"] == "fallback"]
    if reasons:  # the fused model then runs those nodes as plain onnxruntime: the reader must know
        summary["fallback_reasons"] = list(dict.fromkeys(r[:160] for r in reasons))[:3]
    return optimized.model_path, summary


def measure_groups(model_path, options: BenchOptions) -> dict:
    """The report of `optimize --select measured` at the bench's batches and threads, written to a
    temporary directory: each group's kernel and onnxruntime times, bytes moved, the copy bandwidth."""
    with tempfile.TemporaryDirectory(prefix="onnxfuse-groups-") as tmp:
        name = Path(model_path).name.removesuffix(".onnx")
        return optimize(model_path, Path(tmp) / f"{name}.fused.onnx", cache_dir=options.cache_dir or True,
                        select="measured", threads=options.threads, **_select_batches(options)).report


def _select_batches(options: BenchOptions) -> dict:
    """--select measured times kernels at the bench's batches (its default where the inputs set them)."""
    batches = tuple(b for b in options.batches if b is not None)
    return {"select_batches": batches} if batches else {}


def _static_batch(specs: Sequence[InputSpec]) -> int:
    dims = [s.shape[0] for s in specs if s.shape]
    return dims[0] if dims else 1


def with_speedups(cells: dict[str, dict]) -> dict[str, dict]:
    """Add the speedup over onnxruntime to every timed contender: the median of round-by-round
    ratios where both ran in rounds, else onnxruntime ms / contender ms."""
    base = cells.get(BASELINE, {}).get("median_ms")
    for cell in cells.values():
        if "paired_speedup" in cell:
            cell["speedup"] = cell["paired_speedup"]
        elif base and "median_ms" in cell:
            cell["speedup"] = round(base / cell["median_ms"], 3)
    return cells


def fused_refusals(results: Sequence[ModelBench]) -> list[str]:
    """Every run where onnxfuse's outputs differed from the original's."""
    return [f"{r.name} {_run_text(run)}: {run['contenders'][FUSED]['na']}"
            for r in results for run in r.runs
            if str(run["contenders"].get(FUSED, {}).get("na", "")).startswith("refused")]


def not_timed(results: Sequence[ModelBench]) -> list[str]:
    """Every contender that was refused or failed, per run: `onnxfuse bench` then exits 1."""
    return [f"{name} on {r.name} {_run_text(run)}: {cell['na']}"
            for r in results for run in r.runs for name, cell in run["contenders"].items() if "na" in cell]


def _run_text(run: dict) -> str:
    label = run.get("label", str(run["batch"]))
    return f"{'batch ' if label.isdigit() else ''}{label}, {run['threads']} thread(s)"


# -- reporting ----------------------------------------------------------------------------------

def machine_info() -> dict:
    import onnxruntime

    info = {"cpu": _cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__}
    try:
        import tvm

        info["tvm"] = tvm.__version__
    except ImportError:
        pass
    return info


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def contender_order(results: Sequence[ModelBench]) -> list[str]:
    names: dict[str, None] = {}
    for r in results:
        for run in r.runs:
            names.update(dict.fromkeys(run["contenders"]))
    fixed = [n for n in (BASELINE, FUSED, TVM, IREE, OPENVINO) if n in names]
    return fixed + [n for n in names if n not in fixed]


NOT_BITWISE = "≠"  # marks a contender whose outputs matched onnxruntime's within tolerance only


def format_cell(cell: dict, baseline: bool = False) -> str:
    """'1.234 (1.50×)'; '≈' marks a single timed call (too slow for rounds), a trailing '≠'
    outputs that match onnxruntime's within tolerance but not bit for bit."""
    if "median_ms" not in cell:
        return f"n/a ({cell.get('na', 'not run')})"
    ms = ("≈" if cell.get("rounds") == 1 else "") + _fmt_ms(cell["median_ms"])
    text = ms if baseline or "speedup" not in cell else f"{ms} ({cell['speedup']:.2f}×)"
    return text + (f" {NOT_BITWISE}" if cell.get("bitwise_equal") is False else "")


def bitwise_legend(results: Sequence[ModelBench]) -> str | None:
    """The line that explains '≠', when a table shows one."""
    if any(cell.get("bitwise_equal") is False for r in results for run in r.runs for cell in run["contenders"].values()):
        return (f"{NOT_BITWISE}: outputs within tolerance of onnxruntime's on the original model (rtol {CHECK_RTOL:g}), "
                f"not bit for bit")
    return None


def format_table(results: Sequence[ModelBench], markdown: bool = False, na_width: int = 60) -> str:
    """One row per model × batch × threads; ms per call (median), ratio = onnxruntime / contender."""
    names = contender_order(results)
    header = ["model", "batch", "thr", *[f"{n} ms" for n in names]]
    rows = []
    for r in results:
        for run in r.runs:
            cells = [format_cell(run["contenders"].get(n, {"na": "—"}), n == BASELINE) for n in names]
            cells = [c if len(c) <= na_width else c[: na_width - 2] + "…)" for c in cells]
            cells = ["" if c == "n/a (—)" else c for c in cells]
            rows.append([r.name, run.get("label", str(run["batch"])), str(run["threads"]), *cells])
    legend = bitwise_legend(results)
    table = render_table(header, rows, markdown)
    return table if legend is None else table + ("\n\n" if markdown else "\n") + legend


def format_compile_table(results: Sequence[ModelBench], markdown: bool = False) -> str:
    with_iree = any("iree_build_seconds" in r.compile for r in results)
    header = ["model", "onnxfuse optimize s", "groups (fused/total nodes)", "TVM build s per batch",
              *(["IREE build s per batch"] if with_iree else [])]
    rows = []
    for r in results:
        opt = r.compile.get("optimize")
        cached = f" ({opt['groups_cached']} cached)" if opt and opt.get("groups_cached") else ""
        opt_s = f"{opt['seconds']:.1f}{cached}" if opt else "—"
        groups = (f"{opt['groups_total']} ({opt['fused_node_count']}/{opt['node_count']})" if opt else "—")
        builds = [_build_seconds(r.compile.get("tvm_build_seconds", {}))]
        if with_iree:
            builds.append(_build_seconds(r.compile.get("iree_build_seconds", {})))
        rows.append([r.name, opt_s, groups, *builds])
    return render_table(header, rows, markdown)


def _build_seconds(builds: dict) -> str:
    return ", ".join(f"{_short(b)}: {v:.1f}" if isinstance(v, (int, float)) else f"{_short(b)}: n/a"
                     for b, v in builds.items()) or "—"


def report_json(results: Sequence[ModelBench], options: BenchOptions, extra: dict | None = None) -> dict:
    return {"machine": machine_info(), "options": {"batches": list(options.batches), "dims": options.dims,
                                                   "inputs": options.inputs, "threads": list(options.threads),
                                                   "rounds": options.rounds, "round_seconds": options.round_seconds,
                                                   "tvm": options.tvm, "call_style": options.call_style,
                                                   "peers": list(options.peers)},
            "ratio": "speedup = median over rounds of onnxruntime's time / the contender's in the same round "
                     "(onnxruntime median ms / contender median ms where either ran only once)",
            "models": [r.to_json() for r in results], **(extra or {})}


def _short(label: str) -> str:
    return f"b{label}" if label.isdigit() else label


def _fmt_ms(ms: float) -> str:
    return f"{ms:.4f}" if ms < 0.1 else f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
