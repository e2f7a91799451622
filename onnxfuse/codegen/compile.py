"""Entry point: one fused ONNX group → one native kernel `__tvm_ffi_<name>` in an object file.

Stages (each failure is a one-line `CompileError("<stage>: <reason>")`):
import (ONNX → Relax → one PrimFunc, relax_import.py) → schedule (schedule.py; never fails, it
degrades; then bounds.py adds checks on data-dependent indices) → build (LLVM object file).
A GEMM group over a symbolic batch gets a second function in the same object, `<name>_small`,
scheduled for small batches (schedule.needs_small_batch_variant; each level's threshold:
schedule.small_batch_below),
and a kernel with a parallel row loop over a symbolic batch gets `<name>_serial`, the same
schedule with that loop serial, for calls that do not use the pool (schedule.needs_serial_variant).
A target with several ISA levels gets all of that once per level, under level-suffixed names
(kernel_spec.level_kernel_name), each scheduled for its level's registers, in one object
(level_objects.py); the library picks the level at load (docs/portability.md).
"""

from __future__ import annotations

import functools
import pathlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import tvm
from onnx import numpy_helper

from ..errors import CompileError, short_reason
from ..kernel_spec import (
    KernelSpec,
    TensorSpec,
    level_kernel_name,
    rows_left_to_small_variant,
    serial_variant_name,
    small_variant_name,
)
from ..target import Target, runs_here
from . import (
    bounds,
    empty_reductions,
    forked_builds,
    ieee_order,
    nan_propagation,
    param_alignment,
    reduction_identities,
    register_file,
    relax_import,
    reshape_divisions,
    row_slices,
    schedule,
    sigmoid_clamp,
    spill_guard,
    stack_realign,
    sum_orders,
    tail_loops,
    vector_intrinsics,  # noqa: F401 - imported for its effect: isnan and nearbyint vectorize
    whole_index_checks,
    wrapping_integers,
)
from .host_kernel import host_functions, serial_loops
from .level_objects import join_levels
from .register_file import RegisterFile


@dataclass
class CompiledGroup:
    spec: KernelSpec
    arg_sources: tuple[str, ...]
    extra_weights: dict[str, np.ndarray]
    stats: dict
    _model: onnx.ModelProto = field(repr=False, default=None)
    _host_funcs: dict = field(repr=False, default=None)  # what run() builds (host_kernel.host_functions)
    _host_kernel: dict = field(repr=False, default=None)  # those functions, built
    _host_target: object = field(repr=False, default=None)  # what they are built for (host_build_target)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Runs the kernel in-process with TVM's runtime (for verification against onnxruntime)."""
        values = self._argument_values(feeds)
        bindings = _bind_symbols(self.spec.inputs, values)
        batch = int(np.prod(list(bindings.values())))
        left = rows_left_to_small_variant(batch, self.spec.row_tile, self.spec.small_batch_below)
        if not left:
            return self._run_rows(values, bindings)
        (symbol,) = bindings  # a row tile is set for kernels with one symbol only (row_slices)
        head = [v[: batch - left] if _leads_with_rows(t) else v for v, t in zip(values, self.spec.inputs)]
        tail = [v[batch - left:] if _leads_with_rows(t) else v for v, t in zip(values, self.spec.inputs)]
        outputs = zip(self.spec.outputs, self._run_rows(head, {symbol: batch - left}), self._run_rows(tail, {symbol: left}))
        return [np.concatenate([first, rest]) if _leads_with_rows(spec) else first for spec, first, rest in outputs]

    def _run_rows(self, values: list, bindings: dict[str, int]) -> list[np.ndarray]:
        kernel = self._kernel(bindings)
        args = [tvm.runtime.tensor(np.require(v, requirements="C")) for v in values]
        outs = [tvm.runtime.empty(o.concrete(bindings), o.dtype) for o in self.spec.outputs]
        kernel(*args, *outs)
        return [o.numpy() for o in outs]

    def _argument_values(self, feeds):
        initializers = {i.name: i for i in self._model.graph.initializer}
        values = []
        for source, tensor in zip(self.arg_sources, self.spec.inputs):
            if source in feeds:
                value = np.asarray(feeds[source])
            elif source in self.extra_weights:
                value = self.extra_weights[source]
            elif source in initializers:
                value = numpy_helper.to_array(initializers[source])
            else:
                raise KeyError(f"no value for kernel input {source!r}")
            values.append(value.astype(tensor.dtype, copy=False))
        return values

    def build_host_kernel(self) -> None:
        """Builds the in-process kernel now (run() would on its first call)."""
        if self._host_kernel is None:
            ex = build_module(self._host_funcs, self._host_target or tvm.target.Target({"kind": "llvm"}))
            self._host_kernel = {name: ex.mod[name] for name in self._host_funcs}

    def _kernel(self, bindings: dict[str, int]):
        """The variant the runtime would call for these dims (see KernelSpec.small_batch_below):
        the best level's schedule and index checks with its loops serial (host_kernel.py), built
        for that level where this machine runs it, so it computes the same bits as the object
        (FMA contraction, sigmoid_clamp), else for a generic CPU (host_build_target)."""
        self.build_host_kernel()
        small = self.spec.small_batch_below and int(np.prod(list(bindings.values()))) < self.spec.small_batch_below
        return self._host_kernel[self.spec.small_name if small else self.spec.name]


