"""Measured decisions are sure before they count: bands of the median speedup, widening while a
verdict is unsure, onnxruntime kept when it stays unsure. Synthetic timings only."""

from __future__ import annotations

import numpy as np
import pytest

from onnxfuse.measure.timing import median_interval
from onnxfuse.select.measured import (
    MAX_ROUNDS,
    NOISE,
    NOT_SLOWER,
    ROUNDS,
    Measurement,
    kernel_is_worth_keeping,
    sample_until_sure,
    speed_verdict,
    why_dropped,
)
from onnxfuse.select.whole_model import TOLERANCE, Comparison, Step, ratio_verdict, ratios_until_sure


def test_the_median_band_takes_the_order_statistics_of_the_binomial_tails():
    assert median_interval(list(range(1, 16))) == (4, 12)  # 15 rounds: 4th and 12th smallest, 96.5%
    assert median_interval(list(range(1, 31))) == (10, 21)
    assert median_interval([3, 1, 2, 5, 4]) == (1, 5)  # too few rounds for 95%: the whole range
    assert median_interval([2.0]) == (2.0, 2.0)
    with pytest.raises(ValueError):
        median_interval([])


def test_the_band_holds_the_median_about_as_often_as_it_says():
    rng = np.random.default_rng(0)
    trials = 2000
    held = sum(lo <= 0.0 <= hi for lo, hi in (median_interval(rng.standard_normal(15)) for _ in range(trials)))
    assert 0.95 <= held / trials <= 0.985  # nominal 96.5% for 15 rounds


def test_a_speedup_band_is_not_slower_slower_or_unsure_against_the_noise_threshold():
    assert speed_verdict((NOT_SLOWER, 1.3)) == "not slower"
    assert speed_verdict((0.8, NOT_SLOWER - 1e-9)) == "slower"
    assert speed_verdict((0.9, 1.1)) == "unsure"
    assert NOT_SLOWER == pytest.approx(1 / (1 + NOISE))


def band_of(speedup, low, high, batch=1, rounds=ROUNDS):
    return Measurement(batch, 1, 10.0, 10.0 * speedup, paired_speedup=speedup, band=(low, high), rounds=rounds)


def test_a_kernel_is_kept_only_when_surely_not_slower_anywhere_and_surely_faster_somewhere():
    fast, tie = band_of(1.5, 1.3, 1.7), band_of(0.995, 0.985, 1.01, batch=1000)
    assert kernel_is_worth_keeping([fast, tie])  # a 0.5% loss inside the noise does not cost a 1.5x win
    assert not kernel_is_worth_keeping([fast, band_of(0.97, 0.9, 1.05, batch=64)])  # unsure at 64
    assert not kernel_is_worth_keeping([fast, band_of(0.9, 0.88, 0.93, batch=64)])  # surely slower at 64
    assert not kernel_is_worth_keeping([tie, band_of(1.01, 0.99, 1.03, batch=64)])  # ties only: onnxruntime
    # without a band (one call each, far slower): judged on the speedup itself
    assert not kernel_is_worth_keeping([Measurement(64, 1, 300.0, 10.0)])


def test_the_reason_for_a_dropped_kernel_says_whether_it_lost_or_stayed_unsure():
    assert why_dropped([band_of(0.9, 0.88, 0.93)]).startswith("measured: onnxruntime is faster")
    unsure = why_dropped([band_of(1.5, 1.3, 1.7), band_of(0.99, 0.9, 1.08, batch=64, rounds=MAX_ROUNDS)])
    assert f"after {MAX_ROUNDS} rounds at batch 64" in unsure and "0.900-1.080" in unsure
    assert why_dropped([band_of(1.0, 0.99, 1.01)]).startswith("measured: no faster than onnxruntime")


def scripted(speedups: list[float]):
    """A sampler giving onnxruntime 1 s per round and the kernel 1/speedup s, in script order;
    records how many rounds each call asked for."""
    asked = []
    queue = list(speedups)

    def sample(rounds):
        asked.append(rounds)
        taken = [queue.pop(0) for _ in range(rounds)]
        return [1 / s for s in taken], [1.0] * rounds
    return sample, asked


def test_a_sure_verdict_needs_no_more_rounds():
    sample, asked = scripted([1.5] * ROUNDS)
    kernel_s, ort_s = sample_until_sure(sample)
    assert asked == [ROUNDS] and len(kernel_s) == len(ort_s) == ROUNDS


