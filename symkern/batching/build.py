"""batching: build_function and build_nn_function, the entry points that run all four stages.

Imports every other part of symkern (the top of the import direction).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symkern.batching.caching import active_cache, library_versions
from symkern.batching.kernel import Kernel, KernelSignature
from symkern.codegen.cache import cache_key
from symkern.codegen.contract import contract_linear_forms, is_contracted, is_tiled, tile
from symkern.codegen.materialize import materialize_shared
from symkern.codegen.operations import exceeds_operations, operation_count
from symkern.codegen.pipeline import generate, print_source
from symkern.codegen.stopwatch import Stopwatch
from symkern.codegen.vectorize import is_vectorized, parameter_shapes
from symkern.codegen.vectorize import vectorize as vectorize_body
from symkern.errors import BuildError
from symkern.kernels.constants import ConstArg, hoist_captured_constants, origin_of, warn_if_large
from symkern.kernels.split import ExecutableStore, SplitProgram
from symkern.kernels.stage import LazyKernelFunction, compile_kernel
from symkern.symbolic.arguments import (
    check_unique_symbols,
    data_argument,
    equation_set,
    parameter_arguments,
)
from symkern.symbolic.networks import SymbolicNetwork
from symkern.symbolic.structured import StructuredNetwork

logger = logging.getLogger("symkern")


def resolve_dtype(dtype: Any) -> np.dtype:
    """`None` → JAX's default float (float32, or float64 under jax_enable_x64)."""
    if dtype is None:
        return np.dtype(jnp.result_type(float))
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise BuildError(f"dtype: expected a floating dtype such as 'float32', got {dtype!r}") from error
    if resolved not in (np.dtype("float32"), np.dtype("float64")):
        raise BuildError(f"dtype: expected float32 or float64, got {resolved.name}")
    if resolved == np.dtype("float64") and not jax.config.jax_enable_x64:
        raise BuildError(
            "dtype: float64 needs jax.config.update('jax_enable_x64', True) before building; "
            "without it JAX computes in float32"
        )
    return resolved


#: bodies above this many operations are compiled as pieces of at most PIECE_OPERATIONS,
#: in two threads: at 10^4 operations that took the first result from 82 s to 19 s and ran
#: 3x faster (docs/design/pieces.md); below it one executable ran faster
#: (4-16-16-4 network Jacobian, 4,658 operations: 12.8 vs 7.0 M samples/s, first result
#: 6.8 vs 3.9 s; 8-32-32-8 network: 11.4 vs 9.9 M/s, 4.3 vs 2.9 s; docs/design/pieces.md)
SPLIT_ABOVE_OPERATIONS = 5000
PIECE_OPERATIONS = 1000
#: a body compiled whole above this many operations assembles its entries in a separate
#: executable without the assembly probe, at every batch size: the probe's other form, the
#: entries stacked inside the program, took 10.7 s more to compile for the 4-16-16-4
#: Jacobian and ran no faster
PROBE_UP_TO_OPERATIONS = 2000
#: bodies above this many operations are vectorized by template (`vectorize=None`) when
#: that leaves at least VECTORIZE_MIN_SHRINK times fewer operations: at 10^5 operations the
#: first result fell from 42-52 s to ~7-10 s, at 10^4 from 7 s to 3.4 s at the same
#: throughput; networks below it run faster scalar (docs/design/vectorize.md:
#: the 4-16-16-4 Jacobian's 4,658 operations 4.1 vectorized vs 12.3 M samples/s whole)
VECTORIZE_ABOVE_OPERATIONS = 5_000
VECTORIZE_MIN_SHRINK = 20.0
#: compute costly values that several entries share once (symkern.codegen.materialize)
MATERIALIZE_SHARED = True
#: evaluate groups of sums over the same per-sample values as matrix products
#: (symkern.codegen.contract)
CONTRACT_LINEAR_FORMS = True


