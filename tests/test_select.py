"""`--select measured`: the decision rules and their bookkeeping (no timing assertions)."""

from __future__ import annotations

import json
import re

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx_builder import model, node, weights
from onnxfuse_cli.main import main
from test_optimize import MODELS, assert_outputs_match, random_inputs, run_both

import onnxfuse.select.measured
import onnxfuse.select.whole_model
from onnxfuse import optimize
from onnxfuse.select.measured import NOISE, Measurement, alternate_samples, kernel_is_worth_keeping, why_dropped
from onnxfuse.select.whole_model import TOLERANCE, Comparison, choose_kept, dropped_at, final_kept


def test_a_kernel_must_win_in_total_and_lose_nowhere_beyond_noise():
    assert kernel_is_worth_keeping([Measurement(1, 1, 5.0, 6.0), Measurement(64, 1, 50.0, 50.0)])
    # 1% slower at one batch is noise next to 1.7x faster at the other: kept
    assert kernel_is_worth_keeping([Measurement(1, 1, 5.0, 8.5), Measurement(1000, 1, 850.0, 842.0)])
    # clearly slower at one batch: dropped, however much it wins elsewhere
    assert not kernel_is_worth_keeping([Measurement(1, 1, 5.0, 8.5), Measurement(64, 2, 53.0, 50.0)])
    # no slower anywhere beyond noise, but no faster on the whole either: onnxruntime keeps it
    assert not kernel_is_worth_keeping([Measurement(1, 1, 5.0, 5.0), Measurement(64, 1, 50.5, 50.0)])


def test_round_by_round_speedup_decides_over_the_medians():
    """Medians say 2% slower (noise-level losses in a few rounds shift them); round by round the
    kernel is faster, and that is the verdict."""
    m = Measurement(1000, 1, kernel_us=51.0, onnxruntime_us=50.0, paired_speedup=1.01)
    assert m.speedup == 1.01 and m.to_json()["speedup"] == 1.01
    assert kernel_is_worth_keeping([m, Measurement(1, 1, 5.0, 6.0)])
    assert not kernel_is_worth_keeping([Measurement(64, 1, 50.0, 60.0, paired_speedup=1 / (1 + 2 * NOISE))])


def test_contenders_run_in_alternating_rounds():
    calls = []
    samples = alternate_samples([lambda: calls.append("a"), lambda: calls.append("b")], once=[1.0, 1.0],
                                rounds=3, round_seconds=0.0)
    assert [len(s) for s in samples] == [3, 3] and all(t >= 0 for s in samples for t in s)
    assert calls == ["a", "b", "b", "a", "a", "b"]  # turns flip every round


def test_measured_selection_records_both_times_and_keeps_results_correct(tmp_path):
    source = MODELS / "transformer_mlp.onnx"
    result = optimize(source, tmp_path / "t.fused.onnx", cache_dir=tmp_path / "cache", jobs=1,
                      select="measured", select_batches=(1, 4), threads=(1, 2))
    for group in result.report["groups"]:
        measured = group["measured"]
        assert [(m["batch"], m["threads"]) for m in measured] == [(1, 1), (4, 1), (1, 2), (4, 2)]
        kept = group["status"] in ("compiled", "cached")
        recorded = [Measurement(m["batch"], m["threads"], m["kernel_us"], m["onnxruntime_us"],
                                paired_speedup=m["speedup"], band=tuple(m["band"]) if "band" in m else None,
                                rounds=m.get("rounds", 0)) for m in measured]
        worth_it = kernel_is_worth_keeping(recorded)  # the rule, applied to what the report records
        assert worth_it or not kept
        if not worth_it:
            assert group["reason"].split("(")[0] == why_dropped(recorded).split("(")[0]  # the same kind of loss
        elif not kept:  # worth it alone, but the whole model was slower with it
            assert group["reason"].startswith("dropped by the whole-model check")
    expected, actual = run_both(source, result.model_path, random_inputs(source, 3))
    assert_outputs_match(expected, actual)