def test_an_unsure_verdict_is_widened_until_it_is_sure():
    noisy = [0.9, 1.1] * 7 + [1.0]  # 15 rounds straddling the threshold
    sample, asked = scripted(noisy + [1.2] * 45)
    kernel_s, _ = sample_until_sure(sample)
    speedups = [1 / k for k in kernel_s]
    assert asked == [ROUNDS, 15] and speed_verdict(median_interval(speedups)) == "not slower"


def test_widening_stops_at_max_rounds_and_the_kernel_then_is_not_kept():
    sample, asked = scripted([0.9, 1.1] * 40)
    kernel_s, ort_s = sample_until_sure(sample, max_rounds=40)
    assert sum(asked) == len(kernel_s) == 40
    speedups = [o / k for k, o in zip(kernel_s, ort_s)]
    m = Measurement(1, 1, 1.0, 1.0, paired_speedup=float(np.median(speedups)), band=median_interval(speedups),
                    rounds=len(speedups))
    assert m.verdict == "unsure" and not kernel_is_worth_keeping([m, band_of(2.0, 1.8, 2.2, batch=64)])


@pytest.mark.parametrize(("true_speedup", "kept"), [(1.3, True), (0.9, False), (1.0, False)])
def test_the_decision_does_not_flip_on_noise(true_speedup, kept):
    """50 runs of the same kernel under heavy synthetic noise (10% jitter per round, one round in
    six hit by another job at 1.5-3x) reach the same decision every time."""
    decisions = set()
    for seed in range(50):
        rng = np.random.default_rng(seed)

        def sample(rounds, rng=rng):
            ort = rng.lognormal(0, 0.1, rounds) * np.where(rng.random(rounds) < 1 / 6, rng.uniform(1.5, 3, rounds), 1)
            kernel = rng.lognormal(0, 0.1, rounds) / true_speedup
            kernel *= np.where(rng.random(rounds) < 1 / 6, rng.uniform(1.5, 3, rounds), 1)
            return list(kernel), list(ort)

        measurements = []
        for batch in (1, 64, 1000):
            kernel_s, ort_s = sample_until_sure(sample)
            speedups = [o / k for k, o in zip(kernel_s, ort_s)]
            measurements.append(Measurement(batch, 1, 1.0, 1.0, paired_speedup=float(np.median(speedups)),
                                            band=median_interval(speedups), rounds=len(speedups)))
        decisions.add(kernel_is_worth_keeping(measurements))
    assert decisions == {kept}


def test_a_whole_model_comparison_counts_as_not_slower_only_when_its_band_is_within_the_tolerance():
    assert ratio_verdict((0.9, 1 + TOLERANCE)) == "not slower"
    assert ratio_verdict((1 + TOLERANCE + 1e-9, 1.2)) == "slower"
    assert ratio_verdict((0.99, 1.05)) == "unsure"
    assert not Comparison(1, 1, 1.0, 1.0, 0.98, band=(0.95, 1.01)).slower
    assert Comparison(1, 1, 1.0, 1.0, 0.98, band=(0.9, 1.06)).slower  # unsure counts as slower
    assert not Comparison(1, 1, 1.0, 1.0, 1.0 + TOLERANCE / 2).slower  # no band: the ratio alone


def test_a_re_added_group_must_be_faster_and_surely_within_the_tolerance():
    faster_sure = Comparison(1, 1, 0.9, 1.0, 0.9, band=(0.85, 0.95))
    faster_unsure = Comparison(1, 1, 0.9, 1.0, 0.9, band=(0.7, 1.1))
    assert Step(("a",), (faster_sure,), readd=True).accepted
    assert not Step(("a",), (faster_unsure,), readd=True).accepted


def test_whole_model_timings_widen_until_sure_or_the_limit():
    ratios = iter([0.95, 1.1] * 7 + [1.0] + [0.9] * 15)

    def sample(rounds):
        taken = [next(ratios) for _ in range(rounds)]
        return taken, [1.0] * rounds

    fused_s, _ = ratios_until_sure(sample)
    assert len(fused_s) == 30 and ratio_verdict(median_interval(fused_s)) == "not slower"
    stuck = iter([0.9, 1.2] * 40)
    fused_s, _ = ratios_until_sure(lambda n: ([next(stuck) for _ in range(n)], [1.0] * n), max_rounds=40)
    assert len(fused_s) == 40 and ratio_verdict(median_interval(fused_s)) == "unsure"
