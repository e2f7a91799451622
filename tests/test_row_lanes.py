"""Rows no power-of-two vector divides (a gate of 10 or 30 columns) are vectorized by TVM
(schedule._row_lanes). Left scalar, they were LLVM's to vectorize, and LLVM's loop vectorizer
gives up on a loop holding the fence that keeps an ONNX Mul's product rounded
(codegen/rounded_products.py): the seed gate's epilogue ran scalar, 4x slower than onnxruntime."""

from __future__ import annotations

import re

import pytest
from test_codegen import compile_and_check, lstm_gate_model
from test_ieee_rounding import AARCH64, _assembly

from onnxfuse.codegen import schedule
from onnxfuse.target import resolve_target

X86_AVX2 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell"}


@pytest.mark.parametrize(("extent", "lanes", "expected"), [
    (10, 8, 10),    # one vector of 10 (LLVM: 8 + 2) rather than two of 5
    (30, 8, 15),    # two vectors of 15: four registers, where 10s take six and 5s or 6s five
    (10, 16, 10),
    (10, 4, 5),
    (6, 4, 6),
    (7, 8, 7),
    (24, 8, 8),     # a power of two that divides the row wins (_lanes_dividing)
    (1000, 16, 8),
    (31, 8, 0),     # prime and wider than two registers: scalar
])
def test_row_lanes(extent, lanes, expected):
    assert schedule._row_lanes(extent, lanes) == expected


def _fences(llvm_ir: str) -> tuple[int, int]:
    """(scalar, vector) float fences in the module."""
    scalar = len(re.findall(r"call (?:float|double) @llvm\.arithmetic\.fence", llvm_ir))
    vector = len(re.findall(r"call <\d+ x (?:float|double)> @llvm\.arithmetic\.fence", llvm_ir))
    return scalar, vector


@pytest.mark.parametrize("target", [X86_AVX2, AARCH64], ids=["avx2", "aarch64"])
@pytest.mark.parametrize("hidden", [10, 30])
def test_narrow_gate_products_are_vector_operations(hidden, target):
    """The gate's Sigmoid * Tanh product is fenced in vectors only: no scalar loop is left for LLVM."""
    scalar, vector = _fences(_assembly(lstm_gate_model(hidden=hidden, k=10), target, kind="ll"))
    assert (scalar, vector > 0) == (0, True), f"{scalar} scalar and {vector} vector fences"


@pytest.mark.parametrize("hidden", [10, 30])
def test_narrow_gate_matches_onnxruntime(tmp_path, hidden):
    compile_and_check(lstm_gate_model(hidden=hidden, k=10), tmp_path, resolve_target("native"), batches=(1, 7, 64, 1000))
