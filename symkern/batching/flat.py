"""batching, stage 4: the flat-parameter form — every parameter leaf in one buffer.

Imports jax, numpy and symkern.batching.kernel. Like SymbolicNeuralNetworks.jl's
`build_flat_function`: one device buffer per call instead of one argument per leaf.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from symkern.batching.kernel import (
    NOT_TAKEN,
    Kernel,
    call_direct,
    check_dtype_policy,
    refuse_integer_arrays,
    weak_method,
)
from symkern.batching.packing import PackedParameters, ParameterLayout
from symkern.errors import ArgumentError


class FlatKernel:
    """`kernel.flat()`: called as `flat(*data, theta)` with `theta = kernel.flatten(ps)`.

    Each call passes the data and one parameter buffer, so dispatch costs the same
    whatever the number of leaves (measured in benchmarks/dispatch.py). Convert numpy
    parameters once with `kernel.flatten(ps)`; the buffer is device-resident.
    """

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        # the buffer is the packed form (symkern.batching.packing): the body slices the
        # leaves it reads out of theta
        self._layout = ParameterLayout(kernel.signature.parameters, kernel.dtype)
        self.size = self._layout.size
        self._entries = jax.jit(weak_method(self, "_compute"))
        # as Kernel's direct path: checks at trace time, shapes the checked path ran fused
        self._direct = jax.jit(weak_method(self, "_evaluate_arguments"))
        self._direct_shapes: set[tuple[int, ...]] = set()
        self.integers_seen = False  # as Kernel's: integer data take the checked path
        self._n_arguments = len(kernel.signature.data) + 1

    def leaves(self, theta: Any) -> tuple:
        """The parameter leaves, each reshaped, read out of a flat buffer `theta`."""
        return PackedParameters(theta, self._layout).leaves()

    def _evaluate(self, const_args: tuple, data: tuple, theta: Any) -> Any:
        return self.kernel.program.evaluate(const_args, data,
                                            PackedParameters(theta, self._layout))

    def _compute(self, const_args: tuple, data: tuple, theta: Any) -> tuple:
        return self.kernel.program.entries(const_args, data,
                                           PackedParameters(theta, self._layout))

    def _evaluate_arguments(self, const_args: tuple, args: tuple) -> Any:
        refuse_integer_arrays(self, jax.tree_util.tree_leaves(args))
        data, theta = self._check(args)
        return self._evaluate(const_args, data, theta)

    def _check(self, args: tuple) -> tuple[tuple, Any]:
        kernel = self.kernel
        check_dtype_policy(kernel.dtype)
        if len(args) != self._n_arguments:
            raise ArgumentError(f"flat kernel: expected {self._n_arguments} argument(s) "
                                f"(the data and theta), got {len(args)}")
        *data, theta = args
        if getattr(theta, "shape", None) != (self.size,) or theta.dtype != kernel.dtype:
            raise ArgumentError(f"theta: expected a {kernel.dtype.name} buffer of shape "
                                f"({self.size},) from kernel.flatten(ps), got "
                                f"{getattr(theta, 'dtype', type(theta).__name__)}"
                                f"{getattr(theta, 'shape', '')}")
        return kernel.check_data(data), theta

    def __call__(self, *args: Any) -> Any:
        kernel = self.kernel
        result = call_direct(self._direct, self._direct_shapes, kernel.const_values, args,
                             self.integers_seen)
        if result is not NOT_TAKEN:
            return result
        data, theta = self._check(args)
        if kernel.runs_fused:
            result = self._direct(kernel.const_values, data + (theta,))
            if data and not any(isinstance(a, jax.core.Tracer) for a in data):
                self._direct_shapes.add(tuple(data[0].shape))
            return result
        return kernel.assemble(self._entries(kernel.const_values, data, theta))

    def __repr__(self) -> str:
        return f"FlatKernel({self.kernel!r}, theta: ({self.size},))"


def flatten_parameters(kernel: Kernel, ps: Any) -> Any:
    """All parameter leaves of `ps`, in argument order, raveled into one device buffer."""
    if kernel.packs_parameters:  # the same buffer, by the packing kernel's own route
        return jax.device_put(kernel.pack_parameters(ps).buffer)
    leaves = kernel.check_parameters(ps)
    if not leaves:
        return jax.device_put(np.zeros((0,), kernel.dtype))
    return jax.device_put(np.concatenate([np.ravel(np.asarray(leaf, kernel.dtype))
                                          for leaf in leaves]))


def unflatten_parameters(kernel: Kernel, theta: Any) -> Any:
    """The parameter tree back from a flat buffer (e.g. after an optimizer step)."""
    flat = FlatKernel(kernel)
    return jax.tree_util.tree_unflatten(kernel.signature.parameter_treedef,
                                        list(flat.leaves(jnp.asarray(theta))))
