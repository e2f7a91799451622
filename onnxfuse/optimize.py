"""`optimize`: the tool's main job, from a model file to a fused model and its kernel library.

plan → extract each group → cached kernel, or compile + verify against onnxruntime → one
custom-op library → the rewritten model. A group that fails anywhere falls back to its original
nodes with the reason in the report: one hard group never fails the whole model. Outputs are
written to temporary files and renamed at the end, so a failed run leaves nothing half-written.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from .cache import KernelCache, default_cache_dir, group_key, kernel_name
from .errors import CompileError, UsageError, first_line
from .extract import extract_group
from .fusion.partition import FusionOptions
from .fusion.plan import FusedGroup, FusionPlan, plan_fusion
from .kernel_spec import DerivedDim, KernelSpec
from .frontend.ir_version import require_loadable_ir_version
from .frontend.loader import load_model
from .ops import uncompetitive_ops
from .package import GroupKernel, package_model
from .report import whole_model_step_line
from .target import Target, resolve_target
from .workers import run_with_deadline

GROUP_RTOL, GROUP_ATOL = 1e-3, 1e-4
SELECTIONS = ("auto", "all", "measured")
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # bytes; protobuf cannot hold 2 GB
COPY_MEGABYTES = 64  # --select measured's copy-bandwidth probe: past the L3 cache, and well under a second


@dataclass
class GroupOutcome:
    group: FusedGroup
    status: str  # "compiled" | "cached" | "fallback"
    kernel: GroupKernel | None = None
    reason: str | None = None
    seconds: float = 0.0
    info: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = {**self.group.to_json(), "status": self.status, "compile_seconds": round(self.seconds, 3)}
        if self.kernel:
            out["kernel"] = self.kernel.spec.name
        if self.reason:
            out["reason"] = self.reason
        out.update(self.info)
        return out


@dataclass
class OptimizeResult:
    model_path: Path
    library_path: Path | None
    plan: FusionPlan
    outcomes: list[GroupOutcome]
    seconds: float
    measured: dict = field(default_factory=dict)  # --select measured: copy bandwidth, whole-model check

    @property
    def report(self) -> dict:
        counts = {s: sum(o.status == s for o in self.outcomes) for s in ("compiled", "cached", "fallback")}
        return {
            "output": str(self.model_path),
            "library": str(self.library_path) if self.library_path else None,
            "seconds": round(self.seconds, 3),
            "node_count": self.plan.node_count,
            "fused_node_count": sum(len(o.group.node_indices) for o in self.outcomes if o.kernel),
            "groups_total": len(self.outcomes),
            **{f"groups_{k}": v for k, v in counts.items()},
            "options": self.plan.options_json(),
            "groups": [o.to_json() for o in self.outcomes],
            "unfused": [u.to_json() for u in self.plan.unfused],
            **({"measured": self.measured} if self.measured else {}),
        }


def default_output(model_path: Path) -> Path:
    name = model_path.name[: -len(".onnx")] if model_path.name.endswith(".onnx") else model_path.name
    return model_path.with_name(f"{name}.fused.onnx")


def library_path_for(model_out: Path) -> Path:
    stem = model_out.name[: -len(".onnx")] if model_out.name.endswith(".onnx") else model_out.name
    return model_out.with_name(f"{stem}.so")


def optimize(
    model: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    target: str = "native",
    mcpu: str | None = None,
    mattr: str | None = None,
    max_depth: int = 256,
    max_inputs: int = 64,
    max_duplication: int = 1,
    jobs: int | None = None,
    cache_dir: str | os.PathLike | None | bool = True,
    verify: bool = True,
    select: str = "auto",
    select_batches: tuple[int, ...] = (1, 64),
    threads: int | tuple[int, ...] = 1,
    compile_timeout: float | None = None,
    progress=None,
) -> OptimizeResult:
    """Fuse and compile `model`; returns the written paths, the plan and each group's outcome.

    cache_dir: a directory, True for the default (~/.cache/onnxfuse or $ONNXFUSE_CACHE_DIR),
    or False/None to compile everything afresh.
    select: "auto" (deterministic) compiles every group except those with an op onnxruntime still
    runs much faster (convolutions, pooling: see OpInfo.competitive); "all" compiles every group;
    "measured" keeps a kernel only if it is not slower than onnxruntime on the group's own nodes
    at each of `select_batches` (symbolic dims) and each of `threads` (intra-op thread counts),
    then drops kept groups while the whole fused model is slower than the original (whole_model.py).
    compile_timeout: seconds one group may take to compile and verify before it falls back.
    """
    if select not in SELECTIONS:
        raise UsageError(f"unknown selection {select!r}; choose one of {', '.join(SELECTIONS)}")
    if select == "measured" and target == "aarch64":
        raise UsageError("--select measured needs kernels this machine can run; not with --target aarch64")
    started = time.perf_counter()
    tgt = resolve_target(target, mcpu, mattr)
    tgt.require_toolchain()
    model_path = Path(model)
    out_path = Path(output) if output else default_output(model_path)
    graph = load_model(model_path)
    require_loadable_ir_version(graph.model, model_path)
    options = FusionOptions(max_depth=max_depth, max_inputs=max_inputs, max_duplication=max_duplication)
    plan = plan_fusion(graph, options)
    cache = KernelCache(default_cache_dir() if cache_dir is True else (Path(cache_dir) if cache_dir else None))
    progress = progress or Progress(enabled=False)

    with tempfile.TemporaryDirectory(prefix="onnxfuse-build-") as build_dir:
        outcomes = _compile_groups(graph, plan, tgt, cache, Path(build_dir), jobs, verify, compile_timeout, progress,
                                   skip_uncompetitive=select == "auto")
        measured = {}
        if select == "measured":
            thread_counts = (threads,) if isinstance(threads, int) else tuple(threads)
            measured = _select_measured(graph, outcomes, tgt, Path(build_dir), select_batches, thread_counts, progress)
        fused = [(o.group, o.kernel) for o in outcomes if o.kernel is not None]
        out_path.parent.mkdir(parents=True, exist_ok=True)
        library = library_path_for(out_path) if fused else None
        staged_library = _build_library([k for _, k in fused], library, tgt) if library else None
        packaged = package_model(graph, fused, library.name, tgt.name) if fused else graph.model
        staged_model = _stage_model(packaged, out_path)
        # Both files are complete on disk; now make them visible, library first.
        if staged_library:
            os.replace(staged_library, library)
        for staged, final in staged_model:
            os.replace(staged, final)
    return OptimizeResult(out_path, library, plan, outcomes, time.perf_counter() - started, measured)


# -- compiling every group ----------------------------------------------------------------------

def _compile_groups(graph, plan, tgt: Target, cache: KernelCache, build_dir: Path, jobs, verify, timeout,
                    progress, skip_uncompetitive: bool) -> list[GroupOutcome]:
    outcomes: dict[str, GroupOutcome] = {}
    pending: dict[str, tuple[bytes, str, int]] = {}  # key → (group model, kernel name, max duplication)
    waiting: dict[str, list[FusedGroup]] = {}
    for group in plan.groups:
        slow = uncompetitive_ops(group.op_types) if skip_uncompetitive else []
        if slow:
            outcomes[group.name] = GroupOutcome(group, "fallback", reason=(
                f"auto: onnxruntime's {'/'.join(slow)} is faster than our kernel today "
                f"(--select all compiles it, --select measured times it)"))
            continue
        try:
            group_model = extract_group(graph, group)
        except CompileError as exc:
            outcomes[group.name] = GroupOutcome(group, "fallback", reason=str(exc))
            continue
        key = group_key(group_model, f"{tgt.key}|dup{plan.options.max_duplication}")
        hit = cache.load(key)
        if hit is not None:
            outcomes[group.name] = GroupOutcome(group, "cached", hit[0], info=hit[1])
            continue
        pending.setdefault(key, (group_model.SerializeToString(deterministic=True), kernel_name(key),
                                 plan.options.max_duplication))
        waiting.setdefault(key, []).append(group)

    progress.start(len(pending), sum(o.status == "cached" for o in outcomes.values()))
    for key, result in _run_compiles(pending, tgt, build_dir, jobs, verify, timeout):
        kernel, info, reason, seconds = result
        if kernel is not None:
            try:
                kernel = cache.store(key, kernel, info)
            except OSError as exc:  # an unwritable cache must not cost the user the kernel
                info = {**info, "cache_error": str(exc)}
        for group in waiting[key]:
            status = "compiled" if kernel is not None else "fallback"
            outcomes[group.name] = GroupOutcome(group, status, kernel, reason, seconds, info)
        progress.step(waiting[key][0], kernel is not None, seconds, reason)
    progress.finish()
    return [outcomes[g.name] for g in plan.groups]


def _select_measured(graph, outcomes: list[GroupOutcome], tgt: Target, build_dir: Path, batches, threads,
                     progress) -> dict:
    """Time every kernel against onnxruntime on its group and drop the slower ones; then check the
    whole model (see whole_model.py). Returns what the report records of the run as a whole."""
    from .roofline import call_floor_us, copy_bandwidth_gbs, gemm_peak_gflops
    from .select import kernel_is_worth_keeping, measure_group

    compiled = [o for o in outcomes if o.kernel is not None]
    if not compiled:
        return {}
    copy_gbs = copy_bandwidth_gbs(COPY_MEGABYTES)
    peaks: dict[int, float] = {}  # GEMM peak per thread count, measured once a group has multiply-adds
    call_floors: dict[int, float] = {}  # an empty call's µs per thread count, measured with the peak
    library = _build_library([o.kernel for o in compiled], build_dir / "measure.so", tgt)
    gains: dict[str, float] = {}
    for outcome in compiled:
        measurements = measure_group(outcome.group, outcome.kernel, extract_group(graph, outcome.group), library,
                                     batches, threads)
        for m in measurements:
            if m.flops and m.threads not in peaks:
                peaks[m.threads] = gemm_peak_gflops(m.threads)
                call_floors[m.threads] = call_floor_us(m.threads)
        outcome.info = {**outcome.info, "measured": [
            m.to_json(copy_gbs, peaks.get(m.threads), call_floors.get(m.threads, 0.0)) for m in measurements]}
        if kernel_is_worth_keeping(measurements):
            gains[outcome.group.name] = sum(m.gain_us for m in measurements)
        else:
            slowest = min(measurements, key=lambda m: m.speedup)
            outcome.status, outcome.kernel = "fallback", None
            outcome.reason = (f"measured: onnxruntime is faster ({slowest.onnxruntime_us:.1f} µs vs "
                              f"{slowest.kernel_us:.1f} µs, {slowest.speedup:.2f}x, at batch {slowest.batch}, "
                              f"{slowest.threads} threads)")
        progress.note(f"{outcome.group.name}: " + ", ".join(
            f"batch {m.batch}×{m.threads}t: kernel {m.kernel_us:.1f} µs vs onnxruntime {m.onnxruntime_us:.1f} µs"
            for m in measurements) + ("" if outcome.kernel else " → onnxruntime kept"))
    whole = _check_whole_model(graph, {o.group.name: o for o in compiled}, gains, library, tgt, batches, threads,
                               progress)
    return {"copy_bandwidth_gbs": copy_gbs, "gemm_peak_gflops": {str(t): p for t, p in peaks.items()},
            "call_floor_us": {str(t): us for t, us in call_floors.items()},
            "whole_model_check": whole}


def _check_whole_model(graph, by_name: dict[str, GroupOutcome], gains: dict[str, float], library: Path,
                       tgt: Target, batches, threads, progress) -> dict:
    """Drop kept groups, least gain first, while the whole fused model is slower than the original."""
    from .whole_model import TOLERANCE, choose_kept, dropped_at, time_against_original

    if graph.model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
        return {"skipped": "the model is too large to time from memory"}
    original = graph.model.SerializeToString()

    def time_model(kept):
        fused = package_model(graph, [(by_name[n].group, by_name[n].kernel) for n in kept], library.name, tgt.name)
        return time_against_original(original, fused.SerializeToString(), library, batches, threads)

    try:
        steps = choose_kept(gains, time_model)
    except Exception as exc:  # e.g. onnxruntime rejects random inputs for the whole model
        return {"skipped": f"the whole model could not be timed: {first_line(exc)}"}
    for step in steps:
        progress.note(whole_model_step_line(step.to_json()))
    for name, step in dropped_at(steps).items():
        worst = step.worst
        outcome = by_name[name]
        outcome.status, outcome.kernel = "fallback", None
        verdict = ("tried again, not faster than onnxruntime" if step.readd
                   else f"over the {TOLERANCE:.0%} tolerance")
        outcome.reason = (f"dropped by the whole-model check: the model with it ran {worst.fused_ms:.4g} ms vs "
                          f"onnxruntime {worst.onnxruntime_ms:.4g} ms (batch {worst.batch}, {worst.threads} threads; "
                          f"{worst.ratio:.3f}× in paired rounds, {verdict})")
    return {"tolerance": TOLERANCE, "steps": [s.to_json() for s in steps]}


def _run_compiles(pending: dict, tgt: Target, build_dir: Path, jobs: int | None, verify: bool, timeout: float | None):
    """Yield (key, (kernel, info, reason, seconds)) as compiles finish.

    In worker processes when running in parallel or under a deadline; in this process only for
    jobs=1 without a deadline (the cheapest way for tests and small models).
    """
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(pending)))
    target_args = (tgt.name, tgt.mcpu, ",".join(tgt.mattr) or None)
    tasks = {key: (model_bytes, name, target_args, str(build_dir), verify, dup)
             for key, (model_bytes, name, dup) in pending.items()}
    if jobs == 1 and timeout is None:
        for key, args in tasks.items():
            yield key, compile_one(*args)
        return
    yield from run_with_deadline(compile_one, tasks, jobs, timeout, lambda reason: (None, {}, reason, 0.0))


def compile_one(model_bytes: bytes, name: str, target_args: tuple, build_dir: str, verify: bool,
                max_duplication: int = 1):
    """Compile and verify one group (runs in a worker process). Never raises for a bad group."""
    from .codegen.compile import compile_group

    started = time.perf_counter()
    group_model = onnx.load_from_string(model_bytes)
    try:
        tgt = resolve_target(*target_args)
        out_dir = Path(build_dir) / name
        out_dir.mkdir(parents=True, exist_ok=True)
        with native_stderr_captured() as messages:
            compiled = compile_group(group_model, name, tgt, out_dir, max_duplication=max_duplication)
        info: dict = {"stats": _jsonable(compiled.stats)}
        if messages:
            info["tvm_messages"] = messages
        if verify and tgt.name != "aarch64":
            info["verify"] = verify_kernel(compiled, group_model)
        kernel = GroupKernel(compiled.spec, tuple(compiled.arg_sources), dict(compiled.extra_weights))
        return kernel, info, None, time.perf_counter() - started
    except CompileError as exc:
        return None, {}, str(exc), time.perf_counter() - started
    except Exception as exc:  # anything unexpected in TVM is still only this group's problem
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        return None, {}, f"unexpected {type(exc).__name__}: {first}", time.perf_counter() - started


@contextlib.contextmanager
def native_stderr_captured():
    """Collect what TVM writes while compiling: C++ logging on file descriptor 2 (it bypasses
    sys.stderr) and the frontend's print() calls.

    Its messages are about TVM internals (e.g. topi's unchecked gather, which our index checks
    replace); the user gets them in the report, not mixed into the tool's output.
    """
    messages: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    printed = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stdout(printed):
                yield messages
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            text = sink.read().decode(errors="replace") + printed.getvalue()
            messages.extend(dict.fromkeys(line.split("] ", 1)[-1].strip() for line in text.splitlines() if line.strip()))


def verify_kernel(compiled, group_model: onnx.ModelProto) -> dict:
    """Run the kernel and onnxruntime on the same random inputs; a mismatch is a CompileError."""
    import onnxruntime as ort

    from .feeds import random_feeds_for_session
    from .verify import compare_arrays, quiet_session_options

    try:
        session = ort.InferenceSession(group_model.SerializeToString(), quiet_session_options(),
                                       providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise CompileError(f"verify: onnxruntime cannot run this group as a reference ({first_line(exc)})") from None
    worst = 0.0
    sizes = [(1, 0), (3, 1)]
    if compiled.spec.small_batch_below:  # 1 and 3 run the small-batch variant: a full tile and a tail too
        sizes.append((compiled.spec.small_batch_below + 3, 2))
    for dim, seed in sizes:
        feeds = random_feeds_for_session(session, _whole_multiples(compiled.spec, dim), default_dim=dim, seed=seed)
        try:
            expected = session.run(None, feeds)
        except Exception as exc:
            return {"checked": False, "why": f"reference rejects random inputs: {first_line(exc, 120)}"}
        actual = compiled.run(feeds)
        for meta, e, a in zip(session.get_outputs(), expected, actual):
            cmp = compare_arrays(meta.name, np.asarray(e), np.asarray(a), GROUP_RTOL, GROUP_ATOL)
            if not cmp.ok:
                raise CompileError(f"verify: output {meta.name} differs from onnxruntime (max abs error {cmp.max_abs_error:.3g})")
            worst = max(worst, cmp.max_abs_error)
    return {"checked": True, "max_abs_error": worst}


def _whole_multiples(spec: KernelSpec, dim: int) -> dict[str, int]:
    """Symbols an output divides (`M // 100` folds a flat `[M]` back to rows) set to `dim` whole
    multiples of every divisor they meet: random inputs must fold evenly, as the real ones do."""
    divisors: dict[str, int] = {}
    for d in (d for t in spec.outputs for d in t.shape if isinstance(d, DerivedDim) and d.divisor > 1):
        divisors[d.symbol] = math.lcm(divisors.get(d.symbol, 1), d.divisor)
    return {symbol: dim * divisor for symbol, divisor in divisors.items()}


def _jsonable(stats: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in stats.items()
            if isinstance(v, (int, float, str, bool))}


# -- writing the outputs -------------------------------------------------------------------------

def _build_library(kernels: list[GroupKernel], library: Path, tgt: Target) -> Path:
    from .runtime.library import build_library

    unique: dict[str, KernelSpec] = {}
    for k in kernels:
        unique.setdefault(k.spec.name, k.spec)
    staged = library.with_name(f".{library.name}.{os.getpid()}.tmp")  # renamed into place by the caller
    try:
        build_library(list(unique.values()), staged, target=tgt)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    return staged


def _stage_model(model: onnx.ModelProto, out_path: Path) -> list[tuple[Path, Path]]:
    """Write the model (and its external data when too large for one protobuf) to temp files."""
    staged = out_path.with_name(f".{out_path.name}.{os.getpid()}.tmp")
    pairs = []
    try:
        if model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
            data_name = f"{out_path.name}.data"
            staged_data = out_path.with_name(f".{data_name}.{os.getpid()}.tmp")
            onnx.save_model(model, str(staged), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=staged_data.name, size_threshold=1024)
            # The model must name the final data file, not the staging one.
            reloaded = onnx.load(str(staged), load_external_data=False)
            for t in reloaded.graph.initializer:
                for entry in t.external_data:
                    if entry.key == "location":
                        entry.value = data_name
            staged.write_bytes(reloaded.SerializeToString(deterministic=True))
            pairs.append((staged_data, out_path.with_name(data_name)))
        else:
            staged.write_bytes(model.SerializeToString(deterministic=True))
        pairs.append((staged, out_path))
    except BaseException:
        for tmp, _ in pairs + [(staged, out_path)]:
            tmp.unlink(missing_ok=True)
        raise
    return pairs


# -- progress ------------------------------------------------------------------------------------

class Progress:
    """A progress bar on a terminal; one parseable line per group otherwise."""

    def __init__(self, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self.total = self.done = 0

    def start(self, to_compile: int, cached: int) -> None:
        self.total = to_compile
        if self.enabled and (to_compile or cached):
            self._line(f"onnxfuse: {to_compile} kernels to compile, {cached} groups from cache", final=True)

    def step(self, group: FusedGroup, ok: bool, seconds: float, reason: str | None) -> None:
        self.done += 1
        if not self.enabled:
            return
        what = "compiled" if ok else f"fallback ({reason})"
        if self.tty:
            filled = int(30 * self.done / max(self.total, 1))
            self._line(f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {group.name} {what[:60]}",
                       final=not ok)
        else:
            self._line(f"onnxfuse: [{self.done}/{self.total}] {group.name} {len(group.node_indices)} ops {what} {seconds:.2f}s",
                       final=True)

    def note(self, text: str) -> None:
        if self.enabled:
            self._line(f"onnxfuse: {text}", final=True)

    def finish(self) -> None:
        if self.tty and self.total:
            self.stream.write("\n")
            self.stream.flush()

    def _line(self, text: str, final: bool) -> None:
        if self.tty:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()
