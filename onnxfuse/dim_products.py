"""Symbolic dims that are products of other dims: `10*batch`, `batch*seq`.

Shape inference names a flattened dim by the product of the dims it joins (onnxruntime's
symbolic shape inference writes sympy's `10*batch`). PyTorch's nn.MultiheadAttention, exported
with a static sequence, hands its out-projection `[10*batch, 32]` and adds the residual
`[batch, 10, 32]`: a kernel that took `10*batch` as a symbol of its own could not prove the two
equal and fell back. Read as a product, the dim is computed from `batch` (TVM's ONNX importer
reads such a dim_param as the expression), and the kernel checks it instead of binding it
(kernel_spec.DerivedDim on an input).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
MAX_SYMBOLS = 2  # what kernel_spec.DerivedDim can say: symbol [* times] * multiplier


@dataclass(frozen=True)
class Product:
    """multiplier * symbols[0] [* symbols[1]]."""

    multiplier: int
    symbols: tuple[str, ...]

    def value(self, bindings: Mapping[str, int]) -> int:
        result = self.multiplier
        for symbol in self.symbols:
            result *= bindings[symbol]
        return result

    def named(self, names: Mapping[str, str]) -> str:
        """The dim_param of this product with each symbol renamed (`10*s1`)."""
        factors = ([str(self.multiplier)] if self.multiplier != 1 else []) + [names[s] for s in self.symbols]
        return "*".join(factors)


def parse_product(dim: str) -> Product | None:
    """The product a dim_param names, for `c*a`, `a*c`, `a*b`, `c*a*b` (c a positive integer, a
    and b identifiers); None for a plain symbol or anything else (sums, divisions, more symbols)."""
    factors = [f.strip() for f in dim.split("*")]
    if len(factors) < 2:
        return None
    multiplier, symbols = 1, []
    for factor in factors:
        if factor.isdigit() and int(factor) > 0:
            multiplier *= int(factor)
        elif _SYMBOL.match(factor):
            symbols.append(factor)
        else:
            return None
    if not 1 <= len(symbols) <= MAX_SYMBOLS or (len(symbols) == 1 and multiplier == 1):
        return None
    return Product(multiplier, tuple(symbols))
