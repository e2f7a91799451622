"""What a compiled kernel looks like from the outside: the contract between codegen and runtime.

Codegen produces a `KernelSpec` per fused group; the runtime library builder turns a list of them
into one custom-op library; packaging writes one ONNX node per spec (op_type = spec.name in the
`DOMAIN` domain, inputs in `spec.inputs` order, weights included).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

DOMAIN = "ai.onnxfuse"
DOMAIN_VERSION = 1
LIBRARY_METADATA_KEY = "onnxfuse.library"  # model metadata: the library file beside the model
LIBRARY_DIGEST_METADATA_KEY = "onnxfuse.library.sha256"  # model metadata: that file's SHA-256, checked before loading


def file_sha256(path) -> str:
    """The SHA-256 of a file's bytes, hex. A kernel library is checked before it is loaded: a
    truncated one ends the process in the dynamic loader (SIGBUS), with no error to catch."""
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# The dtypes a kernel may take or return, as numpy names, with their ONNX TensorProto codes.
ONNX_DTYPE_CODES = {
    "float32": 1,
    "uint8": 2,
    "int8": 3,
    "uint16": 4,
    "int16": 5,
    "int32": 6,
    "int64": 7,
    "bool": 9,
    "float16": 10,
    "float64": 11,
    "uint32": 12,
    "uint64": 13,
}

@dataclass(frozen=True)
class DerivedDim:
    """An output dimension computed from a symbol: symbol [* times] * multiplier // divisor.

    Chains that flatten `[N, 100]` to `[N*100]` give such outputs (multiplier 100), chains that
    fold a flat input `[M]` back give `M // 100` (divisor 100), and flattening two symbolic dims
    (`[seq, batch, 64]` to `[seq*batch, 64]`) names a second symbol, `times`. On an input it is a
    product (no divisor) of symbols other input dims bind, which the runtime checks: the
    out-projection of nn.MultiheadAttention at a static sequence reads `[10*batch, 32]`
    (dim_products.py)."""

    symbol: str
    multiplier: int = 1
    divisor: int = 1
    times: str | None = None

    def __post_init__(self) -> None:
        if self.multiplier < 1 or self.divisor < 1:
            raise ValueError(f"derived dim {self}: multiplier and divisor must be >= 1")

    @property
    def symbols(self) -> tuple[str, ...]:
        return (self.symbol,) if self.times is None else (self.symbol, self.times)

    def value(self, bindings: dict[str, int]) -> int:
        product = bindings[self.symbol] * (bindings[self.times] if self.times is not None else 1)
        return product * self.multiplier // self.divisor

    def __str__(self) -> str:
        return "*".join(self.symbols) + (f"*{self.multiplier}" if self.multiplier != 1 else "") + (
            f"//{self.divisor}" if self.divisor != 1 else "")


def product_symbols(key: str) -> tuple[str, ...]:
    """The symbols of a KernelSpec.multiples key: one symbol, or a product of two ("s0*s1")."""
    return tuple(key.split("*"))


Dim = int | str | DerivedDim
"""A dimension: an int is static, a str names a symbolic dimension bound from the inputs at run
time, a DerivedDim is computed from one (checked, on an input)."""


@dataclass(frozen=True)
class TensorSpec:
    dtype: str
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if self.dtype not in ONNX_DTYPE_CODES:
            raise ValueError(f"unsupported kernel dtype {self.dtype!r}")

    @property
    def onnx_dtype(self) -> int:
        return ONNX_DTYPE_CODES[self.dtype]

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbols this tensor's dims name, derived dims' included."""
        return tuple(s for d in self.shape if not isinstance(d, int)
                     for s in (d.symbols if isinstance(d, DerivedDim) else (d,)))

    @property
    def has_derived_dims(self) -> bool:
        return any(isinstance(d, DerivedDim) for d in self.shape)

    def concrete(self, bindings: dict[str, int]) -> tuple[int, ...]:
        """The shape with every symbolic dimension replaced by its bound value."""
        return tuple(bindings[d] if isinstance(d, str) else d.value(bindings) if isinstance(d, DerivedDim) else d
                     for d in self.shape)

    @staticmethod
    def of(array: np.ndarray) -> TensorSpec:
        return TensorSpec(str(array.dtype), tuple(int(d) for d in array.shape))


def small_variant_name(name: str) -> str:
    """The name of kernel `name`'s small-batch variant (its entry point is __tvm_ffi_<that>)."""
    return f"{name}_small"


def serial_variant_name(name: str) -> str:
    """The name of kernel `name`'s serial variant (its entry point is __tvm_ffi_<that>)."""
    return f"{name}_serial"


def level_kernel_name(name: str, level_suffix: str, levels: int) -> str:
    """The name of kernel `name` built for one ISA level, when the object holds `levels` of them:
    `<name>__<suffix>`, or `name` itself for a single-level build."""
    return f"{name}__{level_suffix}" if levels > 1 else name


