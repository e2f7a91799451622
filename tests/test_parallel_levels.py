"""compile_group with its ISA levels built in forked children: the same object as built one
level after another, and a kernel that matches onnxruntime."""

from __future__ import annotations

import platform

import pytest
from test_codegen import check_against_ort, tree_chain_model, tree_feeds

from onnxfuse.codegen.compile import compile_group
from onnxfuse.target import resolve_target

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="three portable levels on x86-64 only")


def test_levels_built_in_children_give_the_same_object(tmp_path):
    model, offsets = tree_chain_model(3)
    target = resolve_target("portable")
    assert len(target.levels) == 3
    apart = compile_group(model, "tree", target, tmp_path / "apart", parallel_levels=0)
    forked = compile_group(model, "tree", target, tmp_path / "forked", parallel_levels=2, host_kernel=True)
    assert forked._host_kernel is not None  # built while the children worked
    assert open(forked.spec.object_file, "rb").read() == open(apart.spec.object_file, "rb").read()
    for batch in (1, 37):
        check_against_ort(forked, model, tree_feeds(batch, 8, offsets, seed=batch))


def test_a_level_that_fails_in_a_child_fails_the_compile(tmp_path, monkeypatch):
    from onnxfuse.codegen import compile as compile_module
    from onnxfuse.errors import CompileError

    model, _ = tree_chain_model(2)
    real = compile_module.build_module

    def no_baseline(funcs, tvm_target):
        if '"mcpu":"x86-64"' in str(tvm_target):
            raise RuntimeError("baseline refused")
        return real(funcs, tvm_target)

    monkeypatch.setattr(compile_module, "build_module", no_baseline)
    with pytest.raises(CompileError, match="build: x86-64: baseline refused"):
        compile_group(model, "tree", resolve_target("portable"), tmp_path, parallel_levels=2)
