"""`--select measured`: keep a group's kernel only where it is not slower than onnxruntime.

For each compiled group we time, inside onnxruntime and in alternating rounds, a model holding
just the custom node against the group's original nodes (with onnxruntime's own graph
optimizations on). The kernel is kept only if, at every measured batch size and thread count,
it is surely no slower than onnxruntime beyond this VM's noise (NOISE), and it is faster on the
whole (the geometric mean of its speedups) and surely faster at one size at least: "never slower
than onnxruntime", group by group.

"Surely" is the 95% band of the median round-by-round speedup (measure/timing.median_interval).
Where that band straddles the noise threshold the verdict is not yet sure, so the rounds are
widened (WIDEN_ROUNDS more at a time, up to MAX_ROUNDS); still unsure then, onnxruntime keeps
the group. A busy machine thus costs more rounds, not a flipped decision: one timing of 15
rounds once dropped a 1.6x LSTM cell as noise.

Each measurement also counts the bytes the kernel moves and the multiply-adds it does (see
roofline.py), so its time can be read against the machine's copy bandwidth and GEMM peak: a
kernel near either bound has little left to gain.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import helper

from ..errors import first_line
from ..fusion.extract import extract_group
from ..fusion.plan import FusedGroup
from ..kernel_spec import DOMAIN, DOMAIN_VERSION, GroupKernel
from ..measure.inputs import random_feeds_for_session
from ..measure.roofline import bytes_moved, call_floor_us, copy_bandwidth_gbs, gemm_peak_gflops, multiply_add_flops, ratio_bound
from ..measure.timing import (
    alternating_rounds,
    best_of_three,
    bound_call,
    calls_per_round,
    has_symbolic_inputs,
    median_interval,
    round_clock,
    timing_session,
)
from ..package import custom_op_node
from .decisions import DecisionCache, decision_key

ROUNDS = 15
WIDEN_ROUNDS = 15  # rounds added while a verdict is unsure
MAX_ROUNDS = 60  # still unsure after this many rounds: onnxruntime keeps the group
ROUND_SECONDS = 0.004  # each contender runs about this long per round
CLEARLY_SLOWER = 3.0
NOISE = 0.02  # slower by up to 2% at one batch counts as not slower: timings on a shared VM vary that much
NOT_SLOWER = 1 / (1 + NOISE)  # the lowest speedup that is not slower beyond NOISE
COPY_MEGABYTES = 64  # the copy-bandwidth probe: past the L3 cache, and well under a second


@dataclass(frozen=True)
class Measurement:
    batch: int  # the value given to every symbolic dimension
    threads: int  # onnxruntime intra-op threads
    kernel_us: float
    onnxruntime_us: float
    bytes_moved: int = 0  # the kernel's inputs, weights and outputs at this batch
    flops: int = 0  # its MatMul/Gemm/Conv floating-point operations at this batch
    paired_speedup: float | None = None  # median over rounds of onnxruntime's time / the kernel's
    band: tuple[float, float] | None = None  # 95% band of paired_speedup (median_interval)
    rounds: int = 0  # alternating rounds timed (after widening); 0: one call each (CLEARLY_SLOWER)

    @property
    def bounds(self) -> tuple[float, float]:
        """The speedup's 95% band; the speedup itself where no band was measured."""
        return self.band if self.band is not None else (self.speedup, self.speedup)

    @property
    def verdict(self) -> str:
        """'not slower', 'slower' or 'unsure' (speed_verdict of the band)."""
        return speed_verdict(self.bounds)

    @property
    def gain_us(self) -> float:
        return self.onnxruntime_us - self.kernel_us

    @property
    def speedup(self) -> float:
        """onnxruntime over the kernel: round by round where both ran in rounds, else the medians'."""
        if self.paired_speedup is not None:
            return self.paired_speedup
        return self.onnxruntime_us / self.kernel_us if self.kernel_us > 0 else float("inf")

    @property
    def kernel_gbs(self) -> float:
        """Achieved bandwidth: bytes moved per second of kernel time, in GB/s."""
        return self.bytes_moved / self.kernel_us / 1e3 if self.kernel_us > 0 else 0.0

    @property
    def kernel_gflops(self) -> float:
        """Achieved compute: floating-point operations per second of kernel time, in GFLOP/s."""
        return self.flops / self.kernel_us / 1e3 if self.kernel_us > 0 else 0.0

    def to_json(self, copy_gbs: float | None = None, peak_gflops: float | None = None,
                call_us: float = 0.0) -> dict:
        """The measurement, with its shares of the machine's copy bandwidth and of its GEMM peak at
        this thread count when those are given; call_us: an empty call's time (ratio_bound)."""
        # speedup unrounded: it is what the verdict (kernel_is_worth_keeping) was given
        out = {"batch": self.batch, "threads": self.threads, "kernel_us": round(self.kernel_us, 2),
               "onnxruntime_us": round(self.onnxruntime_us, 2), "speedup": self.speedup,
               "bytes": self.bytes_moved, "kernel_gbs": round(self.kernel_gbs, 3)}
        if self.band is not None:
            out.update(band=[round(x, 4) for x in self.band], rounds=self.rounds, verdict=self.verdict)
        if copy_gbs:
            out["copy_bandwidth_pct"] = round(100 * self.kernel_gbs / copy_gbs, 1)
        if self.flops:
            out.update(flops=self.flops, kernel_gflops=round(self.kernel_gflops, 2))
            bound = ratio_bound(self.flops, self.onnxruntime_us, peak_gflops or 0.0, call_us)
            if bound is not None:
                out.update(gemm_peak_pct=round(100 * self.kernel_gflops / peak_gflops, 1),
                           ratio_bound=round(bound, 2))
        return out


