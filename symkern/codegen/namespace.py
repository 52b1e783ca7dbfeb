"""codegen, stage 3 helper: the only names a kernel's code can reach.

Imports jax; the generated module is executed with this namespace and no builtins.
"""

from __future__ import annotations

import builtins

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
from jax import lax

from symkern.codegen import interpret, special, trig, vecops


@jax.custom_jvp
def gate(taken, value):
    """`value`, whose derivative is zero wherever `taken` is False.

    Piecewise evaluates every branch on every sample; a branch that is not taken can have
    an infinite partial derivative there (`sqrt` at a negative input), and zero times
    infinity is NaN. Gating each input of a branch masks that NaN before it reaches the
    arguments, so untaken branches contribute exactly zero to every gradient. The value
    is broadcast to the mask's (batch) shape: a parameter read in a branch is gated per
    sample.
    """
    return jnp.broadcast_to(value, jnp.broadcast_shapes(jnp.shape(taken), jnp.shape(value)))


@gate.defjvp
def _gate_jvp(primals, tangents):
    taken, value = primals
    _, value_tangent = tangents
    primal = gate(taken, value)
    tangent = jnp.broadcast_to(value_tangent, primal.shape)
    return primal, jnp.where(taken, tangent, jnp.zeros_like(tangent))


def kernel_namespace(functions: dict | None = None, clinalg: object = None) -> dict:
    """The globals a kernel runs with: jnp, lax, jsp, gate, vec, trig, interp, the user's
    functions and `clinalg`, the C solve an array kernel built with `cpu_loop="c"` calls
    (`clinalg.solve`, symkern.kernels.c_loop's: the import direction runs kernels to
    codegen, so symkern.kernels.stage hands it in)."""
    return {
        # No builtin the generated code could name (the rules admit no such name), but C
        # extensions called from a kernel's frame import lazily through that frame's
        # builtins (PyImport_Import), so the import hook itself must be there.
        "__builtins__": {"__import__": builtins.__import__},
        "jnp": jnp,
        "trig": trig.NAMESPACE,
        "lax": lax,
        "jsp": jsp,
        "special": special,
        "gate": gate,
        "vec": vecops,
        "interp": interpret.NAMESPACE,
        "functions": dict(functions or {}),
        "clinalg": clinalg,
    }


#: every root name that resolved kernel code may read besides its own locals
NAMESPACE_ROOTS = frozenset(kernel_namespace()) - {"__builtins__"}
