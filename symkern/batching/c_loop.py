"""batching: CLoopProgram — a scalar kernel whose batch runs as one C loop on the CPU.

Imports jax, symkern.batching.program, symkern.codegen.c_loop, symkern.kernels.c_loop and
symkern.kernels.memory.

`BuildOptions(cpu_loop="c")` builds the kernel's XLA program as always and, beside it, the
loop of symkern.codegen.c_loop: every call — eager, under `jax.jit`, folded `jax.vmap`,
bind, flat, stream — runs the loop as one custom call (docs/design/cpu-throughput.md, "A C
loop per sample"). Derivatives are the XLA program's (`jax.custom_jvp`: `jax.grad`,
`jax.jvp` and `jax.hessian` differentiate the same body, generated from the same SymPy
equations). The exported and sharded forms run the XLA program (`portable`): an FFI target
is registered in the process that compiled it only, and a custom call is not split over
devices.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax

from symkern.batching.packing import PackedParameters
from symkern.batching.program import ScalarProgram
from symkern.codegen.c_loop import CLoopSource, c_loop_source
from symkern.errors import BuildError
from symkern.kernels import c_loop as loops
from symkern.kernels import memory


def refuse(reason: str) -> None:
    """Raise the BuildError of `cpu_loop="c"` naming `reason`, what stands in its way."""
    raise BuildError(f"cpu_loop='c': {reason}; build with the default cpu_loop='xla'")


def refuse_c_loop(program: ScalarProgram, *, const_count: int, functions: bool,
                  backend: str) -> None:
    """BuildError unless `program` can run as a C loop, naming what stands in the way."""
    signature = program.signature
    if backend != "cpu":
        refuse(f"the C loop runs on the CPU, and JAX's default backend is {backend}")
    if not signature.data:
        refuse("the C loop runs over a batch of data, and the kernel takes no data argument")
    for spec in signature.data + signature.parameters:
        if spec.matrix_symbols:
            refuse(f"{spec.label} is a MatrixSymbol, which the C loop does not read")
    if any(program.equations.boolean):
        refuse("an equation is a condition (a bool result), which the C loop does not write")
    if not all(program.entry_batched):
        refuse("constant_outputs='unbatched' returns some equations without the batch, "
               "which the C loop does not")
    if const_count:
        refuse("the body holds array constants (const args), which the C loop does not read")
    if functions:
        refuse("`functions` are JAX implementations, which the C loop cannot call")


class CLoopProgram(ScalarProgram):
    """A ScalarProgram whose `evaluate` runs the C loop, differentiated as `portable`."""

    def __init__(self, program: ScalarProgram, printed: CLoopSource) -> None:
        super().__init__(program.generated, program.function, program.signature,
                         program.equations, program.const_values)
        self._portable = program
        # the loop writes each equation whole, shaped `batch + shape`: nothing to assemble
        self.needs_assembly = False
        #: the printed loop (its C++ is `source`)
        self.printed = printed
        self._data_shapes = tuple(tuple(spec.shape) for spec in program.signature.data)
        #: the fewest samples a thread of the loop takes (symkern.kernels.c_loop.GRAIN when
        #: the kernel was built)
        self.grain = loops.GRAIN
        #: the output bytes from which a call writes past the caches (the last-level cache's
        #: size when the kernel was built, at most 32 MiB: symkern.kernels.memory.
        #: stream_from_bytes, symkern.kernels.c_loop.streams)
        self.stream_from = memory.stream_from_bytes()
        self._loop = _differentiated(self._run, program.evaluate)

    @property
    def portable(self) -> ScalarProgram:
        """The XLA program of the same equations: derivatives, export and shard run it."""
        return self._portable

    @property
    def source(self) -> str:
        """The C++ the kernel's calls run (the XLA program's: `portable.source`)."""
        return self.printed.source

    def _flat_parameters(self, parameter_leaves: Any) -> Any:
        if not self.signature.parameters:
            return None
        if isinstance(parameter_leaves, PackedParameters):
            return parameter_leaves.buffer  # leaves raveled in argument order
        return jax.numpy.concatenate([jax.numpy.ravel(jax.numpy.asarray(leaf, self.dtype))
                                      for leaf in parameter_leaves])

    def _run(self, const_args: tuple, data: tuple, parameter_leaves: Any) -> Any:
        leaves = loops.call_loop(self.printed, data, self._data_shapes,
                                 self._flat_parameters(parameter_leaves), self.equations.shapes,
                                 self.batch_shape(data), self.grain, self.stream_from)
        return jax.tree_util.tree_unflatten(self.equations.treedef, leaves)

    def evaluate(self, const_args: tuple, data: tuple, parameter_leaves: Any,
                 mapped: int | None = None) -> Any:
        """The equations' values, computed by the loop."""
        return self._loop(const_args, data, parameter_leaves)

    def entries(self, const_args: tuple, data: tuple, parameter_leaves: Any,
                mapped: int | None = None) -> tuple:
        """Every scalar entry, read from the loop's results (`evaluate`)."""
        result = self.evaluate(const_args, data, parameter_leaves)
        batch_shape = self.batch_shape(data)
        entries = []
        for leaf, shape in zip(self.equations.treedef.flatten_up_to(result),
                               self.equations.shapes, strict=True):
            flat = jax.numpy.reshape(leaf, batch_shape + (math.prod(shape),))
            entries += [flat[..., k] for k in range(math.prod(shape))]
        return tuple(entries)


def _differentiated(run: Callable[..., Any], evaluate: Callable[..., Any]) -> Callable[..., Any]:
    """`run`, whose derivatives are `evaluate`'s (the XLA program of the same equations)."""
    @jax.custom_jvp
    def loop(const_args: tuple, data: tuple, parameter_leaves: Any) -> Any:
        return run(const_args, data, parameter_leaves)

    @loop.defjvp
    def _jvp(primals: tuple, tangents: tuple) -> tuple[Any, Any]:
        return jax.jvp(evaluate, primals, tangents)

    return loop


def c_loop_program(program: ScalarProgram, *, const_count: int, functions: bool,
                   backend: str) -> CLoopProgram:
    """`program` with its calls run by a C loop: refused (BuildError) where it cannot,
    printed and compiled otherwise."""
    refuse_c_loop(program, const_count=const_count, functions=functions, backend=backend)
    signature = program.signature
    printed = c_loop_source(program.equations.entries(),
                            [spec.entries for spec in signature.data],
                            [symbol for spec in signature.parameters for symbol in spec.entries],
                            [math.prod(shape) for shape in program.equations.shapes],
                            signature.dtype.name)
    loops.compile_loop(printed)
    return CLoopProgram(program, printed)


__all__ = ["CLoopProgram", "c_loop_program", "refuse", "refuse_c_loop"]