def _leads_with_rows(tensor: TensorSpec) -> bool:
    """Whether the tensor's leading dim is the kernel's symbol (the runtime's leads_with_rows)."""
    return bool(tensor.shape) and isinstance(tensor.shape[0], str)


def _bind_symbols(specs, values) -> dict[str, int]:
    bindings: dict[str, int] = {}
    for spec, value in zip(specs, values):
        if len(spec.shape) != value.ndim:
            raise ValueError(f"rank mismatch: expected {spec.shape}, got {value.shape}")
        for dim, actual in zip(spec.shape, value.shape):
            if isinstance(dim, str):
                if bindings.setdefault(dim, int(actual)) != int(actual):
                    raise ValueError(f"dimension {dim} bound to {bindings[dim]} and {actual}")
    return bindings


def _stage(name: str, stats: dict, fn):
    """Runs one stage, timing it and turning unexpected errors into CompileError."""
    start = time.perf_counter()
    try:
        return fn()
    except CompileError:
        raise
    except Exception as exc:  # TVM raises many error types; the user gets one line
        raise CompileError(f"{name}: {short_reason(exc)}") from exc
    finally:
        stats[f"seconds_{name}"] = round(time.perf_counter() - start, 4)


# Peel the ragged last row tile off, so full tiles run without a per-row predicate in their
# vector loops (a symbolic batch otherwise keeps `row < N` checks in every inner loop).
BUILD_CONFIG = {"s_tir.LoopPartition": {"partition_const_loop": True, "no_unroll_loop_with_extent_one": True}}


def build_module(funcs: dict, tvm_target):
    """Builds PrimFuncs (name → func, each with its global_symbol) into one module. Float values
    are fenced from the simplifier passes of TVM's lowering (ieee_order); LLVM drops the fences."""
    fenced = {name: ieee_order.fence(func) for name, func in funcs.items()}
    with tvm.transform.PassContext(opt_level=3, config=BUILD_CONFIG):
        return tvm.compile(tvm.IRModule(fenced), target=tvm_target, tir_pipeline=tail_loops.PIPELINE)


