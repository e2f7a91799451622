"""Relax passes of ours are expression mutators run over every Relax function of a module;
`function_pass` makes each one a TVM module pass, so the wrapper is written once."""

from __future__ import annotations

import tvm
from tvm import relax


def rewrite_functions(mod: tvm.IRModule, mutator_class) -> tvm.IRModule:
    """`mod` with every Relax function run through a fresh `mutator_class(mod)` (a PyExprMutator)."""
    rewriter = mutator_class(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def function_pass(name: str, mutator_class, doc: str):
    """A module pass class named `name` (as TVM's pass instrumentation shows it) that runs
    `mutator_class` over every Relax function; `doc` says what it guarantees."""

    def transform_module(self, mod, ctx):
        return rewrite_functions(mod, mutator_class)

    cls = type(name, (), {"__doc__": doc, "transform_module": transform_module})
    return tvm.transform.module_pass(opt_level=0, name=name)(cls)
