"""`--select measured`, second stage: the whole fused model must not be slower than the original.

Timing each group against its own nodes cannot see what a custom node costs its neighbours:
onnxruntime optimizes across op boundaries (fusions, layout transformations) and an opaque node
in the middle can block that (shufflenet: every kept group wins alone, the whole model was 0.78x
of onnxruntime). So, after the per-group selection, the whole output model is timed against
the original; while it is slower by more than TOLERANCE, the kept groups with the least measured
gain are dropped, half of the kept set at a time: a model with many groups costs a handful of
whole-model timings, not one per group. Then the dropped groups with the most gain are tried
again one at a time (at most MAX_READDS), and kept where the model then beats the original.

Each comparison is sure before it counts: the 95% band of the round-by-round ratio
(measure/timing.median_interval) must lie on one side of 1 + TOLERANCE; while it straddles it,
WIDEN_ROUNDS more rounds are timed, up to MAX_ROUNDS. A model still unsure then counts as
slower: onnxruntime keeps what could not be shown not to lose.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import first_line
from ..fusion.plan import FusedGroup
from ..ir import Graph
from ..kernel_spec import GroupKernel
from ..measure.inputs import random_feeds_for_session
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
from ..package import package_model
from ..report import whole_model_step_line
from .decisions import DecisionCache, decision_key

TOLERANCE = 0.02  # slower by up to 2% counts as not slower: whole-model timings on a shared VM vary that much
ROUNDS = 15
WIDEN_ROUNDS = 15  # rounds added while a comparison is unsure
MAX_ROUNDS = 45  # still unsure after this many: counted as slower
MAX_READDS = 8  # dropped groups tried again one by one, most gain first: each try is one whole-model timing
ROUND_SECONDS = 0.02  # whole models: longer rounds than per-group timing, to average over more calls
TIMED_MODEL_LIMIT = 1_800_000_000  # bytes: a larger model cannot be serialized into one protobuf to time


@dataclass(frozen=True)
class Comparison:
    """The fused model against the original at one batch size and thread count: median ms per call
    of each, and the median over rounds of fused / original time in the same round.

    The decision uses that paired ratio: both models ran moments apart in each round, so a change
    in the machine's load between rounds cancels out (on this shared VM, six repeats with the very
    same two models gave ratios of medians over 0.96-1.02, paired ratios over 0.95-0.98).
    """

    batch: int
    threads: int
    fused_ms: float
    onnxruntime_ms: float
    ratio: float
    band: tuple[float, float] | None = None  # 95% band of the ratio; None: the ratio alone (one value)
    rounds: int = 0

    @property
    def slower(self) -> bool:
        """Not surely within TOLERANCE of the original: the band reaches above 1 + TOLERANCE."""
        return ratio_verdict(self.band or (self.ratio, self.ratio)) != "not slower"

    def to_json(self) -> dict:
        out = {"batch": self.batch, "threads": self.threads, "fused_ms": round(self.fused_ms, 4),
               "onnxruntime_ms": round(self.onnxruntime_ms, 4), "ratio": round(self.ratio, 3)}
        if self.band is not None:
            out.update(band=[round(x, 3) for x in self.band], rounds=self.rounds)
        return out


def ratio_verdict(band: tuple[float, float]) -> str:
    """A fused/original time-ratio band against 1 + TOLERANCE: 'not slower' when all of it is at
    or below, 'slower' when all of it is above, else 'unsure'."""
    low, high = band
    if high <= 1 + TOLERANCE:
        return "not slower"
    return "slower" if low > 1 + TOLERANCE else "unsure"


def ratios_until_sure(sample, rounds: int = ROUNDS, widen: int = WIDEN_ROUNDS,
                      max_rounds: int = MAX_ROUNDS) -> tuple[list[float], list[float]]:
    """Fused and original seconds per round from `sample(n)` (n more alternating rounds), widened
    while the verdict on their round-by-round ratio is unsure and under `max_rounds` were timed."""
    fused_s, ort_s = (list(x) for x in sample(rounds))
    while len(fused_s) < max_rounds and ratio_verdict(median_interval([f / o for f, o in zip(fused_s, ort_s)])) == "unsure":
        more_fused, more_ort = sample(min(widen, max_rounds - len(fused_s)))
        fused_s += more_fused
        ort_s += more_ort
    return fused_s, ort_s


@dataclass(frozen=True)
class Step:
    """One whole-model timing: the groups kept (least gain first) and how the model compared.

    A halving step is accepted when the model is not slower (within TOLERANCE); a re-add step
    (readd=True, one dropped group tried again) only when the model is faster than the original
    outright: a group is re-added for a gain, not for staying within the noise."""

    kept: tuple[str, ...]
    comparisons: tuple[Comparison, ...]
    readd: bool = False

    @property
    def slower(self) -> bool:
        return any(c.slower for c in self.comparisons)

    @property
    def accepted(self) -> bool:
        return all(c.ratio < 1 and not c.slower for c in self.comparisons) if self.readd else not self.slower

    @property
    def worst(self) -> Comparison:
        return max(self.comparisons, key=lambda c: c.ratio)

    def to_json(self) -> dict:
        return {"kept": list(self.kept), "readd": self.readd, "accepted": self.accepted,
                "timings": [c.to_json() for c in self.comparisons]}


def choose_kept(gains: dict[str, float], time_model: Callable[[Sequence[str]], Sequence[Comparison]],
                max_readds: int = MAX_READDS) -> list[Step]:
    """Time the model with every group of `gains` kept; while slower, drop the least-gain half;
    then try the dropped groups again one at a time (most gain first, at most `max_readds`).

    `gains` maps group name → measured gain (onnxruntime µs − kernel µs); `time_model(kept)` times
    the model with those groups fused. Halving finds a model that is not slower in a few timings
    but can drop more than the culprit (a group that blocks an onnxruntime fusion need not have
    the least gain); re-adding keeps a dropped group where the model then beats the original.
    A verdict that drops or adds groups is confirmed by a second timing (the step records the
    repeat): one timing can be a few % off here. Returns every step; the groups kept in the end
    are those of the last accepted step.
    """
    def timed(kept: Sequence[str], readd: bool = False) -> Step:
        step = Step(tuple(kept), tuple(time_model(kept)), readd)
        if step.accepted == readd:  # would change the kept set: confirm
            step = Step(tuple(kept), tuple(time_model(kept)), readd)
        return step

    kept = sorted(gains, key=lambda name: gains[name])
    steps: list[Step] = []
    while kept:
        steps.append(timed(kept))
        if steps[-1].accepted:
            break
        kept = kept[(len(kept) + 1) // 2:]
    if not steps or steps[0].accepted:
        return steps  # nothing dropped
    accepted = list(final_kept(steps))
    dropped = sorted((name for name in gains if name not in accepted), key=lambda name: -gains[name])
    tried = {frozenset(step.kept) for step in steps}
    for name in dropped[:max_readds]:
        if frozenset([*accepted, name]) in tried:
            continue  # timed slower already (a halving step with exactly these groups)
        steps.append(timed([*accepted, name], readd=True))
        if steps[-1].accepted:
            accepted.append(name)
    return steps


def final_kept(steps: Sequence[Step]) -> tuple[str, ...]:
    """The groups of the last accepted step (none if no step was)."""
    accepted = [step for step in steps if step.accepted]
    return accepted[-1].kept if accepted else ()


def dropped_at(steps: Sequence[Step]) -> dict[str, Step]:
    """Each dropped group → the step that dropped or refused it (the last one it took part in)."""
    kept = set(final_kept(steps))
    out: dict[str, Step] = {}
    for step in steps:
        for name in step.kept:
            if name not in kept:
                out[name] = step  # later steps overwrite: the last timing the group took part in
    return out


def time_against_original(original: bytes, fused: bytes, library, batches: Sequence[int],
                          threads: Sequence[int]) -> list[Comparison]:
    """The fused model (with `library` registered) against the original, both ORT_ENABLE_ALL, in
    alternating rounds at every batch size (symbolic dims) and thread count."""
    results = []
    for n_threads in threads:
        fused_session, original_session = timing_session(fused, n_threads, library), timing_session(original, n_threads)
        for batch in (batches if has_symbolic_inputs(original_session) else batches[:1]):
            feeds = random_feeds_for_session(original_session, default_dim=batch, seed=batch)
            fused_feeds = {i.name: feeds[i.name] for i in fused_session.get_inputs()}
            calls = [bound_call(fused_session, fused_feeds), bound_call(original_session, feeds)]
            reps = [calls_per_round(best_of_three(call), ROUND_SECONDS) for call in calls]
            fused_s, ort_s = ratios_until_sure(
                functools.partial(alternating_rounds, calls, reps, clock=round_clock(n_threads)))
            ratios = [f / o for f, o in zip(fused_s, ort_s)]
            results.append(Comparison(batch, n_threads, statistics.median(fused_s) * 1e3,
                                      statistics.median(ort_s) * 1e3, statistics.median(ratios),
                                      median_interval(ratios), len(ratios)))
    return results


@dataclass
class WholeModelVerdict:
    """The groups the whole-model check drops (name → why) and what the report records of it."""

    dropped: dict[str, str]
    summary: dict


def replayed(recorded: list | None, time_model: Callable[[Sequence[str]], Sequence[Comparison]]):
    """A time_model that returns the `recorded` timings in order (then times for real), and the
    list of every timing it returned, to store: choose_kept, given the same timings, takes the
    same steps."""
    pending = list(recorded or [])
    returned: list[list[dict]] = []

    def timed(names):
        if pending:
            comparisons = [Comparison(**{**c, "band": tuple(c["band"]) if c.get("band") else None})
                           for c in pending.pop(0)]
        else:
            comparisons = list(time_model(names))
        returned.append([dataclasses.asdict(c) for c in comparisons])
        return comparisons
    return timed, returned


def check_whole_model(graph: Graph, kept: dict[str, tuple[FusedGroup, GroupKernel]], gains: dict[str, float],
                      library, target_name: str, batches: Sequence[int], threads: Sequence[int],
                      note=lambda text: None, decisions: DecisionCache | None = None) -> WholeModelVerdict:
    """Drop kept groups, least gain first, while the whole fused model is slower than the original.
    With `decisions`, the timings of an earlier run on this machine class with the same model,
    kernels and gains are replayed instead of taken again (select/decisions.py)."""
    if graph.model.ByteSize() > TIMED_MODEL_LIMIT:
        return WholeModelVerdict({}, {"skipped": "the model is too large to time from memory"})
    original = graph.model.SerializeToString()

    def time_model(names):
        fused = package_model(graph, [kept[n] for n in names], library.name, target_name)
        return time_against_original(original, fused.SerializeToString(), library, batches, threads)

    kernels = json.dumps(sorted((name, kept[name][1].spec.name, gains[name]) for name in gains)).encode()
    key = decision_key("model", original + kernels, batches, threads)
    recorded = decisions.load(key) if decisions is not None else None
    timed, timings = replayed(recorded, time_model)
    try:
        steps = choose_kept(gains, timed)
    except Exception as exc:  # e.g. onnxruntime rejects random inputs for the whole model
        return WholeModelVerdict({}, {"skipped": f"the whole model could not be timed: {first_line(exc)}"})
    if decisions is not None and timings != recorded:
        decisions.store(key, timings)
    for step in steps:
        note(whole_model_step_line(step.to_json()))
    dropped = {}
    for name, step in dropped_at(steps).items():
        worst = step.worst
        verdict = "tried again, not faster than onnxruntime" if step.readd else f"not surely within the {TOLERANCE:.0%} tolerance"
        dropped[name] = (f"dropped by the whole-model check: the model with it ran {worst.fused_ms:.4g} ms vs "
                         f"onnxruntime {worst.onnxruntime_ms:.4g} ms (batch {worst.batch}, {worst.threads} threads; "
                         f"{worst.ratio:.3f}× in paired rounds, {verdict})")
    return WholeModelVerdict(dropped, {"tolerance": TOLERANCE, "steps": [s.to_json() for s in steps],
                                       "timed_before": recorded is not None})