def build_object(level_funcs: list, name: str, target: Target, out_dir: pathlib.Path,
                 llvm_options: tuple[str, ...] = (), parallel: int = 0,
                 meanwhile: Callable[[], None] | None = None, register_tiled: bool = False) -> pathlib.Path:
    """`out_dir/<name>.o` from (level, functions) pairs, one per ISA level of `target`, best level
    first; the functions may be a callable that schedules them. One level is built straight into
    the object; several are built apart and joined (level_objects.py). The best level is built
    in this process, then `meanwhile` runs; the other levels are scheduled and built meanwhile in
    up to `parallel` forked children (forked_builds.py), or here afterwards (parallel=0).
    A kernel with a register-tiled GEMM (`register_tiled`) keeps the build that spills fewer
    vector registers (spill_guard.py)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.o"
    parts = [path] if len(level_funcs) == 1 else [out_dir / f"{name}.{level.suffix}.o" for level, _ in level_funcs]

    def build(level, funcs, part: pathlib.Path) -> None:
        funcs = funcs() if callable(funcs) else funcs
        def with_options(options):
            return build_module(funcs, target.tvm_target(level, options))
        built, spills = (spill_guard.fewer_spills(with_options, llvm_options, target.arch) if register_tiled
                         else (with_options(llvm_options), None))
        stack_realign.write_object(built, part, target.arch, spills)

    def in_parent() -> None:
        build(*level_funcs[0], parts[0])
        if meanwhile is not None:
            meanwhile()

    others = [(level.name, functools.partial(build, level, funcs, part))
              for (level, funcs), part in zip(level_funcs[1:], parts[1:])]
    forked_builds.run_jobs(others, parallel, in_parent)
    return path if len(parts) == 1 else join_levels(parts, path, target)


def _variants(fused, name: str, max_duplication: int, small_variant: bool | None, registers: RegisterFile,
              serial_variant: bool | None = None, multiples: tuple[tuple[str, int], ...] = ()):
    """The kernel's functions (name → scheduled, index-checked PrimFunc), the main schedule's
    stats and the number of index checks. small_variant=None decides by the main schedule
    (schedule.needs_small_batch_variant); the variant is named by small_variant_name. A parallel
    main schedule also gets its serial twin, named by serial_variant_name, unless the kernel has
    data-dependent gathers (index checks): a depth-8 tree chain ran no faster with its twin
    (24.8 -> 24.1 us at batch 64, 289 -> 287 us at 1,000) and took 25-45% longer to compile.
    serial_variant=True/False overrides that choice (every ISA level must have the same variants).
    multiples: input dims each function checks first (reshape_divisions)."""
    def checked_at_run_time(func, what: str):
        """The function with its index checks and, first, its input dims' divisibility checks."""
        func, count = bounds.add_index_checks(func, what)
        return reshape_divisions.with_divisibility_checks(func, multiples), count

    scheduled, stats = _schedule_or_plain(fused, registers, max_duplication=max_duplication)
    checked, n_checks = checked_at_run_time(scheduled, name)
    funcs = {name: checked.with_attr("global_symbol", name)}
    if small_variant is None:
        small_variant = schedule.needs_small_batch_variant(stats)
    if small_variant:
        func, _ = _schedule_or_plain(fused, registers, max_duplication=max_duplication, small_batch=True)
        variant, _ = checked_at_run_time(func, small_variant_name(name))
        funcs[small_variant_name(name)] = variant.with_attr("global_symbol", small_variant_name(name))
    if serial_variant is None:
        serial_variant = schedule.needs_serial_variant(stats) and not n_checks
    if serial_variant:  # the main schedule with its loops serial (host_kernel.serial_loops)
        funcs[serial_variant_name(name)] = serial_loops(checked).with_attr("global_symbol", serial_variant_name(name))
    return funcs, stats, n_checks


# A tree walk picks each node's child by comparing a feature with a threshold: a select on data
# no branch predictor can guess. LLVM's x86 cmov-conversion pass turned some of those selects
# into branches, and whether it did changed with unrelated details of the kernel (which input the
# root indices came from): the 100x8 tree_trav kernel then ran 1.26x slower at 10,000 rows
# (kernel alone, paired rounds; docs/benchmarks.md, "Trees"). Gather chains keep their cmovs.
GATHER_CHAIN_LLVM_OPTIONS = {"x86_64": ("-x86-cmov-converter=false",)}


def llvm_options(target: Target, gather_chain: bool) -> tuple[str, ...]:
    """LLVM command-line options for a kernel's code generation on `target`."""
    return GATHER_CHAIN_LLVM_OPTIONS.get(target.arch, ()) if gather_chain else ()