def kernel_model(group: FusedGroup, kernel: GroupKernel, group_model: onnx.ModelProto) -> onnx.ModelProto:
    """The group's own model with its nodes replaced by the one custom node."""
    node, extra = custom_op_node(group, kernel)
    used = set(node.input)
    g = group_model.graph
    inits = [t for t in g.initializer if t.name in used] + extra
    graph = helper.make_graph([node], f"{group.name}_kernel", list(g.input), list(g.output), inits)
    opsets = list(group_model.opset_import) + [helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=group_model.ir_version)


def measure_group(
    group: FusedGroup,
    kernel: GroupKernel,
    group_model: onnx.ModelProto,
    library: Path,
    batches: tuple[int, ...] = (1, 64),
    threads: tuple[int, ...] = (1,),
) -> list[Measurement]:
    """Kernel vs onnxruntime on the group at every batch size (symbolic dims) and thread count."""
    kernel_proto = kernel_model(group, kernel, group_model)
    kernel_bytes = kernel_proto.SerializeToString()
    reference_bytes = group_model.SerializeToString()
    results = []
    for n_threads in threads:
        fused = timing_session(kernel_bytes, n_threads, library)
        original = timing_session(reference_bytes, n_threads)
        for batch in (batches if has_symbolic_inputs(original) else batches[:1]):
            feeds = random_feeds_for_session(original, default_dim=batch, seed=batch)
            moved = bytes_moved(kernel_proto, feeds, original.run(None, feeds))
            flops = multiply_add_flops(group_model, feeds)
            calls = [bound_call(fused, feeds), bound_call(original, feeds)]  # bench's call style
            once = [best_of_three(call) for call in calls]
            # Over CLEARLY_SLOWER times slower needs no careful rounds (a 50x slower convolution
            # would otherwise cost seconds per group to measure).
            clear = once[0] > CLEARLY_SLOWER * once[1]
            if clear:
                results.append(Measurement(batch, n_threads, once[0] * 1e6, once[1] * 1e6, moved, flops))
                continue
            kernel_s, ort_s = sample_until_sure(
                functools.partial(alternate_samples, calls, once, clock=round_clock(n_threads)))
            speedups = [o / k for k, o in zip(kernel_s, ort_s)]
            results.append(Measurement(batch, n_threads, statistics.median(kernel_s) * 1e6,
                                       statistics.median(ort_s) * 1e6, moved, flops, statistics.median(speedups),
                                       median_interval(speedups), len(speedups)))
    return results