def _contracted(generated, dtype, stopwatch):
    """`generated` with its groups of linear forms as matrix products, when it has any."""
    if not CONTRACT_LINEAR_FORMS:
        return generated
    with stopwatch.stage("contract"):
        module = generated.module  # changed only when contracted
        literals = list(generated.literals)
        # a body too big to compile whole (vectorized or in pieces, its values would go
        # through memory anyway): chain-rule sums too, run a chunk of samples at a time
        chain_rule = exceeds_operations(module, SPLIT_ABOVE_OPERATIONS)
        found = contract_linear_forms(module, dtype, literals, chain_rule=chain_rule)
        if found is None:
            return generated
        if chain_rule:
            tile(module)
        logger.info("contracted: %d sums over shared inputs as %d matrix products "
                    "(%d weights)", found.forms, found.groups, found.weights)
        return dataclasses.replace(generated, module=module, source=print_source(module),
                                   literals=tuple(literals))


def _vectorized(generated, vectorize: bool | None, dtype, parameters, stopwatch):
    """`generated` with its body vectorized by template, when `vectorize` asks or pays."""
    if is_contracted(generated.module):
        if vectorize:
            raise BuildError("vectorize=True: the kernel body's sums were contracted into "
                             "matrix products (symkern.codegen.contract), which vectorize "
                             "does not take; pass vectorize=None")
        return generated
    if vectorize is False or (vectorize is None and not exceeds_operations(
            generated.module, VECTORIZE_ABOVE_OPERATIONS)):
        return generated
    with stopwatch.stage("vectorize"):
        module = generated.module  # changed only when vectorized
        literals = list(generated.literals)
        shapes = parameter_shapes([spec.path for spec in parameters],
                                  [spec.shape for spec in parameters])
        operations = operation_count(module)
        body = vectorize_body(module, dtype, literals, operations,
                              VECTORIZE_MIN_SHRINK if vectorize is None else 0.0, shapes)
        if body is None:
            if vectorize:
                raise BuildError("vectorize=True: the kernel body holds a form that cannot be "
                                 "vectorized (see symkern.codegen.vectorize.ELEMENTWISE); pass "
                                 "vectorize=None to fall back to the scalar body")
            return generated
        logger.info("vectorized: %d operations as %d groups (%d template operations) over "
                    "%d levels, %d rows", operations, body.groups,
                    body.template_nodes, body.levels, body.rows)
        return dataclasses.replace(generated, module=module, source=print_source(module),
                                   literals=tuple(literals))


def _split_program(generated, functions, data, dtype, const_count,
                   cache_key: str | None = None) -> SplitProgram | None:
    # a vectorized body is already small for XLA, and not straight-line (its local functions)
    # a contracted one holds arrays, which pieces do not pass between them
    if is_vectorized(generated.module) or is_contracted(generated.module) \
            or not exceeds_operations(generated.module, SPLIT_ABOVE_OPERATIONS):
        return None
    cache = active_cache()
    # user functions are keyed by name only: their compiled bodies are not stored
    store = (ExecutableStore(cache.directory / "executables", cache_key)
             if cache is not None and cache_key is not None and not functions else None)
    rank = len(data[0].shape) if data else 0

    def finish(entries: tuple, arguments: tuple) -> tuple:
        # what Kernel._compute does to the entries: the kernel's dtype, the batch shape
        if data:
            first = arguments[const_count]
            batch = tuple(first.shape)[: first.ndim - rank]
        else:
            batch = ()
        return tuple(jnp.broadcast_to(jnp.asarray(e, dtype), batch) for e in entries)

    return SplitProgram.from_module(generated.module, 10**9, max_operations=PIECE_OPERATIONS,
                                    functions=functions, finish=finish, workers=2, store=store)


def _generate_cached(equations, arguments, data_count, *, cse, functions, embed_max_bytes, dtype,
                     vectorize, split, stopwatch):
    """Stages 1 and 2, through the on-disk cache when `symkern.enable_cache` is on.

    Returns the generated code and its cache key (None without the cache).
    """
    def run() -> Any:
        generated = generate(equations, arguments, data_count, cse=cse, functions=functions,
                             embed_max_bytes=embed_max_bytes, dtype=dtype, stopwatch=stopwatch,
                             share_pairs=split)
        generated = _contracted(generated, dtype, stopwatch)
        return _vectorized(generated, vectorize, dtype, arguments[data_count:], stopwatch)

    cache = active_cache()
    if cache is None:
        return run(), None
    start = time.perf_counter()
    options = {"cse": cse, "functions": sorted(functions or {}), "embed_max_bytes": embed_max_bytes,
               "dtype": np.dtype(dtype).name, "data_count": data_count, "vectorize": vectorize,
               "split": split}
    key = cache_key(equations, arguments, options, library_versions())
    cached = cache.get(key)
    if cached is not None:
        stopwatch.timings["cache_load"] = time.perf_counter() - start
        return cached, key
    generated = run()
    cache.put(key, generated)
    return generated, key