@dataclass(frozen=True)
class KernelSpec:
    """One compiled kernel: `__tvm_ffi_<name>` in `object_file`, called as (inputs..., outputs...).

    small_batch_below > 0: the object also holds `__tvm_ffi_<name>_small`, the same computation
    scheduled for small batches, which the runtime calls when the product of the symbolic dims
    is below that value. row_work: innermost iterations per unit of the symbolic dims (0 if
    unknown); the runtime runs the kernel's parallel loops on onnxruntime's pool only when that
    product times row_work is worth waking it. serial_variant: the object also holds
    `__tvm_ffi_<name>_serial`, the main schedule with a serial row loop, which the runtime calls
    instead of running the parallel kernel's tasks one after another on the calling thread
    (measured 5-16% faster there; see codegen.schedule.needs_serial_variant). levels: the
    suffixes of the ISA levels the object holds, best first (onnxfuse.target.IsaLevel.suffix);
    with more than one, every entry point above exists once per level, named by
    level_kernel_name (empty: one level, unsuffixed). level_small_batch_below: each level's own
    threshold, in the order of `levels` (their row tiles differ; empty: small_batch_below for
    all). row_tile > 0: the kernel's rows are separable (codegen/row_slices.py) and its main
    schedule computes them in tiles of row_tile; a batch whose last tile would hold fewer rows
    than small_batch_below runs its whole tiles in the main kernel and those rows in the small
    variant (rows_left_to_small_variant). level_row_tiles: each level's, as for thresholds."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    object_file: str
    small_batch_below: int = 0
    row_work: int = 0
    serial_variant: bool = False
    levels: tuple[str, ...] = ()
    level_small_batch_below: tuple[int, ...] = ()
    row_tile: int = 0
    level_row_tiles: tuple[int, ...] = ()
    multiples: tuple[tuple[str, int], ...] = ()
    """(key, n): the kernel fails unless the symbol's value, or the product of two ("s0*s1",
    product_symbols), is a multiple of n (a Reshape in the group splits it;
    codegen/reshape_divisions.py)."""

    def level_name(self, level_suffix: str) -> str:
        """This kernel's name as built for one of its levels (variants append to it)."""
        return level_kernel_name(self.name, level_suffix, len(self.levels))

    def small_batch_below_at(self, level_suffix: str) -> int:
        """The small-batch threshold of the level with this suffix."""
        if self.level_small_batch_below and level_suffix in self.levels:
            return self.level_small_batch_below[self.levels.index(level_suffix)]
        return self.small_batch_below

    def row_tile_at(self, level_suffix: str) -> int:
        """The main kernel's row tile on the level with this suffix (0: rows not separable)."""
        if self.level_row_tiles and level_suffix in self.levels:
            return self.level_row_tiles[self.levels.index(level_suffix)]
        return self.row_tile

    @property
    def small_name(self) -> str:
        """The small-batch variant's name (meaningful only if small_batch_below > 0)."""
        return small_variant_name(self.name)

    @property
    def serial_name(self) -> str:
        """The serial variant's name (meaningful only if serial_variant)."""
        return serial_variant_name(self.name)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"kernel name {self.name!r} must be a C identifier")
        if self.level_small_batch_below and len(self.level_small_batch_below) != len(self.levels):
            raise ValueError(f"kernel {self.name}: {len(self.level_small_batch_below)} small-batch thresholds "
                             f"for {len(self.levels)} levels")
        if self.level_row_tiles and len(self.level_row_tiles) != len(self.levels):
            raise ValueError(f"kernel {self.name}: {len(self.level_row_tiles)} row tiles for {len(self.levels)} levels")
        if (self.row_tile or self.level_row_tiles) and not self.small_batch_below:
            raise ValueError(f"kernel {self.name}: a row tile without a small-batch variant")
        bound = {d for t in self.inputs for d in t.shape if isinstance(d, str)}
        for d in (d for t in self.inputs for d in t.shape if isinstance(d, DerivedDim)):
            if d.divisor != 1 or not set(d.symbols) <= bound:
                raise ValueError(f"kernel {self.name}: input dim {d} must be a product of dims other inputs bind")
        unchecked = {symbol for key, _ in self.multiples for symbol in product_symbols(key)} - bound
        if unchecked:
            raise ValueError(f"kernel {self.name}: multiples of {sorted(unchecked)}, which are not dims of any input")
        unbound = {s for t in self.outputs for s in t.symbols} - bound
        if unbound:
            raise ValueError(
                f"kernel {self.name}: output dims {sorted(unbound)} are not dims of any input"
            )


@dataclass(frozen=True)
class GroupKernel:
    """A compiled kernel as packaging needs it (fresh from codegen or from the cache): its spec,
    where each argument comes from (a value of the model, or one of `extra_weights`: constants
    the import lifted out of the group), and those weights."""

    spec: KernelSpec
    arg_sources: tuple[str, ...]
    extra_weights: dict[str, np.ndarray] = field(default_factory=dict)


def rows_left_to_small_variant(batch: int, row_tile: int, small_batch_below: int) -> int:
    """How many of a call's last rows the small-batch variant computes after the main kernel has
    computed the others (0: one call of one variant). Worth it when the main kernel's last tile
    would hold fewer rows than small_batch_below: that tile costs a whole tile's work, the variant
    a row's at a time (codegen/schedule.small_batch_below). The runtime's C twin is
    rows_left_to_small_variant in onnxfuse_runtime.c."""
    if row_tile <= 0 or batch < small_batch_below:
        return 0
    left = batch % row_tile
    return left if left < small_batch_below else 0
