"""ONNX group → Relax → exactly one fused PrimFunc.

Steps (why each is needed: docs/codegen.md):
1. `from_onnx` imports the group; shape-like initializers (Reshape shape, Slice starts, axes...)
   are consumed by the frontend at import time and so end up embedded. One-element constant
   operands become scalars (scalar_operands), so they stay embedded too.
2. Every tensor constant that is still an expression after import (weights, tree tables) is
   lifted into a parameter of `main` BEFORE folding: FuseTIR rejects tensor constants inside a
   primitive function, and FoldConstant would otherwise expand table lookups into batch-sized
   constants. This is the single place that decides "argument vs embedded": a constant of
   rank >= 1 becomes a kernel argument, a scalar stays embedded. A lifted constant is mapped back
   to the initializer with identical contents when there is one, else it becomes an extra weight
   (a transposed Gemm weight, operand_layout; an int64 table narrowed to uint32, narrow_tables).
3. Simplify, legalize to TIR, wrap the whole body in one primitive Relax function and FuseTIR it
   into a single PrimFunc.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
import tvm
from onnx import numpy_helper
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx
from tvm.tirx.buffer import is_buffer_var

from ..errors import CompileError, short_reason
from ..kernel_spec import Dim
from . import (
    contracted_gelu,
    float16_as_onnxruntime,
    narrow_tables,
    one_row_products,
    onnx_semantics,
    onnxruntime_contrib,
    operand_layout,
    reshape_divisions,
)
from .conv_sum_input import ConvSumInput
from .fast_math import FastMath
from .fold_shape_take import FoldShapeTake
from .index_math import derived_dim
from .legalize import CUSTOM_LEGALIZE
from .nan_safe_comparisons import NanSafeNegatedComparisons
from .scalar_operands import ScalarOperands
from .unfold_stack_reductions import UnfoldStackReductions

FUSED_NAME = "fused_group"


@dataclass
class ImportedGroup:
    """The single fused PrimFunc plus where each of its tensor arguments comes from."""

    prim_func: tvm.tirx.PrimFunc
    arg_sources: list[str]  # one per kernel input, in PrimFunc parameter order
    extra_weights: dict[str, np.ndarray] = field(default_factory=dict)
    num_inputs: int = 0  # kernel inputs (graph inputs + weights); the rest of the params are outputs
    input_types: list = field(default_factory=list)  # (dtype, shape dims) per kernel input
    output_types: list = field(default_factory=list)  # (dtype, shape dims) per output
    multiples: tuple[tuple[str, int], ...] = ()  # (symbol, n): its Reshapes split the symbol n ways


def _dim(value, multiples: tuple[tuple[str, int], ...] = ()) -> Dim:
    """A Relax/TIR shape dimension as a KernelSpec dim: an int, the name of a symbolic var, or a
    DerivedDim for `var * c`, `var // c` and `var * a // b`, or for `var // d * m` where
    `multiples` (symbol, n: the kernel checks the symbol is a multiple of n) make it exact; any
    other expression is refused."""
    if isinstance(getattr(value, "value", None), int):
        return int(value.value)
    if isinstance(value, tvm.tirx.Var):
        return str(value.name)
    derived = derived_dim(value) or reshape_divisions.exact_dim(value, multiples)
    if derived is None:
        raise CompileError(f"shapes: dimension {value} is an expression, not a named dim")
    return derived


def _tensor_types(ty, multiples: tuple[tuple[str, int], ...] = ()) -> list:
    """Flattens a Relax tensor or tuple type into (dtype, dims) pairs."""
    if isinstance(ty, relax.TupleType):
        return [t for field_ty in ty.fields for t in _tensor_types(field_ty, multiples)]
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        raise CompileError("shapes: an input or output has no static rank")
    return [(str(ty.dtype), tuple(_dim(d, multiples) for d in ty.shape.values))]


def _content_key(array: np.ndarray) -> tuple:
    return (str(array.dtype), tuple(array.shape), hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest())


@relax.expr_functor.mutator
class _ConstantLifter(relax.PyExprMutator):
    """Replaces every constant of rank >= 1 by a fresh parameter (one per distinct content)."""

    def __init__(self, mod, min_ndim: int, first_index: int):
        super().__init__(mod)
        self.lifted: list[tuple[relax.Var, np.ndarray]] = []
        self._by_content: dict[tuple, relax.Var] = {}
        self._min_ndim = min_ndim
        self._first_index = first_index

    def visit_generic_const_(self, op):
        value = op.data if hasattr(op, "data") else op.value
        if not hasattr(value, "numpy"):
            return op
        array = value.numpy()
        if array.ndim < self._min_ndim:
            return op
        key = _content_key(array)
        if key not in self._by_content:
            index = self._first_index + len(self.lifted)
            var = relax.Var(f"w{index}", relax.TensorType(shape=array.shape, dtype=str(array.dtype)))
            self._by_content[key] = var
            self.lifted.append((var, array))
        return self._by_content[key]


def _import(model: onnx.ModelProto) -> tvm.IRModule:
    onnxruntime_contrib.installed()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return from_onnx(model, opset=opset, keep_params_in_input=False)
        except Exception as exc:  # the frontend raises many kinds of errors
            raise CompileError(f"import: {short_reason(exc)}") from exc


def _lift_constants(mod: tvm.IRModule, min_ndim: int = 1, first_index: int = 0):
    """main(inputs) → main(inputs, weights); returns the new module and the lifted arrays.

    Run with min_ndim=1 before folding (weights and tables become arguments, scalars stay), and
    with min_ndim=0 after legalization: whatever constant is still passed to a TIR function
    (e.g. the index of a `take` the frontend emits) must be an argument, FuseTIR rejects it."""
    main = mod["main"]
    lifter = _ConstantLifter(mod, min_ndim, first_index)
    body = lifter.visit_expr(main.body)
    if not lifter.lifted:
        return mod, []
    params = list(main.params) + [var for var, _ in lifter.lifted]
    new_main = relax.Function(params, body, main.ret_ty, main.is_pure, main.attrs)
    helpers = {gv: f for gv, f in mod.functions_items() if gv.name_hint != "main"}
    helpers["main"] = new_main
    return tvm.IRModule(helpers), [array for _, array in lifter.lifted]


def _simplify_and_legalize(mod: tvm.IRModule, fast_math: bool) -> tvm.IRModule:
    # CSE before folding: the frontend emits shape_to_tensor(shape_of(x)) once per Gather.
    passes = [
        relax.transform.CanonicalizeBindings(),
        UnfoldStackReductions(),
        NanSafeNegatedComparisons(),
        relax.transform.EliminateCommonSubexpr(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.FoldConstant(),
        FoldShapeTake(),
        relax.transform.FoldConstant(),
    ]
    if fast_math:
        passes.append(FastMath())
    passes += [
        ConvSumInput(),
        relax.transform.LegalizeOps(customize_legalize_map=CUSTOM_LEGALIZE),
        relax.transform.FoldConstant(),
        relax.transform.EliminateCommonSubexpr(),
        relax.transform.CanonicalizeBindings(),
        relax.transform.DeadCodeElimination(),
    ]
    return tvm.transform.Sequential(passes)(mod)


def _fuse_into_one(mod: tvm.IRModule) -> tvm.tirx.PrimFunc:
    """Wraps main's body in one primitive function and lets FuseTIR merge it into one PrimFunc."""
    main = mod["main"]
    prim = relax.Function(list(main.params), main.body, main.ret_ty, True).with_attr("Primitive", True)

    helpers = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != "main"})
    bb = relax.BlockBuilder(helpers)
    gv = bb.add_func(prim, FUSED_NAME)
    outer_params = [relax.Var(p.name, p.ty) for p in main.params]
    with bb.function("main", outer_params):
        with bb.dataflow():
            out = bb.emit_output(relax.Call(gv, outer_params))
        bb.emit_func_output(out)
    mod = bb.get()
    mod = relax.transform.FuseTIR()(mod)
    mod = relax.transform.DeadCodeElimination()(mod)
    called = _called_prim_funcs(mod)
    if len(called) != 1:
        raise CompileError(f"fuse: expected one PrimFunc, got {len(called)}")
    return mod[called[0]]


