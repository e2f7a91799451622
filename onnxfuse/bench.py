"""Measuring: how fast a model runs under onnxruntime, under onnxfuse, and under TVM's own pipeline.

Contenders (each gets the same random, seeded inputs per batch size):
  onnxruntime  the original model, ORT_ENABLE_ALL (the baseline every ratio is taken against)
  onnxfuse     onnxfuse's fused model in onnxruntime (optimized first unless given)
  tvm          TVM's own pipeline on the original model (from_onnx with the batch bound,
               the default Relax pipeline, the VM); "n/a (reason)" where it cannot run
  extras       further ORT models the caller names (e.g. the same forest as a TreeEnsemble)

Why the measurement is shaped this way:
- Contenders are timed in alternating rounds and we report the median (p10/p90 for spread) of
  the rounds; each round starts once the previous contender's pool threads (TVM's spin after a
  call) have gone idle (idle.py), so no contender runs beside another one's spin. onnxruntime
  sessions run with spinning off (timing_session_options says why).
- A contender is timed only after its outputs matched the original's: a fast wrong answer is
  not a result. A mismatching contender is refused (reported, never timed).
- Thread counts are fixed per process (TVM reads TVM_NUM_THREADS once, when its pool starts),
  so every thread count is measured in a fresh subprocess; a crash there (e.g. in TVM) becomes
  "n/a" for the contenders of that process instead of killing the whole benchmark.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import idle
from .errors import OnnxfuseError, without_source_location

BASELINE = "onnxruntime"
FUSED = "onnxfuse"
TVM = "tvm"

ROUNDS = 15
ROUND_SECONDS = 0.02  # each contender runs about this long per round
BUDGET_SECONDS = 20.0  # a slow model gets fewer rounds (never fewer than MIN_ROUNDS) to stay near this
MIN_ROUNDS = 5
CHECK_RTOL, CHECK_ATOL, CHECK_NORM_RTOL = 1e-3, 1e-4, 1e-4


class OutputMismatch(OnnxfuseError):
    """The fused model's outputs differ from the original's: its time would mean nothing."""


# -- the timer ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timing:
    """Seconds per call over the rounds: the median, and p10/p90 for the spread. paired_speedup:
    the median over rounds of the first contender's time over this one's in the same round."""

    median: float
    p10: float
    p90: float
    rounds: int
    calls_per_round: int
    paired_speedup: float | None = None

    def to_json(self) -> dict:
        out = {"median_ms": _ms(self.median), "p10_ms": _ms(self.p10), "p90_ms": _ms(self.p90),
               "rounds": self.rounds, "calls_per_round": self.calls_per_round}
        if self.paired_speedup is not None:
            out["paired_speedup"] = round(self.paired_speedup, 3)
        return out


@dataclass
class Contender:
    """One way to compute the model. `call()` is what gets timed; `outputs(result)` turns one
    call's result into numpy outputs by name, for the check only (so conversions are not timed)."""

    name: str
    call: Callable[[], Any]
    outputs: Callable[[Any], dict[str, np.ndarray]] = lambda result: result
    checked: bool = True  # False: a yardstick computing something else (a model's MatMuls alone), timed unchecked