def compile_group(
    model: onnx.ModelProto,
    name: str,
    target: Target,
    out_dir: pathlib.Path,
    *,
    max_duplication: int = schedule.DEFAULT_MAX_DUPLICATION,
    parallel_levels: int = 0,
    host_kernel: bool = False,
    weight_inputs: frozenset[str] = frozenset(),
) -> CompiledGroup:
    """Compiles one fused group into `out_dir/<name>.o`.

    max_duplication: how many times the schedule may re-emit (inline) one producer's expression
    before it materialises it instead (see schedule.inline_cheap_producers).
    parallel_levels: how many of the ISA levels after the best may be scheduled and built in
    forked children while this process builds the best one (0: one after another, here).
    host_kernel: build the in-process kernel run() uses now, while those children work.
    weight_inputs: the model's inputs that hold the original's constants (kernel_identity.py),
    which onnxruntime multiplies by differently from values known only at run time.

    Each level is scheduled for its own register file (register_file.py); the best level decides
    which variants exist, and the others follow it, so the library's table is one shape for all
    levels. Stats: seconds_schedule is the best level's; seconds_build includes the others'."""
    if max_duplication < 1:
        raise CompileError(f"max_duplication: must be >= 1, got {max_duplication}")
    if not name.isidentifier():
        raise CompileError(f"name: {name!r} is not a C identifier")
    stats: dict = {}
    levels = target.levels
    imports: dict[sum_orders.SumOrders, relax_import.ImportedGroup] = {}

    def imported(level) -> relax_import.ImportedGroup:
        """The group as onnxruntime adds it on the level's CPUs: imported once per distinct order."""
        orders = sum_orders.for_target(target.tvm_target(level))
        if orders not in imports:
            with sum_orders.summing_as(orders):
                imports[orders] = relax_import.import_group(model, name, weight_inputs=weight_inputs)
        return imports[orders]

    group = _stage("import", stats, lambda: imported(levels[0]))
    best_name = level_kernel_name(name, levels[0].suffix, len(levels))
    registers = register_file.for_target(target.tvm_target(levels[0]))
    best_funcs, sched_stats, n_checks = _stage(
        "schedule", stats, lambda: _variants(_for_level(group.prim_func, target, levels[0]), best_name,
                                             max_duplication, None, registers, multiples=group.multiples))
    small_variant = small_variant_name(best_name) in best_funcs
    serial_variant = serial_variant_name(best_name) in best_funcs

    def level_funcs(level) -> dict:
        base = level_kernel_name(name, level.suffix, len(levels))
        level_registers = register_file.for_target(target.tvm_target(level))
        return _variants(_for_level(imported(level).prim_func, target, level), base, max_duplication, small_variant,
                         level_registers, serial_variant=serial_variant, multiples=group.multiples)[0]

    options = llvm_options(target, sched_stats.gather_chain)
    small_below = schedule.small_batch_below(sched_stats) if small_variant else 0
    level_small_below = _level_small_batch_below(target, sched_stats, registers) if small_variant else ()
    sliced = small_variant and _rows_in_slices(group, sched_stats)
    row_tile = sched_stats.tile_rows if sliced else 0
    level_row_tiles = _level_row_tiles(target, sched_stats, registers) if sliced else ()
    inputs = tuple(TensorSpec(dtype, dims) for dtype, dims in group.input_types)
    outputs = tuple(TensorSpec(dtype, dims) for dtype, dims in group.output_types)
    try:
        spec = KernelSpec(name, inputs, outputs, str(pathlib.Path(out_dir) / f"{name}.o"),
                          small_batch_below=small_below, level_small_batch_below=level_small_below,
                          row_tile=row_tile, level_row_tiles=level_row_tiles,
                          row_work=sched_stats.row_work if sched_stats.symbolic_rows else 0,
                          serial_variant=serial_variant, multiples=group.multiples,
                          levels=tuple(level.suffix for level in levels) if len(levels) > 1 else ())
    except ValueError as exc:
        raise CompileError(f"spec: {exc}") from exc
    compiled = CompiledGroup(spec, tuple(group.arg_sources), dict(group.extra_weights), stats, model,
                             host_functions(best_funcs, best_name, name), _host_target=host_build_target(target))
    jobs = [(levels[0], best_funcs)] + [(level, functools.partial(level_funcs, level)) for level in levels[1:]]
    _stage("build", stats, lambda: build_object(jobs, name, target, pathlib.Path(out_dir), options, parallel_levels,
                                                compiled.build_host_kernel if host_kernel else None,
                                                register_tiled=sched_stats.register_tiles > 0))
    stats.update(sched_stats.as_dict())
    stats["llvm_options"] = " ".join(options)
    stats["max_duplication"] = max_duplication
    stats["index_checks"] = n_checks
    stats["small_batch_variant_below"] = small_below
    stats["row_tile"] = row_tile
    stats["serial_variant"] = serial_variant
    stats["isa_levels"] = ",".join(level.name for level in levels)
    stats["fused_prim_funcs"] = 1  # import_group fails unless main calls exactly one PrimFunc
    return compiled


