"""Timing contenders side by side: alternating rounds, medians, round-by-round ratios.

Why the measurement is shaped this way:
- Contenders are timed in alternating rounds and we report the median (p10/p90 for spread) of
  the rounds; each round starts once the previous contender's pool threads (TVM's spin after a
  call) have gone idle (idle.py), so no contender runs beside another one's spin. onnxruntime
  sessions run with spinning off (timing_session_options says why).
- A contender is timed only after its outputs matched the reference: a fast wrong answer is
  not a result. A mismatching contender is refused (reported, never timed).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from ..errors import short_reason
from ..session import quiet_session_options
from ..verify import compare_arrays
from . import idle

ROUNDS = 15
ROUND_SECONDS = 0.02  # each contender runs about this long per round
BUDGET_SECONDS = 20.0  # a slow model gets fewer rounds (never fewer than MIN_ROUNDS) to stay near this
MIN_ROUNDS = 5
CHECK_RTOL, CHECK_ATOL, CHECK_NORM_RTOL = 1e-3, 1e-4, 1e-4


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
    samples: tuple[float, ...] = ()  # seconds per call in each round, in round order (to pair any two contenders)
    paired_band: tuple[float, float] | None = None  # the 95% interval of paired_speedup (median_interval)
    bitwise_equal: bool | None = None  # outputs bit for bit the reference's (None: not checked)

    def to_json(self) -> dict:
        out = {"median_ms": _ms(self.median), "p10_ms": _ms(self.p10), "p90_ms": _ms(self.p90),
               "rounds": self.rounds, "calls_per_round": self.calls_per_round}
        if self.paired_speedup is not None:
            out["paired_speedup"] = round(self.paired_speedup, 3)
        if self.paired_band is not None:
            out["paired_band"] = [round(x, 3) for x in self.paired_band]
        if self.samples:
            out["round_ms"] = [_ms(x) for x in self.samples]
        if self.bitwise_equal is not None:
            out["bitwise_equal"] = self.bitwise_equal
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
    shared = [name for name in reference if name in actual]
    if not shared:
        return f"no output in common with the original (has {sorted(actual)}, expected {sorted(reference)})"
    for name in shared:
        cmp = compare_arrays(name, np.asarray(reference[name]), np.asarray(actual[name]),
                             CHECK_RTOL, CHECK_ATOL, CHECK_NORM_RTOL)
        if not cmp.ok:
            return f"output {name} differs from the original (max abs error {cmp.max_abs_error:.3g})"
    return None


def bitwise_equal(reference: dict[str, np.ndarray], actual: dict[str, np.ndarray]) -> bool:
    """Whether every output `actual` shares with `reference` has its dtype, shape and bytes: the
    same answers bit for bit, which a tolerance check cannot tell from close ones."""
    shared = [name for name in reference if name in actual]
    return bool(shared) and all(_same_bits(np.asarray(reference[n]), np.asarray(actual[n])) for n in shared)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def round_clock(threads: int) -> Callable[[], float]:
    """The clock that times a round at `threads` intra-op threads: the calling thread's CPU time
    at 1 thread, wall time otherwise.

    At 1 thread onnxruntime runs every node, and our kernels, on the calling thread, so its CPU
    time is the whole cost of a call, without the time other processes held the core. On this
    2-vCPU VM under a load of 6, branchy_cell_ts at batch 1 measured 50-80 us per call by the wall
    clock (bands of the speedup 0.36-1.44 wide, the same model against itself 0.63-1.35) and 9.5-11.4 us
    by CPU time, three repeats agreeing to 0.02 (kernel 0.86-0.88x, the same model against
    itself 1.02-1.03x). With a pool, its threads' work would be missed: wall time there."""
    return time.thread_time if threads == 1 else time.perf_counter