def build_function(
    eqs: Any,
    *data_args: Any,
    params: Any = None,
    cse: bool = True,
    dtype: Any = None,
    embed_max_bytes: int = 32,
    functions: Mapping[str, Callable] | None = None,
    progress: bool | None = None,
    vectorize: bool | None = None,
    split: bool = True,
) -> Kernel:
    """Compile SymPy equations into a batched kernel.

    `eqs` is an Expr, a Matrix, an Array, or a pytree (dict / list / tuple) of those; each
    data argument is a list/tuple/Matrix of symbols (a vector), a MatrixSymbol, or one
    Symbol; `params` is a pytree whose leaves are Symbols, MatrixSymbols or Matrices of
    symbols; `functions` maps the name of an undefined SymPy Function to a JAX function.
    Each stage's time is in `kernel.timings` and logged to the "symkern" logger;
    `progress` shows a bar over the stages (default: when stderr is a terminal).
    `vectorize` evaluates statements that repeat one template as vectors (one gather and
    one expression per template, symkern.codegen.vectorize): None (default) does so for
    bodies above VECTORIZE_ABOVE_OPERATIONS operations when it shrinks them
    VECTORIZE_MIN_SHRINK-fold, True always (BuildError when the body cannot be), False never.
    `split=True` (default) compiles a scalar body above SPLIT_ABOVE_OPERATIONS as pieces,
    a fast build whose live values cross pieces through memory; `split=False` compiles it
    as one executable, without merging common sub-sums in CSE: a slower build, the faster
    kernel (with `vectorize=False` for the scalar body; docs/scaling.md).

    >>> import sympy as sp
    >>> x0, x1, a = sp.symbols("x0 x1 a")
    >>> k = build_function(sp.sin(x0) * a + x1**2, [x0, x1], params={"a": a})
    >>> float(k(np.array([0.0, 3.0]), {"a": 2.0}))
    9.0
    """
    if not isinstance(cse, bool):
        raise BuildError(f"cse: expected True or False, got {cse!r}")
    if vectorize not in (None, True, False):
        raise BuildError(f"vectorize: expected None, True or False, got {vectorize!r}")
    if not isinstance(split, bool):
        raise BuildError(f"split: expected True or False, got {split!r}")
    if not isinstance(embed_max_bytes, int) or embed_max_bytes < 0:
        raise BuildError(f"embed_max_bytes: expected a non-negative int, got {embed_max_bytes!r}")
    functions = dict(functions or {})
    for name, implementation in functions.items():
        if not isinstance(name, str) or not callable(implementation):
            raise BuildError(f"functions[{name!r}]: expected a name mapped to a callable, "
                             f"got {type(implementation).__name__}")
    resolved_dtype = resolve_dtype(dtype)
    start = time.perf_counter()
    stopwatch = Stopwatch(progress=progress)
    data = [data_argument(arg, k + 1) for k, arg in enumerate(data_args)]
    parameters, treedef = parameter_arguments(params)
    check_unique_symbols(data + parameters)
    equations = equation_set(eqs)
    generated, cache_key = _generate_cached(equations, data + parameters, len(data), cse=cse,
                                            functions=functions, embed_max_bytes=embed_max_bytes,
                                            dtype=resolved_dtype, vectorize=vectorize,
                                            split=split, stopwatch=stopwatch)
    namespace_functions: dict[str, Callable] = {}
    captured = []
    if functions:
        with stopwatch.stage("hoist"):
            module, namespace_functions, captured = hoist_captured_constants(
                generated.module, functions, resolved_dtype, embed_max_bytes, generated.literals)
            generated = dataclasses.replace(generated, module=module, source=print_source(module))
    const_args = [
        ConstArg(literal.name, jax.device_put(literal.value),
                 origin_of(literal.used_by, equations.label_of_entry,
                           "array literal (hoist_array_literals)"))
        for literal in generated.literals
    ] + [
        ConstArg(constant.name, jax.device_put(jnp.asarray(constant.value)),
                 origin_of(constant.used_by, equations.label_of_entry,
                           "closed over by "
                           + " and ".join(f'functions["{f}"]' for f in constant.functions)
                           + " (hoist_captured_constants)"))
        for constant in captured
    ]
    warn_if_large(const_args)
    with stopwatch.stage("python_compile"):
        pieces = (_split_program(generated, namespace_functions, data, resolved_dtype,
                                 len(const_args), cache_key) if split else None)
        # decided on the body as generated: materializing copies statements into functions
        # (a vectorized body is told apart below, before this is read)
        big_whole = pieces is None and exceeds_operations(generated.module,
                                                          PROBE_UP_TO_OPERATIONS)
        # a contracted body's shared values are arrays already (and materializing would
        # copy the matrix products they read into the conditional)
        if pieces is None and MATERIALIZE_SHARED and not is_contracted(generated.module):
            materialized = materialize_shared(generated.module,
                                              [f"x{k + 1}" for k in range(len(data))])
            if materialized is not None:
                generated = dataclasses.replace(generated, module=materialized,
                                                source=print_source(materialized))
        # a split kernel's whole body serves traced calls only: compiled when one comes
        function = (compile_kernel(generated.module, namespace_functions, "<symkern kernel>")
                    if pieces is None else
                    LazyKernelFunction(generated.module, namespace_functions, "<symkern kernel>"))
    timings = dict(stopwatch.timings)
    timings["build"] = time.perf_counter() - start
    stopwatch.close()
    signature = KernelSignature(tuple(data), tuple(parameters), treedef, resolved_dtype,
                                params is not None)
    kernel = Kernel(generated, function, signature, equations, timings, tuple(const_args),
                    progress, pieces)
    if is_vectorized(generated.module) or is_tiled(generated.module):
        # its entries are rows of one array (a tiled body: the 8-32-32-8 Jacobian ran 1.1-1.8
        # M/s fused and separate alike): stacking them inside the program is a transpose,
        # as fast as two executables (10^5 ops: 1.84 vs 1.76 s at 100k, 13.0 vs 13.2 ms at
        # 1,024), so the probe's extra compile (3 s at 10^5, 19 s at 10^6) buys nothing
        kernel.assembly = "fused"
    elif big_whole:
        kernel.assembly = "separate"
        kernel.fuse_small_batches = False
    return kernel


