"""batching: build_structured_function and StructuredKernel — structured networks as batched kernels.

Imports every other part of symkern (the top of the import direction), as build.py does.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import sympy as sp

from symkern.batching.build import UNSET, build_options, resolve_dtype
from symkern.batching.kernel import Kernel
from symkern.batching.program import KernelSignature, StructuredProgram
from symkern.codegen.passes import FUSED, BuildOptions, refuse_c_loop_option, refuse_unbatched_outputs
from symkern.codegen.rules import HoistedLiteral
from symkern.codegen.structured import StructuredCode, StructuredLayout, generate_structured
from symkern.collector import collection_paused
from symkern.errors import BuildError
from symkern.kernels.constants import ConstArg, warn_if_large
from symkern.kernels.stage import compile_kernel
from symkern.symbolic.arguments import (
    ArgumentSpec,
    EquationSet,
    check_unique_symbols,
    data_argument,
    format_path,
    is_symbolic_leaf,
    parameter_arguments,
)
from symkern.symbolic.structured import StructuredNetwork, plan_structured

#: a structured kernel whose largest per-sample intermediate has TILE_FROM_VALUES values or
#: more, and at least TILE_OVER_OUTPUT times the values its outputs hold per sample, runs its
#: batch TILE_CHUNK samples at a time (`lax.map`), so that each layer's arrays stay in cache
#: between layers instead of going through memory. Measured in one process at batch 100k
#: (benchmarks/experiments/structured_tiles.py, benchmarks/structured.py; docs/design/tiling.md):
#: the 4-16-16-4 and 8-32-32-8 Jacobians (64 and 256 values per sample, outputs 16 and 64)
#: ran 2.0-2.3x faster in chunks of 4,096 (1,024: 1.6-1.9x; 16,384: 1.4-3.0x); outputs of
#: 16 and 32 values per layer 0.5-0.8x, and per-sample parameter gradients (whose largest
#: arrays are outputs, which go to memory anyway) 0.6-0.7x
TILE_CHUNK = 4096
TILE_FROM_VALUES = 64
TILE_OVER_OUTPUT = 2


class StructuredKernel(Kernel):
    """A `Kernel` over a structured network's array program (`StructuredProgram`).

    A network output, Jacobian or parameter gradient comes out of the body already shaped
    `batch + shape` (it is one array there); only leaves written as SymPy formulas around
    the network (`J∇H`) come as scalar entries, stacked by the assembly as in `Kernel`.
    Argument checks, batch shapes, jaxpr/hlo, bind, flat, shard, stream and export are
    `Kernel`'s, over the program's `entries` / `assemble`.
    """

    @property
    def layout(self) -> StructuredLayout:
        return self.program.layout

    @property
    def tile_chunk(self) -> int | None:
        """Batches above this many samples run this many at a time (`lax.map`); None: whole.
        Set from the largest per-sample intermediate against the outputs (TILE_FROM_VALUES,
        TILE_OVER_OUTPUT), or by `BuildOptions.tile_chunk`; settable before the first call
        of a shape (a shape already compiled keeps its form)."""
        return self.program.tile_chunk

    @tile_chunk.setter
    def tile_chunk(self, chunk: int | None) -> None:
        self.program.tile_chunk = chunk
        if self.program.portable_program is not None:
            self.program.portable_program.tile_chunk = chunk

    def largest_intermediate(self) -> int:
        """The most values an array computed from the data holds for one sample."""
        return self.program.largest_intermediate()


def _tile_chunk(program: StructuredProgram) -> int | None:
    largest = program.largest_intermediate()
    outputs = sum(math.prod(shape) for shape in program.equations.shapes)
    if largest >= TILE_FROM_VALUES and largest >= TILE_OVER_OUTPUT * outputs:
        return TILE_CHUNK
    return None


def _network_parameter_specs(snn: StructuredNetwork, extra: Any) -> tuple[list[ArgumentSpec], Any]:
    """Specs of the merged tree `{"L1": {"W", "b"}, …, **extra}` in JAX's pytree order.

    Network leaves get no entries: a 256×256 weight is one array argument, never 65k symbols.
    """
    extra = dict(extra or {})
    clash = sorted(set(extra) & set(snn.params))
    if clash:
        raise BuildError(f"params: keys {clash} are the network's layers; choose other names")
    extra_specs = {spec.path: spec for spec in parameter_arguments(extra)[0]} if extra else {}
    merged = {**snn.params, **extra}
    flat, treedef = jax.tree_util.tree_flatten_with_path(merged, is_leaf=is_symbolic_leaf)
    specs = []
    for key_path, _leaf in flat:
        path = tuple(k.key if hasattr(k, "key") else k.idx for k in key_path)
        if path in extra_specs:
            specs.append(extra_specs[path])
        else:
            shape = snn.parameter_shapes[path]
            # a bias (out,) also taken as (out, 1), as a scalarized network's n×1 Matrix is
            declared = shape + (1,) if len(shape) == 1 else None
            specs.append(ArgumentSpec(format_path(path), shape, (), (), path, declared))
    return specs, treedef


@collection_paused()
def build_structured_function(
    eqs: Any,
    snn: StructuredNetwork,
    *more_data: Any,
    params: Any = None,
    cse: bool = UNSET,
    dtype: Any = UNSET,
    embed_max_bytes: int = UNSET,
    options: BuildOptions | None = None,
) -> StructuredKernel:
    """Compile equations over a structured network into a batched kernel.

    The kernel is called `kernel(X, *more, ps)`: `X` is `snn.input`'s data `(..., n)`,
    `more_data` further data arguments (a target `y`, …), `ps` the network's parameter tree
    (plus `params`, a tree of SymPy parameters used by the formulas around the network,
    merged at the top level). `eqs`: a pytree of Expr, Matrix and `ParameterGradient`
    leaves (`snn.parameter_gradient(loss)`), e.g. `snn.output`,
    `snn.output.jacobian(snn.input)`, `sympy.hessian(snn.output[0], snn.input)`.

    >>> from symkern.symbolic.networks import Chain, Dense
    >>> snn = StructuredNetwork(Chain(Dense(2, 16, "tanh"), Dense(16, 1)))
    >>> k = build_structured_function(snn.output, snn)
    >>> print(k.source)
    def kernel(x1, ps):
        h1 = jnp.tanh(x1 @ ps['L1']['W'].T + ps['L1']['b'])
        return h1 @ ps['L2']['W'].T + ps['L2']['b'],
    <BLANKLINE>
    """
    if not isinstance(snn, StructuredNetwork):
        raise BuildError(f"snn: expected a StructuredNetwork, got {type(snn).__name__}")
    chosen = build_options(options, cse=cse, embed_max_bytes=embed_max_bytes,
                           dtype=dtype)
    resolved_dtype = resolve_dtype(chosen.dtype)
    chosen = chosen.resolved(resolved_dtype)
    refuse_unbatched_outputs(chosen, "a structured network's array program")
    refuse_c_loop_option(chosen, "a structured network's array program")
    start = time.perf_counter()
    data = [data_argument(arg, k + 1) for k, arg in enumerate((snn.input, *more_data))]
    parameters, treedef = _network_parameter_specs(snn, params)
    check_unique_symbols(data + [spec for spec in parameters if spec.entries])
    plan = plan_structured(eqs, snn)
    code = generate_structured(plan, data, parameters, cse=chosen.cse,
                               embed_max_bytes=chosen.embed_max_bytes, dtype=resolved_dtype)
    signature = KernelSignature(tuple(data), tuple(parameters), treedef, resolved_dtype)
    equations = EquationSet(tuple(_described(leaf) for leaf in plan.leaves),
                            tuple(leaf.shape for leaf in plan.leaves), plan.treedef,
                            tuple(leaf.label for leaf in plan.leaves))
    return array_program_kernel(
        code, signature, equations, chosen, start, "<symkern structured kernel>",
        lambda literal: "array literal in a formula around the network (hoist_array_literals)",
        _tile_chunk)


def array_program_kernel(code: StructuredCode, signature: KernelSignature,
                         equations: EquationSet, chosen: BuildOptions, start: float,
                         filename: str, origin: Callable[[HoistedLiteral], str],
                         tile_chunk: Callable[[StructuredProgram], int | None] | None = None,
                         portable: StructuredCode | None = None) -> StructuredKernel:
    """The `StructuredKernel` of an array program's code (a network's, a matrix
    expression's): its hoisted literals as const args, the code compiled, the timings since
    `start`; tiled by `chosen.tile_chunk`, else as `tile_chunk(program)` says. `portable`:
    the same program without custom calls (where `code` calls the C solve), which export
    and shard run instead (`program.portable`)."""
    # entries stacked in one executable: an array program's leaves are whole arrays, and its
    # scalar entries few (the formulas around them)
    generated = dataclasses.replace(code.generated, assembly=chosen.assembly or FUSED)
    const_args = [ConstArg(literal.name, jax.device_put(literal.value), origin(literal))
                  for literal in generated.literals]
    warn_if_large(const_args)
    compiled_at = time.perf_counter()
    function = compile_kernel(generated.module, None, filename)
    timings = dict(generated.timings)
    timings["python_compile"] = time.perf_counter() - compiled_at
    timings["build"] = time.perf_counter() - start
    program = StructuredProgram(generated, function, signature, equations,
                                tuple(c.value for c in const_args), code.layout)
    program.tile_chunk = chosen.tile_chunk or (tile_chunk(program) if tile_chunk else None)
    if portable is not None:
        plain = dataclasses.replace(portable.generated, assembly=generated.assembly)
        program.portable_program = StructuredProgram(
            plain, compile_kernel(plain.module, None, filename), signature, equations,
            program.const_values, portable.layout, program.tile_chunk)
    return StructuredKernel(program, timings, tuple(const_args), options=chosen)


def _described(leaf: Any) -> sp.Basic:
    # EquationSet wants SymPy leaves; a symbol naming the kind is what repr and messages need
    return sp.Symbol(f"{leaf.kind}:{leaf.label}")


def structured_parameter_specs(snn: StructuredNetwork) -> Sequence[ArgumentSpec]:
    """The parameter specs of a structured network alone (for callers outside a build)."""
    return _network_parameter_specs(snn, None)[0]