def speed_verdict(band: tuple[float, float]) -> str:
    """A speedup band against NOT_SLOWER: 'not slower' when all of it is at or above, 'slower'
    when all of it is below, else 'unsure'."""
    low, high = band
    if low >= NOT_SLOWER:
        return "not slower"
    return "slower" if high < NOT_SLOWER else "unsure"


def sample_until_sure(sample, rounds: int = ROUNDS, widen: int = WIDEN_ROUNDS,
                      max_rounds: int = MAX_ROUNDS) -> tuple[list[float], list[float]]:
    """The kernel's and onnxruntime's seconds per round, from `sample(n)` (n more alternating
    rounds: ([kernel s], [onnxruntime s])), widened while the verdict on their round-by-round
    speedup is unsure and fewer than `max_rounds` were timed."""
    kernel_s, ort_s = (list(x) for x in sample(rounds))
    while len(kernel_s) < max_rounds:
        if speed_verdict(median_interval([o / k for k, o in zip(kernel_s, ort_s)])) != "unsure":
            break
        more_kernel, more_ort = sample(min(widen, max_rounds - len(kernel_s)))
        kernel_s += more_kernel
        ort_s += more_ort
    return kernel_s, ort_s


def alternate_samples(contenders, once: list[float], rounds: int = ROUNDS,
                      round_seconds: float = ROUND_SECONDS, clock=None) -> list[list[float]]:
    """Seconds per call of each contender, one sample per round, timed in alternating rounds
    (bench's timer) by `clock` (round_clock); `once` is one call's seconds per contender, to
    size the rounds."""
    reps = [calls_per_round(o, round_seconds) for o in once]
    return alternating_rounds(contenders, reps, rounds, clock=clock)


def kernel_is_worth_keeping(measurements: list[Measurement]) -> bool:
    """Surely not slower than onnxruntime beyond NOISE at any batch and thread count (a kernel
    1.7x faster at batch 1 must not be thrown away for timing 1% slower at batch 1000), faster
    on the whole (the geometric mean of its speedups is above 1: each batch size counts alike,
    not by its microseconds), and surely faster somewhere (a band above 1): a kernel that only
    ties leaves the group to onnxruntime."""
    speedups = [m.speedup for m in measurements]
    return (all(m.verdict == "not slower" for m in measurements) and statistics.geometric_mean(speedups) > 1
            and any(m.bounds[0] > 1 for m in measurements))


def why_dropped(measurements: list[Measurement]) -> str:
    """The report's reason for a kernel kernel_is_worth_keeping refused."""
    worst = min(measurements, key=lambda m: m.speedup)
    at = (f"({worst.onnxruntime_us:.1f} µs vs {worst.kernel_us:.1f} µs, {worst.speedup:.2f}x, at batch {worst.batch}, "
          f"{worst.threads} threads)")
    unsure = next((m for m in measurements if m.verdict == "unsure"), None)
    if worst.verdict == "slower":
        return f"measured: onnxruntime is faster {at}"
    if unsure is not None:
        low, high = unsure.bounds
        return (f"measured: not surely within {NOISE:.0%} of onnxruntime after {unsure.rounds} rounds at batch "
                f"{unsure.batch}, {unsure.threads} threads (speedup band {low:.3f}-{high:.3f}): onnxruntime kept")
    return f"measured: no faster than onnxruntime {at}"