def test_measured_selection_refuses_kernels_this_machine_cannot_run(tmp_path):
    import pytest

    from onnxfuse.errors import UsageError

    with pytest.raises(UsageError, match="measured"):
        optimize(tmp_path / "not-even-read.onnx", tmp_path / "o.onnx", target="aarch64", select="measured")


# -- achieved bandwidth and compute (the rules themselves: test_roofline.py) --------------------

def test_cli_bench_groups_prints_each_measured_group(tmp_path):
    out = tmp_path / "groups.json"
    result = CliRunner().invoke(main, ["bench", str(MODELS / "lstm_gate.onnx"), "--groups", "--batch", "1,4",
                                       "--cache-dir", str(tmp_path / "cache"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    copy_gbs = report["measured"]["copy_bandwidth_gbs"]
    assert copy_gbs > 0 and f"copy bandwidth of this machine: {copy_gbs} GB/s" in result.output
    peak = report["measured"]["gemm_peak_gflops"]["1"]
    assert peak > 0 and f"GEMM peak at 1 thread(s): {peak} GFLOP/s" in result.output
    call_us = report["measured"]["call_floor_us"]["1"]
    assert call_us > 0 and f"an empty onnxruntime call: {call_us} µs" in result.output
    header, rule, *rows = result.output.splitlines()[2:]
    assert header.split()[:4] == ["group", "ops", "batch", "thr"] and "% copy" in header and "% peak" in header
    w = onnx.numpy_helper.to_array(onnx.load(str(MODELS / "lstm_gate.onnx")).graph.initializer[0])
    (group,) = report["groups"]  # X[N,64] @ W → ... → Y[N,64]: one group reading X and W, writing Y
    for m, row in zip(group["measured"], rows):
        batch = m["batch"]
        assert m["bytes"] == 2 * np.zeros((batch, 64), np.float32).nbytes + w.nbytes
        assert m["kernel_gbs"] == pytest.approx(m["bytes"] / m["kernel_us"] / 1e3, rel=1e-2)
        assert m["copy_bandwidth_pct"] == pytest.approx(100 * m["kernel_gbs"] / copy_gbs, abs=0.1)
        assert m["flops"] == 2 * batch * 64 * 192  # X[N,64] @ W[64,192]
        assert m["gemm_peak_pct"] == pytest.approx(100 * m["kernel_gflops"] / peak, abs=0.1)
        assert m["ratio_bound"] == pytest.approx(m["onnxruntime_us"] / (m["flops"] / peak / 1e3 + call_us), rel=1e-2)
        cells = re.split(r"\s{2,}", row.strip())
        assert cells[:4] == ["group_0", "7 [MatMul, Split, Sigmoid, … (4 more kinds)]", str(batch), "1"]
        assert cells[4:9] == [f"{m['kernel_us']:.1f}", f"{m['onnxruntime_us']:.1f}",
                              f"{m['speedup']:.2f}×", f"{m['kernel_gbs']:.2f}",
                              f"{m['copy_bandwidth_pct']:.1f}"]
        assert cells[9:13] == [f"{m['kernel_gflops']:.1f}", f"{m['gemm_peak_pct']:.1f}", f"{m['ratio_bound']:.2f}×", "yes"]
    assert [m["batch"] for m in group["measured"]] == [1, 4]


def test_cli_bench_groups_refuses_a_fused_model(tmp_path):
    result = CliRunner().invoke(main, ["bench", str(MODELS / "lstm_gate.onnx"), "--groups", "--fused", "x.onnx"])
    assert result.exit_code == 2 and "--groups" in result.output


# -- the whole-model check ------------------------------------------------------------------------

def fake_timer(culprits: set[str], log: list):
    """The model is 10% slower while any culprit is kept, else 10% faster than the original."""
    def time_model(kept):
        log.append(tuple(kept))
        ratio = 1.1 if culprits & set(kept) else 0.9
        return [Comparison(1, 1, ratio, 1.0, ratio)]
    return time_model


def test_whole_model_check_drops_the_least_gain_half_then_re_adds_what_the_model_can_take():
    gains = {"a": 1.0, "b": 50.0, "c": 3.0, "d": 100.0, "e": 2.0}
    log: list = []
    steps = choose_kept(gains, fake_timer({"e"}, log))
    assert log == ([("a", "e", "c", "b", "d")] * 2  # least gain first; slower, confirmed: 5 -> 2 left
                   + [("b", "d")]  # not slower
                   + [("b", "d", "c")] * 2  # the dropped ones again, most gain first: c gains, confirmed
                   + [("b", "d", "c", "e")]  # e (the culprit) does not
                   + [("b", "d", "c", "a")] * 2)  # a gains, confirmed
    assert final_kept(steps) == ("b", "d", "c", "a")
    assert {name: steps.index(step) for name, step in dropped_at(steps).items()} == {"e": 3}


def test_whole_model_check_re_adds_at_most_max_readds_groups():
    """The culprit has the most gain, so halving drops everything; re-adding tries the most-gain
    groups one by one and keeps all but the culprit, within the bound on tries."""
    gains = {f"g{i}": float(i) for i in range(8)}
    log: list = []
    steps = choose_kept(gains, fake_timer({"g7"}, log), max_readds=4)
    assert [len(kept) for kept in log] == [8, 8, 4, 4, 2, 2, 1, 1] + [1, 1, 2, 2, 3, 3]  # g7 alone: timed already
    assert final_kept(steps) == ("g6", "g5", "g4")
    assert set(dropped_at(steps)) == {"g7", "g3", "g2", "g1", "g0"}
    assert dropped_at(steps)["g7"].kept == ("g7",) and log.count(("g7",)) == 2


def test_re_adding_needs_a_confirmed_gain_not_just_the_tolerance():
    """Halving accepts a model within the tolerance; a re-added group must make the model faster
    than the original in two timings, or it stays out."""
    ratios = {("a", "b", "c"): [1.1, 1.1], ("c",): [1.01], ("c", "b"): [0.97, 1.0], ("c", "a"): [0.95, 0.96]}

    def time_model(kept):
        ratio = ratios[tuple(kept)].pop(0)
        return [Comparison(1, 1, ratio, 1.0, ratio)]

    steps = choose_kept({"a": 1.0, "b": 2.0, "c": 3.0}, time_model)
    assert [(s.kept, s.readd, s.accepted) for s in steps] == [
        (("a", "b", "c"), False, False), (("c",), False, True), (("c", "b"), True, False), (("c", "a"), True, True)]
    assert final_kept(steps) == ("c", "a") and set(dropped_at(steps)) == {"b"}
    assert not any(ratios.values())  # every timing above was taken, and no other


def test_whole_model_check_can_drop_every_group():
    gains = {f"g{i}": float(i) for i in range(4)}
    steps = choose_kept(gains, fake_timer(set(gains), []))
    assert final_kept(steps) == () and set(dropped_at(steps)) == set(gains)


def test_whole_model_check_does_not_drop_on_one_slow_timing():
    timings = iter([1.1, 0.99])  # slower once, then not: noise, nothing is dropped

    def time_model(kept):
        ratio = next(timings)
        return [Comparison(1, 1, ratio, 1.0, ratio)]

    steps = choose_kept({"a": 1.0, "b": 2.0}, time_model)
    assert final_kept(steps) == ("a", "b") and dropped_at(steps) == {}


def test_whole_model_check_needs_no_timing_without_groups_and_tolerates_noise():
    assert choose_kept({}, fake_timer(set(), [])) == [] and final_kept([]) == ()
    within = Comparison(1, 1, 1.0 + TOLERANCE / 2, 1.0, 1.0 + TOLERANCE / 2)
    assert not within.slower and Comparison(1, 1, 1.1, 1.0, 1.0 + 2 * TOLERANCE).slower


def two_groups(path):
    """y1 = sigmoid(x * w1), y2 = tanh(x + w2): two groups, two kernels."""
    onnx.save(model([node("Mul", ["x", "w1"], "m1"), node("Sigmoid", ["m1"], "y1"),
                     node("Add", ["x", "w2"], "a2"), node("Tanh", ["a2"], "y2")],
                    {"x": ("N", 16)}, {"y1": ("N", 16), "y2": ("N", 16)},
                    {"w1": weights(16), "w2": weights(16, seed=1)}), str(path))
    return path


@pytest.fixture(scope="module")
def kernel_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kernels")


def test_whole_model_check_runs_and_is_recorded(tmp_path, kernel_cache, monkeypatch):
    """Real whole-model timings (every kernel passes the per-group stage, so the check has work);
    whatever they say, the report explains it and the output still matches onnxruntime."""
    monkeypatch.setattr(onnxfuse.select.measured, "kernel_is_worth_keeping", lambda measurements: True)
    source = two_groups(tmp_path / "two.onnx")
    result = optimize(source, tmp_path / "out" / "two.fused.onnx", cache_dir=kernel_cache, jobs=1,
                      select="measured", select_batches=(1, 4))
    report = result.report
    check = report["measured"]["whole_model_check"]
    assert check["tolerance"] == TOLERANCE and check["steps"]
    assert set(check["steps"][0]["kept"]) == {"group_0", "group_1"}
    assert all([(t["batch"], t["threads"]) for t in s["timings"]] == [(1, 1), (4, 1)] for s in check["steps"])
    accepted = [s for s in check["steps"] if s["accepted"]]
    kept = set(accepted[-1]["kept"]) if accepted else set()
    for group in report["groups"]:
        if group["name"] in kept:
            assert group["status"] in ("compiled", "cached")
        else:
            assert group["status"] == "fallback" and group["reason"].startswith("dropped by the whole-model check")
    expected, actual = run_both(source, result.model_path, random_inputs(source, 3))
    assert_outputs_match(expected, actual)


def test_groups_dropped_by_the_whole_model_check_leave_the_library(tmp_path, kernel_cache, monkeypatch):
    source = two_groups(tmp_path / "two.onnx")
    every = optimize(source, tmp_path / "all" / "two.fused.onnx", cache_dir=kernel_cache, jobs=1, select="all")
    kernels = {g["name"]: g["kernel"] for g in every.report["groups"]}
    monkeypatch.setattr(onnxfuse.select.measured, "kernel_is_worth_keeping", lambda measurements: True)
    monkeypatch.setattr(onnxfuse.select.measured.Measurement, "gain_us", property(lambda m: 0.0))  # ties: plan order
    monkeypatch.setattr(onnxfuse.select.whole_model, "time_against_original", lambda original, fused, *args: (
        [Comparison(1, 1, 1.1, 1.0, 1.1)] if kernels["group_0"] in fused.decode("latin-1") else
        [Comparison(1, 1, 1.0, 1.0, 1.0)]))
    result = optimize(source, tmp_path / "out" / "two.fused.onnx", cache_dir=kernel_cache, jobs=1,
                      select="measured", select_batches=(1,))
    status = {g["name"]: g for g in result.report["groups"]}
    assert status["group_0"]["status"] == "fallback" and status["group_1"]["status"] in ("compiled", "cached")
    assert status["group_0"]["reason"].startswith("dropped by the whole-model check: the model with it ran 1.1 ms "
                                                  "vs onnxruntime 1 ms")
    library = result.library_path.read_bytes()
    assert kernels["group_1"].encode() in library and kernels["group_0"].encode() not in library
    expected, actual = run_both(source, result.model_path, random_inputs(source, 3))
    assert_outputs_match(expected, actual)
