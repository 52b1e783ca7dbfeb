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
from symkern.batching.kernel import Kernel
from symkern.batching.packing import packs
from symkern.batching.program import (
    KernelSignature,
    ScalarProgram,
    batched_entries,
    complex_kernel_dtype,
    entry_dtypes,
)
from symkern.codegen.arrays import any_needs_array_program
from symkern.codegen.cache import cache_key
from symkern.codegen.emit import implemented_functions
from symkern.codegen.passes import (
    CACHED_PASSES,
    PASSES,
    PIECE_OPERATIONS,
    PIECES,
    BuildOptions,
    PassContext,
    run_passes,
)
from symkern.codegen.pipeline import generate, print_source
from symkern.codegen.stopwatch import Stopwatch
from symkern.collector import collection_paused
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


#: the dtypes a kernel computes in
KERNEL_DTYPES = tuple(map(np.dtype, ("float32", "float64", "complex64", "complex128")))
#: ... those of them that need jax_enable_x64
WIDE_DTYPES = (np.dtype("float64"), np.dtype("complex128"))


def resolve_dtype(dtype: Any, imaginary: bool = False) -> np.dtype:
    """`None` → JAX's default float (float32, or float64 under jax_enable_x64), or its
    complex type (complex64, complex128) for equations that hold the imaginary unit."""
    if dtype is None:
        return np.dtype(jnp.result_type(complex if imaginary else float))
    try:
        resolved = np.dtype(dtype)
    except TypeError as error:
        raise BuildError(f"dtype: expected a floating dtype such as 'float32', got {dtype!r}") from error
    if resolved not in KERNEL_DTYPES:
        raise BuildError("dtype: expected float32, float64, complex64 or complex128, got "
                         f"{resolved.name}")
    if resolved in WIDE_DTYPES and not jax.config.jax_enable_x64:
        raise BuildError(
            f"dtype: {resolved.name} needs jax.config.update('jax_enable_x64', True) before "
            f"building; without it JAX computes in {'complex64' if resolved.kind == 'c' else 'float32'}"
        )
    return resolved


def _split_program(generated, functions, data, kernel_dtype, dtypes, const_count,
                   cache_key: str | None = None, batched: tuple = ()) -> SplitProgram | None:
    """The pieces of a body the `split` pass marked (symkern.kernels.split), else None.
    `dtypes`: each entry's (`entry_dtypes`), None in a complex kernel; `batched`: each
    entry's `ScalarProgram.entry_batched`."""
    if generated.form != PIECES:
        return None
    cache = active_cache()
    # user functions are keyed by name only: their compiled bodies are not stored
    store = (ExecutableStore(cache.directory / "executables", cache_key)
             if cache is not None and cache_key is not None and not functions else None)
    rank = len(data[0].shape) if data else 0

    def finish(entries: tuple, arguments: tuple) -> tuple:
        # what Kernel._compute does to the entries: each entry's dtype, the batch shape
        # (none for an unbatched equation's)
        if data:
            first = arguments[const_count]
            batch = tuple(first.shape)[: first.ndim - rank]
        else:
            batch = ()
        kinds = ([complex_kernel_dtype(jnp.result_type(e), kernel_dtype) for e in entries]
                 if dtypes is None else dtypes)  # a complex kernel's: the kind JAX computed
        return tuple(jnp.broadcast_to(jnp.asarray(e, dtype), batch if shaped else ())
                     for e, dtype, shaped in zip(entries, kinds, batched, strict=True))

    return SplitProgram.from_module(generated.module, 10**9, max_operations=PIECE_OPERATIONS,
                                    functions=functions, finish=finish, workers=2, store=store)


def _generate_cached(equations, arguments, data_count, *, functions, context: PassContext):
    """Stages 1 and 2 and the first CACHED_PASSES passes, through the on-disk cache when
    `symkern.enable_cache` is on.

    Returns the generated code and its cache key (None without the cache).
    """
    options = context.options

    def run() -> Any:
        generated = generate(equations, arguments, data_count, cse=options.cse,
                             functions=functions, embed_max_bytes=options.embed_max_bytes,
                             dtype=context.dtype, stopwatch=context.stopwatch,
                             share_pairs=options.split,
                             unbatched_constants=options.constant_outputs == "unbatched")
        return run_passes(generated, context, PASSES[:CACHED_PASSES])

    cache = active_cache()
    if cache is None:
        return run(), None
    start = time.perf_counter()
    key_options = {**options.key(), "functions": sorted(functions or {}),
                   "data_count": data_count, "backend": context.backend}
    key = cache_key(equations, arguments, key_options, library_versions())
    cached = cache.get(key)
    if cached is not None:
        context.stopwatch.timings["cache_load"] = time.perf_counter() - start
        return cached, key
    generated = run()
    cache.put(key, generated)
    return generated, key


def build_options(options: BuildOptions | None, **given: Any) -> BuildOptions:
    """`options` (or the defaults) with the keyword arguments a build function was given."""
    if options is not None and not isinstance(options, BuildOptions):
        raise BuildError(f"options: expected a symkern.BuildOptions, got {type(options).__name__}")
    base = options or BuildOptions()
    changes = {name: value for name, value in given.items() if value is not UNSET}
    return dataclasses.replace(base, **changes) if changes else base


#: marks a keyword argument left out (its value is then the BuildOptions field's)
UNSET: Any = object()