@dataclass
class GroupVerdicts:
    """What measured selection decided, without touching the caller's outcomes: each timed
    group's measurements (report JSON), the groups to drop with why, and the gains of the kept."""

    measured: dict[str, list[dict]] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    gains_us: dict[str, float] = field(default_factory=dict)
    copy_gbs: float = 0.0
    gemm_peaks: dict[int, float] = field(default_factory=dict)
    call_floors: dict[int, float] = field(default_factory=dict)
    cached: list[str] = field(default_factory=list)  # groups whose measurements came from the decision cache

    def summary(self) -> dict:
        return {"copy_bandwidth_gbs": self.copy_gbs,
                "gemm_peak_gflops": {str(t): p for t, p in self.gemm_peaks.items()},
                "call_floor_us": {str(t): us for t, us in self.call_floors.items()},
                "decisions_cached": list(self.cached)}


def cached_measurements(decisions: DecisionCache | None, key: str, measure) -> tuple[list[Measurement], bool]:
    """The measurements stored under `key`, or `measure()`'s (then stored); and whether cached."""
    stored = decisions.load(key) if decisions is not None else None
    if stored is not None:
        try:
            return [Measurement(**{**m, "band": tuple(m["band"]) if m.get("band") else None}) for m in stored], True
        except TypeError:
            pass  # written by another layout of Measurement: time again
    measurements = measure()
    if decisions is not None:
        decisions.store(key, [dataclasses.asdict(m) for m in measurements])
    return measurements, False


def judge_groups(graph, kernels: dict[str, tuple[FusedGroup, GroupKernel]], library: Path,
                 batches: tuple[int, ...], threads: tuple[int, ...], note=lambda text: None,
                 decisions: DecisionCache | None = None) -> GroupVerdicts:
    """Time every kernel (all in `library`) against onnxruntime on its group's own nodes and
    decide which to keep (kernel_is_worth_keeping). With `decisions`, a kernel timed before on
    this machine class, on the same group, is not timed again (select/decisions.py)."""
    verdicts = GroupVerdicts(copy_gbs=copy_bandwidth_gbs(COPY_MEGABYTES))
    for name, (group, kernel) in kernels.items():
        group_model = extract_group(graph, group)
        key = decision_key("group", kernel.spec.name.encode() + group_model.SerializeToString(deterministic=True),
                           batches, threads)
        try:
            measurements, cached = cached_measurements(
                decisions, key, lambda: measure_group(group, kernel, group_model, library, batches, threads))  # noqa: B023
        except Exception as exc:  # random inputs the group's nodes refuse (dims that must agree), ...
            verdicts.dropped[name] = f"measured: could not be timed, so onnxruntime keeps it: {first_line(exc)}"
            note(f"{name}: not timed ({first_line(exc)}) → onnxruntime kept")
            continue
        for m in measurements:  # the GEMM peak and an empty call's cost, once per thread count that needs them
            if m.flops and m.threads not in verdicts.gemm_peaks:
                verdicts.gemm_peaks[m.threads] = gemm_peak_gflops(m.threads)
                verdicts.call_floors[m.threads] = call_floor_us(m.threads)
        verdicts.measured[name] = [m.to_json(verdicts.copy_gbs, verdicts.gemm_peaks.get(m.threads),
                                             verdicts.call_floors.get(m.threads, 0.0)) for m in measurements]
        keep = kernel_is_worth_keeping(measurements)
        if keep:
            verdicts.gains_us[name] = sum(m.gain_us for m in measurements)
        else:
            verdicts.dropped[name] = why_dropped(measurements)
        if cached:
            verdicts.cached.append(name)
        note(f"{name}: " + ("(timed before) " if cached else "") + ", ".join(
            f"batch {m.batch}×{m.threads}t: kernel {m.kernel_us:.1f} µs vs onnxruntime {m.onnxruntime_us:.1f} µs"
            for m in measurements) + ("" if keep else " → onnxruntime kept"))
    return verdicts
