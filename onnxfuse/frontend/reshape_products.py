"""Pass: a dim onnx's inference left unnamed across a Reshape is solved from the other side.

A Reshape keeps the number of elements. PyTorch's TorchScript exporter writes
nn.MultiheadAttention at a static sequence (a ViT's 17 patches) as a Reshape of the attention's
output to `[unk__6, 32]` by a target computed at run time, the out-projection's Gemm on it, and a
Reshape to `[17, batch, 32]` before the residual `[batch, 17, 32]`. onnx's inference names the
first dim afresh, so the out-projection's kernel had a symbol no input bound and fell back. From
the second Reshape, unk__6 * 32 = 17 * batch * 32 for every input the model accepts, so unk__6 is
`17*batch` (dim_products.py), a product the kernel computes from `batch` and checks.

The rule, exact: a Reshape whose input and output shapes are known but for one dim onnx named
itself (`unk__N`), on either side, where every other dim is a number, a symbol or a product of
symbols, and the quotient is a whole number times at most two symbols. The name is then replaced
by the quotient on every value that carries it (onnx gives a dim it carries through an op the
same name). Shapes the exporter declared are never changed: only `unk__` names are replaced.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from ..dim_products import MAX_SYMBOLS, parse_product
from .infer_shapes import INFERRED_SYMBOL_PREFIX


class ReshapeProductsPass(ir.passes.InPlacePass):
    """Guarantee: no Reshape (main graph or body) has exactly one `unk__` dim on its input and
    output shapes together when the rest determine it (see the module doc)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        solved: dict[str, int | str] = {}
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            if node.op_type == "Reshape" and node.domain in ("", "ai.onnx") and node.outputs:
                solution = _solve(node.inputs[0].shape if node.inputs[0] is not None else None, node.outputs[0].shape)
                if solution is not None:
                    solved.setdefault(*solution)
        if not solved:
            return ir.passes.PassResult(model, modified=False)
        for node in ir.traversal.RecursiveGraphIterator(model.graph):
            for value in [*node.inputs, *node.outputs]:
                if value is not None and value.shape is not None and any(_name(d) in solved for d in value.shape):
                    value.shape = ir.Shape([solved.get(_name(d), d) for d in value.shape])
        return ir.passes.PassResult(model, modified=True)


def _name(dim) -> str | None:
    value = getattr(dim, "value", dim)
    return value if isinstance(value, str) else None


def _factors(dims) -> tuple[int, Counter] | None:
    """(number, symbols) whose product is the dims', or None if a dim is unknown or no product."""
    number, symbols = 1, Counter()
    for dim in dims:
        value = getattr(dim, "value", dim)
        if isinstance(value, int):
            number *= value
        elif isinstance(value, str):
            product = parse_product(value)
            if product is None:
                symbols[value] += 1
            else:
                number *= product.multiplier
                symbols.update(product.symbols)
        else:
            return None
    return number, symbols


def _solve(before, after) -> tuple[str, int | str] | None:
    """(the one `unk__` name, its value) when the other dims of a Reshape determine it."""
    if before is None or after is None:
        return None
    unknown = [(side, k) for side, dims in ((0, before), (1, after)) for k, d in enumerate(dims)
               if (_name(d) or "").startswith(INFERRED_SYMBOL_PREFIX)]
    if len(unknown) != 1:
        return None
    side, index = unknown[0]
    own = list(before if side == 0 else after)
    name = _name(own.pop(index))
    mine, other = _factors(own), _factors(after if side == 0 else before)
    if mine is None or other is None or mine[0] == 0 or other[0] % mine[0] or mine[1] - other[1]:
        return None
    number, symbols = other[0] // mine[0], sorted((other[1] - mine[1]).elements())
    if len(symbols) > MAX_SYMBOLS or number == 0:
        return None
    if not symbols:
        return name, number
    if number == 1 and len(symbols) == 1:
        return name, symbols[0]
    return name, "*".join(([str(number)] if number != 1 else []) + symbols)