def _called_prim_funcs(mod: tvm.IRModule) -> list:
    """The PrimFuncs main actually calls (FuseTIR leaves the unfused originals in the module)."""
    names = []

    def visit(expr):
        if isinstance(expr, relax.Call) and getattr(expr.op, "name", None) == "relax.call_tir":
            gv = expr.args[0]
            if gv.name_hint not in names:
                names.append(gv.name_hint)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    return names


def _source_names(model: onnx.ModelProto, lifted: list[np.ndarray], prefix: str):
    """Names each lifted constant after the initializer holding the same contents, else a fresh one."""
    by_content = {_content_key(numpy_helper.to_array(init)): init.name for init in model.graph.initializer}
    names, extra = [], {}
    for array in lifted:
        name = by_content.get(_content_key(array))
        if name is None:
            name = f"{prefix}__c{len(extra)}"
            extra[name] = array
        names.append(name)
    return names, extra


def graph_input_names(model: onnx.ModelProto) -> list[str]:
    initializers = {init.name for init in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initializers]


def import_group(model: onnx.ModelProto, name: str, fast_math: bool = True,
                 weight_inputs: frozenset[str] = frozenset()) -> ImportedGroup:
    """`weight_inputs`: the inputs that are the original model's constants (one_row_products)."""
    in_place = narrow_tables.narrowed_tables(operand_layout.operands_in_place(model))
    as_onnxruntime = float16_as_onnxruntime.computed_as_onnxruntime(in_place)
    with one_row_products.weights_among_inputs(weight_inputs), reshape_divisions.recorded_divisions() as divisions:
        mod = _import(contracted_gelu.contracted(onnx_semantics.as_onnxruntime_computes(as_onnxruntime)))
    multiples = reshape_divisions.requirements(divisions)
    try:
        mod, lifted = _lift_constants(ScalarOperands()(mod))
    except Exception as exc:
        raise CompileError(f"lift constants: {short_reason(exc)}") from exc
    try:
        mod = _simplify_and_legalize(mod, fast_math)
    except Exception as exc:
        raise CompileError(f"legalize: {short_reason(exc)}") from exc
    _check_fully_legalized(mod)
    try:
        mod, late = _lift_constants(mod, min_ndim=0, first_index=len(lifted))
        lifted += late
    except Exception as exc:
        raise CompileError(f"lift constants: {short_reason(exc)}") from exc
    main = mod["main"]
    input_types = [t for p in main.params for t in _tensor_types(p.ty)]
    output_types = _tensor_types(main.ret_ty, multiples)
    try:
        prim = reshape_divisions.exact_parameter_shapes(_fuse_into_one(mod), multiples)
    except CompileError:
        raise
    except Exception as exc:
        raise CompileError(f"fuse: {short_reason(exc)}") from exc

    weight_names, extra = _source_names(model, lifted, name)
    sources = graph_input_names(model) + weight_names
    if len(prim.params) != len(sources) + len(output_types):
        # FuseTIR drops parameters nothing reads (a Dropout's ratio): the custom node would then
        # pass more tensors than the kernel takes.
        raise CompileError(f"fuse: the kernel reads {len(prim.params) - len(output_types)} of the group's "
                           f"{len(sources)} inputs; a group must use all of them")
    if not all(is_buffer_var(param) for param in prim.params):
        # TVM passes the dims of an input read only for its shape (`Shape(x)` feeding an Expand),
        # not the tensor, where the custom node hands the kernel tensors (it failed as a
        # TypeError when the kernel was checked).
        raise CompileError("fuse: the group reads an input only for its shape; such a group is left to onnxruntime")
    return ImportedGroup(prim, sources, extra, len(sources), input_types, output_types, multiples)


def _check_fully_legalized(mod: tvm.IRModule) -> None:
    """After LegalizeOps every op must be a call_tir; anything else cannot live in one kernel."""
    leftovers = set()

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            if expr.op.name not in ("relax.call_tir",):
                leftovers.add(expr.op.name)

    relax.analysis.post_order_visit(mod["main"].body, visit)
    if leftovers:
        raise CompileError(f"legalize: ops left outside TIR: {', '.join(sorted(leftovers))}")