@collection_paused()
def build_function(
    eqs: Any,
    *data_args: Any,
    params: Any = None,
    cse: bool = UNSET,
    dtype: Any = UNSET,
    embed_max_bytes: int = UNSET,
    functions: Mapping[str, Callable] | None = None,
    progress: bool | None = None,
    vectorize: bool | None = UNSET,
    split: bool = UNSET,
    options: BuildOptions | None = None,
) -> Kernel:
    """Compile SymPy equations into a batched kernel.

    `eqs` is an Expr, a Matrix, an Array, or a pytree (dict / list / tuple) of those; each
    data argument is a list/tuple/Matrix of symbols (a vector), a MatrixSymbol, or one
    Symbol; `params` is a pytree whose leaves are Symbols, MatrixSymbols or Matrices of
    symbols; `functions` maps the name of an undefined SymPy Function to a JAX function.
    Each stage's time is in `kernel.timings` and logged to the "symkern" logger;
    `progress` shows a bar over the stages (default: when stderr is a terminal).

    Every other choice is a field of `options` (a `BuildOptions`; its docstring lists them),
    and `cse`, `dtype`, `embed_max_bytes`, `vectorize` and `split`, given here, replace the
    field of the same name. The passes those choices steer are `symkern.codegen.passes.PASSES`
    (docs/codegen.md). `kernel.options` is what the build used.

    >>> import sympy as sp
    >>> x0, x1, a = sp.symbols("x0 x1 a")
    >>> k = build_function(sp.sin(x0) * a + x1**2, [x0, x1], params={"a": a})
    >>> float(k(np.array([0.0, 3.0]), {"a": 2.0}))
    9.0
    """
    chosen = build_options(options, cse=cse, embed_max_bytes=embed_max_bytes,
                           vectorize=vectorize, split=split,
                           dtype=dtype)
    functions = dict(functions or {})
    for name, implementation in functions.items():
        if not isinstance(name, str) or not callable(implementation):
            raise BuildError(f"functions[{name!r}]: expected a name mapped to a callable, "
                             f"got {type(implementation).__name__}")
    if any_needs_array_program(eqs):
        from symkern.batching.arrays import build_array_function

        return build_array_function(eqs, *data_args, params=params, options=chosen,
                                    functions=functions)
    start = time.perf_counter()
    stopwatch = Stopwatch(progress=progress)
    data = [data_argument(arg, k + 1) for k, arg in enumerate(data_args)]
    parameters, treedef = parameter_arguments(params)
    check_unique_symbols(data + parameters)
    equations = equation_set(eqs)
    resolved_dtype = resolve_dtype(chosen.dtype, chosen.dtype is None and equations.imaginary)
    chosen = chosen.resolved(resolved_dtype)
    # lambdify's implemented_function: the implementation travels with the function
    functions = {**implemented_functions(equations.leaves), **functions}
    context = PassContext(chosen, len(data), tuple(spec.path for spec in parameters),
                          tuple(spec.shape for spec in parameters), jax.default_backend(),
                          stopwatch, packed_parameters=packs(parameters),
                          data_ranks=tuple(len(spec.shape) for spec in data))
    generated, cache_key = _generate_cached(equations, data + parameters, len(data),
                                            functions=functions, context=context)
    namespace_functions: dict[str, Callable] = {}
    captured = []
    if functions:
        with stopwatch.stage("hoist"):
            module, namespace_functions, captured = hoist_captured_constants(
                generated.module, functions, resolved_dtype, chosen.embed_max_bytes,
                generated.literals)
            generated = dataclasses.replace(generated, module=module, source=print_source(module))
    generated = run_passes(generated, context, PASSES[CACHED_PASSES:])
    # after the passes: the interpret pass hands its tables in as const args too
    const_args = [
        ConstArg(literal.name, jax.device_put(literal.value),
                 origin_of(literal.used_by, equations.label_of_entry, literal.origin))
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
        pieces = _split_program(generated, namespace_functions, data, resolved_dtype,
                                None if resolved_dtype.kind == "c"
                                else entry_dtypes(equations, resolved_dtype), len(const_args),
                                cache_key, batched_entries(equations, generated.unbatched))
        # a split kernel's whole body serves traced calls only: compiled when one comes
        function = (compile_kernel(generated.module, namespace_functions, "<symkern kernel>")
                    if pieces is None else
                    LazyKernelFunction(generated.module, namespace_functions, "<symkern kernel>"))
    timings = dict(stopwatch.timings)
    timings["build"] = time.perf_counter() - start
    stopwatch.close()
    signature = KernelSignature(tuple(data), tuple(parameters), treedef, resolved_dtype,
                                params is not None)
    program = ScalarProgram(generated, function, signature, equations,
                            tuple(c.value for c in const_args))
    if chosen.cpu_loop == "c":
        from symkern.batching.c_loop import c_loop_program

        start_loop = time.perf_counter()
        program = c_loop_program(program, const_count=len(const_args),
                                 functions=bool(namespace_functions), backend=context.backend)
        # the loop writes each equation whole: no pieces, nothing to assemble apart
        pieces = None
        program.generated = dataclasses.replace(generated, assembly="fused")
        timings["c_loop"] = time.perf_counter() - start_loop
        timings["build"] += timings["c_loop"]
    return Kernel(program, timings, tuple(const_args), progress, pieces, chosen)


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
            if options.pop(option, default) not in (default, UNSET):
                raise BuildError(f"{option}: a network with a layer above 64 weights compiles "
                                 "as an array program (StructuredNetwork), where this option "
                                 "has no meaning; leave it out")
        return build_structured_function(eqs, snn, *more_data, **options)
    return build_function(eqs, snn.input, *more_data, params=snn.params, **options)