def build_nn_function(eqs: Any, snn: Any, *more_data: Any, **options: Any) -> Kernel:
    """`build_function(eqs, snn.input, *more_data, params=snn.params, **options)`.

    `snn` is a `SymbolicNetwork`; `more_data` are further data arguments (e.g. targets `y`
    of a loss). The kernel is called as `f(X, *more, ps)` with `ps` shaped like
    `net.init_params()`.

    >>> from symkern.symbolic import Chain, Dense, SymbolicNetwork
    >>> net = Chain(Dense(2, 3, "tanh"), Dense(3, 2, "tanh"))
    >>> snn = SymbolicNetwork(net)
    >>> f = build_nn_function(snn.output, snn)
    >>> f(np.zeros((5, 2)), net.init_params(0)).shape
    (5, 2)
    """
    if "params" in options:
        raise BuildError("params: build_nn_function takes the parameters from snn.params")
    if not isinstance(snn, (SymbolicNetwork, StructuredNetwork)):
        raise BuildError(f"snn: expected a SymbolicNetwork, got {type(snn).__name__}; "
                         "wrap the network: SymbolicNetwork(net)")
    if isinstance(snn, StructuredNetwork):
        from symkern.batching.structured import build_structured_function

        options.pop("functions", None)
        options.pop("progress", None)
        for option, default in (("vectorize", None), ("split", True)):  # scalar bodies only
            if options.pop(option, default) is not default:
                raise BuildError(f"{option}: a network with a layer above 64 weights compiles "
                                 "as an array program (StructuredNetwork), where this option "
                                 "has no meaning; leave it out")
        return build_structured_function(eqs, snn, *more_data, **options)
    return build_function(eqs, snn.input, *more_data, params=snn.params, **options)
