"""What every one of our Relax module passes does with its expression mutator."""

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