def check_outputs(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> str | None:
    """None if `actual` matches `reference` on every output they share (by name), else why not.

    Outputs are matched by name so that a model with the same outputs in another order (or an
    extra output) can still be compared; sharing no output at all is a mismatch.
    """
    from .verify import compare_arrays

    shared = [name for name in reference if name in actual]
    if not shared:
        return f"no output in common with the original (has {sorted(actual)}, expected {sorted(reference)})"
    for name in shared:
        cmp = compare_arrays(name, np.asarray(reference[name]), np.asarray(actual[name]),
                             CHECK_RTOL, CHECK_ATOL, CHECK_NORM_RTOL)
        if not cmp.ok:
            return f"output {name} differs from the original (max abs error {cmp.max_abs_error:.3g})"
    return None


def race(contenders: Sequence[Contender], reference: dict[str, np.ndarray], rounds: int = ROUNDS,
         round_seconds: float = ROUND_SECONDS, budget_seconds: float = BUDGET_SECONDS) -> dict[str, Timing | str]:
    """Check every contender against `reference` (but those with checked=False), then time the ones
    that match in alternating rounds.

    Returns contender name → Timing, or → the reason it was not timed (failed or differed).
    """
    results: dict[str, Timing | str] = {}
    timed: list[tuple[Contender, int]] = []
    round_cost = 0.0
    for contender in contenders:
        try:
            result = contender.call()  # also the warm-up
            mismatch = check_outputs(reference, contender.outputs(result)) if contender.checked else None
            if mismatch is not None:
                results[contender.name] = f"refused: {mismatch}"
                continue
            start = time.perf_counter()
            contender.call()
            once = max(time.perf_counter() - start, 1e-7)
        except Exception as exc:
            results[contender.name] = f"failed: {_short_reason(exc)}"
            continue
        if once * MIN_ROUNDS > budget_seconds:  # too slow for rounds: its one timed call is the result
            results[contender.name] = Timing(once, once, once, rounds=1, calls_per_round=1)
            continue
        reps = calls_per_round(once, round_seconds)
        timed.append((contender, reps))
        round_cost += reps * once
    rounds = max(min(rounds, MIN_ROUNDS), min(rounds, int(budget_seconds / max(round_cost, 1e-9))))

    samples = alternating_rounds([c.call for c, _ in timed], [reps for _, reps in timed], rounds)
    # Ratios are taken round by round against the first contender (the baseline) when it was timed
    # in rounds too: a VM that slows down for a few rounds then slows both sides of each ratio.
    baseline = samples[0] if timed and timed[0][0] is contenders[0] else None
    for (contender, reps), s in zip(timed, samples):
        p10, p90 = np.percentile(s, [10, 90])
        paired = statistics.median(b / x for b, x in zip(baseline, s)) if baseline is not None else None
        results[contender.name] = Timing(statistics.median(s), float(p10), float(p90), rounds, reps, paired)
    return {c.name: results[c.name] for c in contenders}


def calls_per_round(once: float, round_seconds: float) -> int:
    """How many calls of `once` seconds fill one round (at least 1, at most 10,000)."""
    return max(1, min(10_000, int(round_seconds / max(once, 1e-7))))


def alternating_rounds(calls: Sequence[Callable[[], object]], reps: Sequence[int], rounds: int,
                       wait_until_idle: Callable[[], object] = idle.wait_until_idle) -> list[list[float]]:
    """Seconds per call of each of `calls`, one sample per round, the calls taking turns.

    Taking turns matters: a slow phase of the machine then slows every contender alike, and
    caches stay warm for whoever runs next. The order flips every round (a b, b a, a b, ...), so
    no contender always runs right after the same other one. Each contender's round starts once
    the previous one's pool threads have stopped spinning (idle.wait_until_idle): TVM's pool
    spins after every call, and a spinning neighbour would take a core from the next round.
    """
    samples: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for k in order:
            call = calls[k]
            if len(calls) > 1:
                wait_until_idle()
            start = time.perf_counter()
            for _ in range(reps[k]):
                call()
            samples[k].append((time.perf_counter() - start) / reps[k])
    return samples


# -- inputs -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str
    shape: tuple  # ints, or strings/None for symbolic dimensions

    def concrete(self, batch: int) -> tuple[int, ...]:
        """Symbolic (batch) dimensions take `batch`."""
        return tuple(d if isinstance(d, int) and d > 0 else batch for d in self.shape)


def model_inputs(model_path) -> list[InputSpec]:
    """The model's real inputs (initializers listed as inputs by old IR versions excluded)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    weights = {t.name for t in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in weights:
            continue
        tensor = value.type.tensor_type
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        specs.append(InputSpec(value.name, onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name, dims))
    return specs


def random_inputs(specs: Sequence[InputSpec], batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded per batch size: floats standard normal, integers small and non-negative."""
    from .feeds import random_array

    rng = np.random.default_rng([seed, batch])
    return {s.name: random_array(s.dtype, s.concrete(batch), rng) for s in specs}


def has_symbolic_batch(specs: Sequence[InputSpec]) -> bool:
    return any(not (isinstance(d, int) and d > 0) for s in specs for d in s.shape)


# -- contenders ---------------------------------------------------------------------------------

def timing_session_options(threads: int):
    """Options for sessions timed side by side in one process: `threads` intra-op threads whose
    pool does not spin.

    Measured on this 2-vCPU VM, two sessions of the very same graph at 2 threads: with spinning
    off their round-by-round ratio stays within 0.98-1.07x; with onnxruntime's default spinning
    it ranged 0.6-1.2x (a spinning thread competes with the host's scheduling of the second
    vCPU), too coarse to decide which kernel to keep. The price: every parallel region then wakes
    a sleeping thread, which costs onnxruntime's multi-node graphs more than one fused kernel, so
    2-thread speedups here overstate what a spinning pool would show. Every contender gets the
    same setting, and alternating_rounds still waits out other pools' spin (TVM's spins anyway).
    """
    from .verify import quiet_session_options

    options = quiet_session_options()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


CALL_STYLES = ("iobinding", "run")
"""How an onnxruntime contender is called: "iobinding" binds the inputs and pre-allocated outputs
once and times run_with_iobinding, as a serving loop does (the model's time, not Python's);
"run" times session.run(None, feeds), which adds numpy conversions worth 5-7 us per call."""


def ort_contender(name: str, model_path, feeds: dict[str, np.ndarray], threads: int,
                  call_style: str = "iobinding") -> Contender:
    """onnxruntime with all graph optimizations; loads an onnxfuse library if the model names one."""
    import onnxruntime as ort

    from .session import InferenceSession

    if call_style not in CALL_STYLES:
        raise ValueError(f"call style must be one of {CALL_STYLES}, got {call_style!r}")
    options = timing_session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.inter_op_num_threads = 1
    session = InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    wanted = {i.name for i in session.get_inputs()}
    own_feeds = {k: v for k, v in feeds.items() if k in wanted}
    if call_style == "run":
        return Contender(name, lambda: session.run(None, own_feeds), lambda result: dict(zip(names, result)))
    binding = bound_io(session, own_feeds)
    return Contender(name, lambda: session.run_with_iobinding(binding),
                     lambda _: dict(zip(names, binding.copy_outputs_to_cpu())))


def bound_io(session, feeds: dict[str, np.ndarray]):
    """An IOBinding with `feeds` as inputs and outputs pre-allocated by onnxruntime (aligned, as
    its own outputs are) at the shapes one plain run gives; `feeds` must outlive the binding."""
    import onnxruntime as ort

    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    for meta, value in zip(session.get_outputs(), session.run(None, feeds)):
        binding.bind_ortvalue_output(meta.name, ort.OrtValue.ortvalue_from_shape_and_type(value.shape, value.dtype))
    return binding


def bound_call(session, feeds: dict[str, np.ndarray]) -> Callable[[], Any]:
    """One timed call of `session` on `feeds` through IOBinding (bound here, once)."""
    binding = bound_io(session, feeds)
    return lambda: session.run_with_iobinding(binding)


def timing_session(model: bytes, threads: int, library=None):
    """An onnxruntime session to time side by side (timing_session_options, all graph
    optimizations), with the custom-op `library` registered if one is given."""
    import onnxruntime as ort

    options = timing_session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def has_symbolic_inputs(session) -> bool:
    """Whether any input dimension is symbolic (then the batch sizes apply; else its own shapes)."""
    return any(isinstance(d, str) or d is None for i in session.get_inputs() for d in i.shape)


def tvm_target():
    import tvm

    return tvm.target.Target({"kind": "llvm", "mcpu": tvm.target.codegen.llvm_get_system_cpu()})


def build_tvm(model_path, batch: int, library_path) -> float:
    """TVM's own pipeline on the original model with the batch bound; returns build seconds."""
    import onnx
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    specs = model_inputs(model_path)
    started = time.perf_counter()
    model = onnx.load(str(model_path))
    mod = from_onnx(model, shape_dict={s.name: list(s.concrete(batch)) for s in specs},
                    dtype_dict={s.name: s.dtype for s in specs})
    target = tvm_target()
    executable = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    seconds = time.perf_counter() - started
    executable.export_library(str(library_path))
    return seconds


def tvm_contender(library_path, model_path, feeds: dict[str, np.ndarray]) -> Contender:
    """TVM's VM on a library from `build_tvm`. Inputs are converted once; a call is `main(*inputs)`
    with outputs left in TVM tensors (copied to numpy only for the check)."""
    import onnx
    import tvm
    from tvm import relax

    vm = relax.VirtualMachine(tvm.runtime.load_module(str(library_path)), tvm.cpu())
    main = vm["main"]  # fetch once: a lookup per call costs tens of microseconds
    args = [tvm.runtime.tensor(feeds[s.name]) for s in model_inputs(model_path)]
    names = [o.name for o in onnx.load(str(model_path), load_external_data=False).graph.output]

    def outputs(result) -> dict[str, np.ndarray]:
        tensors = [result] if hasattr(result, "numpy") else list(result)
        return {n: t.numpy() for n, t in zip(names, tensors)}

    return Contender(TVM, lambda: main(*args), outputs)


# -- one process per thread count ---------------------------------------------------------------

def measure(job: dict) -> dict:
    """Run in a worker process (TVM_NUM_THREADS set by the parent): every batch of one model at
    one thread count. Returns {"batches": [{"batch", "contenders": {name: timing json | {"na"}}}]}."""
    reference_path = job["model"]
    specs = model_inputs(reference_path)
    out = []
    for batch in job["batches"]:
        feeds = random_inputs(specs, batch, job.get("seed", 0))
        call_style = job.get("call_style", "iobinding")
        baseline = ort_contender(BASELINE, reference_path, feeds, job["threads"], call_style)
        reference = baseline.outputs(baseline.call())
        contenders, not_run = [baseline], {}
        for name, path in job["ort_models"].items():
            try:
                contenders.append(ort_contender(name, path, feeds, job["threads"], call_style))
            except Exception as exc:
                not_run[name] = f"onnxruntime cannot load it: {_short_reason(exc)}"
        tvm_library = job.get("tvm_libraries", {}).get(str(batch))
        if tvm_library:
            try:
                contenders.append(tvm_contender(tvm_library, reference_path, feeds))
            except Exception as exc:
                not_run[TVM] = f"TVM VM failed: {_short_reason(exc)}"
        timings = race(contenders, reference, job["rounds"], job["round_seconds"], job["budget_seconds"])
        cells = {name: (t.to_json() if isinstance(t, Timing) else {"na": t}) for name, t in timings.items()}
        cells.update({name: {"na": why} for name, why in not_run.items()})
        out.append({"batch": batch, "contenders": cells})
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
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            return {"error": f"worker exited with {proc.returncode}: {lines[-1][:200] if lines else 'no message'}"}
        return json.loads(result_file.read_text())


def _worker_main(argv: Sequence[str]) -> None:
    task, job_file, result_file = argv
    job = json.loads(Path(job_file).read_text())
    if task == "measure":
        result = measure(job)
    elif task == "build_tvm":
        try:
            result = {"seconds": build_tvm(job["model"], job["batch"], job["library"])}
        except Exception as exc:
            result = {"error": _short_reason(exc)}
    else:
        raise SystemExit(f"unknown task {task!r}")
    Path(result_file).write_text(json.dumps(result))


# -- a whole model --------------------------------------------------------------------------------

@dataclass
class BenchOptions:
    batches: tuple[int, ...] = (1, 64, 1000)
    threads: tuple[int, ...] = (1,)
    rounds: int = ROUNDS
    round_seconds: float = ROUND_SECONDS
    budget_seconds: float = BUDGET_SECONDS
    tvm: bool = True
    cache_dir: str | None = None  # onnxfuse kernel cache; None → onnxfuse's default
    seed: int = 0
    tvm_build_timeout: float = 600.0
    select: str = "auto"  # onnxfuse's group selection (`optimize --select`); measured times at `batches`
    call_style: str = "iobinding"  # how onnxruntime contenders are called (CALL_STYLES)


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
        from .errors import ModelLoadError

        raise ModelLoadError(f"{model_path}: no such model file")
    name = name or model_path.name.removesuffix(".onnx")
    work = Path(work_dir or tempfile.mkdtemp(prefix="onnxfuse-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    result = ModelBench(name, str(model_path), str(fused_path) if fused_path else None)
    specs = model_inputs(model_path)
    batches = options.batches if has_symbolic_batch(specs) else (_static_batch(specs),)
    if batches != options.batches:
        result.notes.append(f"static input shapes: measured at batch {batches[0]} only")

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
        for batch in batches:
            log(f"{name}: TVM build at batch {batch}")
            library = work / f"{model_path.stem}.tvm.b{batch}.so"
            built = run_worker("build_tvm", {"model": str(model_path), "batch": batch, "library": str(library)},
                               timeout=options.tvm_build_timeout)
            if "seconds" in built:
                builds[str(batch)] = round(built["seconds"], 3)
                tvm_libraries[str(batch)] = str(library)
            else:
                builds[str(batch)] = {"na": built["error"]}

    for threads in options.threads:
        log(f"{name}: timing at {threads} thread(s), batches {', '.join(map(str, batches))}")
        job = {"model": str(model_path), "ort_models": ort_models, "tvm_libraries": tvm_libraries,
               "batches": list(batches), "threads": threads, "rounds": options.rounds,
               "round_seconds": options.round_seconds, "budget_seconds": options.budget_seconds,
               "seed": options.seed, "call_style": options.call_style}
        # numpy's OpenBLAS pool threads were seen busy in the timing process: keep them out.
        env = {"TVM_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": "1"}
        measured = run_worker("measure", job, env)
        if "error" in measured and tvm_libraries:  # maybe TVM took the process down: again without it
            crash = measured["error"]
            measured = run_worker("measure", {**job, "tvm_libraries": {}}, env)
            for b in measured.get("batches", []):
                b["contenders"][TVM] = {"na": f"crashed the benchmark process ({crash})"}
        if "error" in measured:  # not even onnxruntime on the original ran: nothing to compare with
            raise OnnxfuseError(f"{model_path}: cannot measure at {threads} thread(s): {measured['error']}")
        for b in measured["batches"]:
            if options.tvm and TVM not in b["contenders"]:
                b["contenders"][TVM] = {"na": f"TVM build failed: {result.compile['tvm_build_seconds'][str(b['batch'])]['na']}"}
            result.runs.append({"batch": b["batch"], "threads": threads, "contenders": with_speedups(b["contenders"])})
    return result


def _optimize(model_path: Path, out_path: Path, options: BenchOptions) -> tuple[Path, dict]:
    from .optimize import optimize

    started = time.perf_counter()
    optimized = optimize(model_path, out_path, cache_dir=options.cache_dir or True, select=options.select,
                         select_batches=options.batches, threads=options.threads)
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
    from .optimize import optimize

    with tempfile.TemporaryDirectory(prefix="onnxfuse-groups-") as tmp:
        name = Path(model_path).name.removesuffix(".onnx")
        return optimize(model_path, Path(tmp) / f"{name}.fused.onnx", cache_dir=options.cache_dir or True,
                        select="measured", select_batches=options.batches, threads=options.threads).report


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
    return [f"{r.name} batch {run['batch']}, {run['threads']} thread(s): {run['contenders'][FUSED]['na']}"
            for r in results for run in r.runs
            if str(run["contenders"].get(FUSED, {}).get("na", "")).startswith("refused")]


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
    fixed = [n for n in (BASELINE, FUSED, TVM) if n in names]
    return fixed + [n for n in names if n not in fixed]


def format_cell(cell: dict, baseline: bool = False) -> str:
    """'1.234 (1.50×)'; '≈' marks a single timed call (too slow for rounds)."""
    if "median_ms" not in cell:
        return f"n/a ({cell.get('na', 'not run')})"
    ms = ("≈" if cell.get("rounds") == 1 else "") + _fmt_ms(cell["median_ms"])
    return ms if baseline or "speedup" not in cell else f"{ms} ({cell['speedup']:.2f}×)"


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
            rows.append([r.name, str(run["batch"]), str(run["threads"]), *cells])
    return render_table(header, rows, markdown)


def format_compile_table(results: Sequence[ModelBench], markdown: bool = False) -> str:
    header = ["model", "onnxfuse optimize s", "groups (fused/total nodes)", "TVM build s per batch"]
    rows = []
    for r in results:
        opt = r.compile.get("optimize")
        opt_s = f"{opt['seconds']:.1f}" + (f" ({opt['groups_cached']} cached)" if opt.get("groups_cached") else "") if opt else "—"
        groups = (f"{opt['groups_total']} ({opt['fused_node_count']}/{opt['node_count']})" if opt else "—")
        builds = r.compile.get("tvm_build_seconds", {})
        tvm_s = ", ".join(f"b{b}: {v:.1f}" if isinstance(v, (int, float)) else f"b{b}: n/a" for b, v in builds.items()) or "—"
        rows.append([r.name, opt_s, groups, tvm_s])
    return render_table(header, rows, markdown)


def report_json(results: Sequence[ModelBench], options: BenchOptions, extra: dict | None = None) -> dict:
    return {"machine": machine_info(), "options": {"batches": list(options.batches), "threads": list(options.threads),
                                                   "rounds": options.rounds, "round_seconds": options.round_seconds,
                                                   "tvm": options.tvm, "call_style": options.call_style},
            "ratio": "speedup = median over rounds of onnxruntime's time / the contender's in the same round "
                     "(onnxruntime median ms / contender median ms where either ran only once)",
            "models": [r.to_json() for r in results], **(extra or {})}


def render_table(header: list[str], rows: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    fmt = lambda r: "  ".join(str(x).ljust(w) for x, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)])


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 5)


def _fmt_ms(ms: float) -> str:
    return f"{ms:.4f}" if ms < 0.1 else f"{ms:.3f}" if ms < 10 else f"{ms:.1f}"


def _short_reason(exc: BaseException) -> str:
    """The last non-empty line: TVM puts its message after a long traceback."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    return without_source_location(lines[-1] if lines else type(exc).__name__)[:200]


if __name__ == "__main__":
    _worker_main(sys.argv[1:])