def _level_small_batch_below(target: Target, best_stats, best_registers: RegisterFile) -> tuple[int, ...]:
    """Each level's small-batch threshold, best level first (empty for one level): a level's
    registers size its row tiles, and the threshold follows them (schedule.small_batch_below)."""
    if len(target.levels) == 1:
        return ()
    return tuple(schedule.small_batch_below_for_level(best_stats, best_registers,
                                                      register_file.for_target(target.tvm_target(level)))
                 for level in target.levels)


def _rows_in_slices(group: relax_import.ImportedGroup, stats: schedule.ScheduleStats) -> bool:
    """Whether a call may run its last few rows in the small-batch variant
    (kernel_spec.rows_left_to_small_variant): a register-tiled GEMM kernel (the one kind whose
    variants were measured against each other, schedule.small_batch_below) whose rows are
    separable and whose symbol no Reshape needs a multiple of."""
    return (stats.register_tiles > 0 and not stats.gather_chain and not group.multiples
            and row_slices.separable_rows(group.prim_func))


def _level_row_tiles(target: Target, best_stats, best_registers: RegisterFile) -> tuple[int, ...]:
    """Each level's main row tile, best level first (empty for one level)."""
    if len(target.levels) == 1:
        return ()
    return tuple(schedule.tile_rows_for_level(best_stats, best_registers,
                                              register_file.for_target(target.tvm_target(level)))
                 for level in target.levels)


def host_build_target(target: Target):
    """The TVM target the in-process kernel is built for: the best level's own when this machine
    runs it, so the in-process kernel computes what the shipped one does; a generic CPU otherwise
    (a cross build: it then differs in roundings, which verification's tolerance allows)."""
    if runs_here(target, target.levels[0]):
        return target.tvm_target(target.levels[0])
    return tvm.target.Target({"kind": "llvm"})


def _for_level(func, target: Target, level):
    """The unscheduled function as the level computes it where onnxruntime's kernels differ by
    CPU (sigmoid_clamp)."""
    return sigmoid_clamp.for_level(func, target.tvm_target(level))


def _schedule_or_plain(func, registers: RegisterFile,
                       max_duplication: int = schedule.DEFAULT_MAX_DUPLICATION, small_batch: bool = False):
    """The tuned schedule, or (if TVM rejects it as a whole) the unscheduled function; either
    way with parameters at element alignment (param_alignment), every reduction's start written
    before its loop (empty_reductions), max/min propagating NaN (nan_propagation), min/max
    reductions starting from ±inf (reduction_identities), integer arithmetic on data wrapping
    (wrapping_integers) and every gather index from the inputs checked first (whole_index_checks)."""
    try:
        scheduled, stats = schedule.schedule_group(func, True, max_duplication, small_batch, registers)
    except Exception as exc:  # a last-resort fallback: a valid kernel beats no kernel
        scheduled, stats = func, schedule.ScheduleStats(skipped_steps=[f"whole schedule: {short_reason(exc)}"])
    written = empty_reductions.write_starts_first(scheduled)
    ieee = reduction_identities.start_from_infinity(nan_propagation.propagate_nan(written))
    wrapping = wrapping_integers.wrap_data_arithmetic(ieee)
    return param_alignment.element_aligned(whole_index_checks.check_whole_gathers_first(wrapping, func)), stats
