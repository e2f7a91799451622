"""Measured verdicts cached by content (select/decisions.py): a second run times nothing and
decides the same. Synthetic timings, but for the end-to-end run, which asserts no time."""

from __future__ import annotations

import onnx
from onnx_builder import model, node, weights

import onnxfuse.select.measured
from onnxfuse import optimize
from onnxfuse.select.decisions import DecisionCache, decision_key, machine_class
from onnxfuse.select.measured import Measurement, cached_measurements
from onnxfuse.select.whole_model import Comparison, choose_kept, final_kept, replayed


def test_a_verdict_is_stored_by_key_and_a_damaged_entry_is_a_miss(tmp_path):
    cache = DecisionCache(tmp_path)
    key = decision_key("group", b"kernel and group", (1, 64), (1,))
    assert cache.load(key) is None
    cache.store(key, [{"a": 1}])
    assert cache.load(key) == [{"a": 1}]
    path = next((tmp_path / "decisions").rglob("*.json"))
    path.write_text("{not json")
    assert cache.load(key) is None
    DecisionCache(None).store(key, 1)  # no cache: nothing stored, nothing raised
    assert DecisionCache(None).load(key) is None


def test_the_key_changes_with_the_content_sizes_and_threads_timed():
    base = decision_key("group", b"x", (1, 64), (1,))
    assert base == decision_key("group", b"x", (1, 64), (1,))
    assert len({base, decision_key("group", b"y", (1, 64), (1,)), decision_key("group", b"x", (1, 1000), (1,)),
                decision_key("group", b"x", (1, 64), (2,)), decision_key("model", b"x", (1, 64), (1,))}) == 5
    assert "cores" in machine_class()


def test_measurements_timed_once_are_reused(tmp_path):
    cache = DecisionCache(tmp_path)
    calls = []
    timed = [Measurement(1, 1, 5.0, 8.0, paired_speedup=1.6, band=(1.5, 1.7), rounds=15)]

    def measure():
        calls.append(1)
        return timed

    first, cached_first = cached_measurements(cache, "k", measure)
    again, cached_again = cached_measurements(cache, "k", measure)
    assert (first, cached_first, cached_again, len(calls)) == (timed, False, True, 1)
    assert again == timed and again[0].band == (1.5, 1.7)


def test_whole_model_timings_replayed_give_the_same_steps_without_timing():
    log = []

    def time_model(kept):
        log.append(tuple(kept))
        ratio = 1.1 if "e" in kept else 0.9
        return [Comparison(1, 1, ratio, 1.0, ratio, band=(ratio - 0.01, ratio + 0.01), rounds=15)]

    gains = {"a": 1.0, "b": 50.0, "c": 3.0, "d": 100.0, "e": 2.0}
    timed, timings = replayed(None, time_model)
    steps = choose_kept(gains, timed)
    timed_calls = len(log)
    again, replayed_timings = replayed(timings, time_model)
    steps_again = choose_kept(gains, again)
    assert len(log) == timed_calls  # nothing timed the second time
    assert final_kept(steps_again) == final_kept(steps) == ("b", "d", "c", "a")
    assert [s.to_json() for s in steps_again] == [s.to_json() for s in steps] and replayed_timings == timings


def two_groups(path):
    onnx.save(model([node("Mul", ["x", "w1"], "m1"), node("Sigmoid", ["m1"], "y1"),
                     node("Add", ["x", "w2"], "a2"), node("Tanh", ["a2"], "y2")],
                    {"x": ("N", 16)}, {"y1": ("N", 16), "y2": ("N", 16)},
                    {"w1": weights(16), "w2": weights(16, seed=1)}), str(path))
    return path


def test_a_group_that_cannot_be_timed_stays_with_onnxruntime(tmp_path, monkeypatch):
    """Random inputs a group's nodes refuse (symbolic dims that must agree) must not fail the
    whole optimize: the group is not shown faster, so onnxruntime keeps it."""
    def refuses(*args):
        raise RuntimeError("MatMul dimension mismatch")

    monkeypatch.setattr(onnxfuse.select.measured, "measure_group", refuses)
    report = optimize(two_groups(tmp_path / "two.onnx"), tmp_path / "out" / "two.fused.onnx",
                      cache_dir=tmp_path / "cache", jobs=1, select="measured", select_batches=(1, 4)).report
    assert [g["status"] for g in report["groups"]] == ["fallback", "fallback"]
    assert all(g["reason"] == "measured: could not be timed, so onnxruntime keeps it: MatMul dimension mismatch"
               for g in report["groups"])


def test_measured_selection_run_twice_decides_the_same_and_times_nothing_the_second_time(tmp_path):
    path = two_groups(tmp_path / "two.onnx")
    runs = [optimize(path, tmp_path / f"out{k}" / "two.fused.onnx", cache_dir=tmp_path / "cache", jobs=1,
                     select="measured", select_batches=(1, 4)).report for k in range(2)]
    first, second = ({g["name"]: (g["status"] != "fallback", g.get("reason")) for g in r["groups"]} for r in runs)
    assert first == second
    assert runs[0]["measured"]["decisions_cached"] == []
    assert sorted(runs[1]["measured"]["decisions_cached"]) == sorted(g["name"] for g in runs[1]["groups"])
    check = runs[1]["measured"]["whole_model_check"]
    assert check["timed_before"] and check == {**runs[0]["measured"]["whole_model_check"], "timed_before": True}