def race(contenders: Sequence[Contender], reference: dict[str, np.ndarray], rounds: int = ROUNDS,
         round_seconds: float = ROUND_SECONDS, budget_seconds: float = BUDGET_SECONDS,
         clock: Callable[[], float] | None = None) -> dict[str, Timing | str]:
    """Check every contender against `reference` (but those with checked=False), then time the ones
    that match in alternating rounds (timed by `clock`, round_clock; default: wall time).

    Returns contender name → Timing, or → the reason it was not timed (failed or differed). A
    checked contender's Timing also says whether its outputs were the reference's bit for bit.
    """
    results: dict[str, Timing | str] = {}
    exact: dict[str, bool | None] = {}
    timed: list[tuple[Contender, int]] = []
    round_cost = 0.0
    for contender in contenders:
        try:
            result = contender.call()  # also the warm-up
            exact[contender.name] = None
            if contender.checked:
                outputs = contender.outputs(result)
                mismatch = check_outputs(reference, outputs)
                if mismatch is not None:
                    results[contender.name] = f"refused: {mismatch}"
                    continue
                exact[contender.name] = bitwise_equal(reference, outputs)
            start = time.perf_counter()
            contender.call()
            once = max(time.perf_counter() - start, 1e-7)
        except Exception as exc:
            results[contender.name] = f"failed: {short_reason(exc)}"
            continue
        if once * MIN_ROUNDS > budget_seconds:  # too slow for rounds: its one timed call is the result
            results[contender.name] = Timing(once, once, once, rounds=1, calls_per_round=1,
                                             bitwise_equal=exact[contender.name])
            continue
        reps = calls_per_round(once, round_seconds)
        timed.append((contender, reps))
        round_cost += reps * once
    rounds = max(min(rounds, MIN_ROUNDS), min(rounds, int(budget_seconds / max(round_cost, 1e-9))))

    samples = alternating_rounds([c.call for c, _ in timed], [reps for _, reps in timed], rounds, clock=clock)
    # Ratios are taken round by round against the first contender (the baseline) when it was timed
    # in rounds too: a VM that slows down for a few rounds then slows both sides of each ratio.
    baseline = samples[0] if timed and timed[0][0] is contenders[0] else None
    for (contender, reps), s in zip(timed, samples):
        p10, p90 = np.percentile(s, [10, 90])
        ratios = [b / x for b, x in zip(baseline, s)] if baseline is not None else None
        paired = statistics.median(ratios) if ratios else None
        band = median_interval(ratios) if ratios else None
        results[contender.name] = Timing(statistics.median(s), float(p10), float(p90), rounds, reps, paired,
                                         tuple(s), band, exact[contender.name])
    return {c.name: results[c.name] for c in contenders}


def median_interval(samples: Sequence[float], confidence: float = 0.95) -> tuple[float, float]:
    """An interval that holds the true median of what `samples` were drawn from with at least
    `confidence` (or the whole range, when there are too few samples for that).

    Distribution-free: the median lies below the k-th smallest of n samples with the binomial
    probability P(Binomial(n, 1/2) >= k), whatever the timings' distribution (skewed, with a
    few rounds hit by another job); so the interval is [k-th smallest, k-th largest] for the
    largest k that keeps both tails within (1 - confidence) / 2. 15 rounds give the 4th and
    12th of the sorted ratios (96%)."""
    ordered = sorted(samples)
    n = len(ordered)
    if n == 0:
        raise ValueError("no samples")
    tail = (1 - confidence) / 2
    k, below = 0, 0.0  # below: P(Binomial(n, 1/2) <= k - 1), the chance the median is under the k-th
    while k < n // 2:
        below_next = below + math.comb(n, k) / 2**n
        if below_next > tail:
            break
        below, k = below_next, k + 1
    lo = max(k - 1, 0)
    return ordered[lo], ordered[n - 1 - lo]


def calls_per_round(once: float, round_seconds: float) -> int:
    """How many calls of `once` seconds fill one round (at least 1, at most 10,000)."""
    return max(1, min(10_000, int(round_seconds / max(once, 1e-7))))


def alternating_rounds(calls: Sequence[Callable[[], object]], reps: Sequence[int], rounds: int,
                       wait_until_idle: Callable[[], object] = idle.wait_until_idle,
                       clock: Callable[[], float] | None = None) -> list[list[float]]:
    """Seconds per call of each of `calls`, one sample per round, the calls taking turns.

    Taking turns matters: a slow phase of the machine then slows every contender alike, and
    caches stay warm for whoever runs next. The order flips every round (a b, b a, a b, ...), so
    no contender always runs right after the same other one. Each contender's round starts once
    the previous one's pool threads have stopped spinning (idle.wait_until_idle): TVM's pool
    spins after every call, and a spinning neighbour would take a core from the next round.
    """
    clock = clock or time.perf_counter  # looked up per call: wall time unless round_clock says otherwise
    samples: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for k in order:
            call = calls[k]
            if len(calls) > 1:
                wait_until_idle()
            start = clock()
            for _ in range(reps[k]):
                call()
            samples[k].append((clock() - start) / reps[k])
    return samples


def best_of_three(run) -> float:
    """Seconds of the fastest of three calls, after a warm-up call."""
    run()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


# -- onnxruntime sessions timed side by side ------------------------------------------------------

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
    options = quiet_session_options()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def bound_io(session, feeds: dict[str, np.ndarray]):
    """An IOBinding with `feeds` as inputs and outputs pre-allocated by onnxruntime (aligned, as
    its own outputs are) at the shapes one plain run gives; `feeds` must outlive the binding."""
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
    options = timing_session_options(threads)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if library is not None:
        options.register_custom_ops_library(str(library))
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def has_symbolic_inputs(session) -> bool:
    """Whether any input dimension is symbolic (then the batch sizes apply; else its own shapes)."""
    return any(isinstance(d, str) or d is None for i in session.get_inputs() for d in i.shape)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 5)
