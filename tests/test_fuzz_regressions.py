"""Every minimised fuzzer case in tests/fuzz/regressions/ must match onnxruntime once fused.

All cases go into one model (names prefixed, components disconnected), compiled by one
`onnxfuse optimize --select all` call; each test then checks its own case with the fuzzer's
comparison rule (fuzz/compare.py). A case showing a bug not fixed yet is xfail(strict): when the
compiler is fixed the test passes, strict turns that into a failure, and known_bugs.py gets
`fixed=True`. A case must also stay fused: one that falls back to onnxruntime proves nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
import pytest
from fuzz import regressions
from fuzz.campaign import optimize
from fuzz.execute import Case, Job, run_cases
from fuzz.graphs import assemble_models
from fuzz.known_bugs import KNOWN_BUGS, expected_failure

NAMES = regressions.names()


@dataclass
class Corpus:
    original: Path
    fused: Path
    library: Path | None
    report: dict
    cases: dict  # name → (renamed model, input sets)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    """Every case, renamed apart, in one model compiled by one onnxfuse call."""
    tmp = tmp_path_factory.mktemp("fuzz_regressions")
    cases = {name: regressions.rename(*regressions.load(name), f"r{i}_") for i, name in enumerate(NAMES)}
    path = tmp / "regressions.onnx"
    onnx.save(assemble_models([m for m, _ in cases.values()]), path)
    fused, library, report = optimize(path, tmp, jobs=2)
    return Corpus(path, fused, library, report, cases)


def _param(name):
    bug = expected_failure(name)
    marks = [pytest.mark.xfail(strict=True, reason=f"{bug.name}: {bug.summary}")] if bug else []
    return pytest.param(name, marks=marks, id=name)


def test_corpus_holds_every_known_bug():
    assert {r for bug in KNOWN_BUGS for r in bug.regressions} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_regression_is_fused(corpus, name):
    """Not xfail: a case that falls back to onnxruntime would pass without testing anything."""
    model, _ = corpus.cases[name]
    compiled_outputs = {o for g in corpus.report["groups"] if g["status"] == "compiled" for o in g["outputs"]}
    assert compiled_outputs & {o for n in model.graph.node for o in n.output}, f"{name} is no longer fused"


@pytest.mark.parametrize("name", [_param(n) for n in NAMES])
def test_regression_matches_onnxruntime(corpus, name):
    model, feed_sets = corpus.cases[name]
    case = Case(name, [o.name for o in model.graph.output], feed_sets)
    findings = run_cases(Job(str(corpus.original), str(corpus.fused), str(corpus.library) if corpus.library else None,
                             [case]))
    assert not findings, "\n".join(f"{f.kind} {f.output}: {f.detail}" for f in findings)
