"""A symkern kernel inside an `equinox.Module`: parameters as fields, the kernel static.

The module holds a damped oscillator's parameters as arrays (trainable leaves) and the
kernel as a static field; `eqx.filter_jit` and `eqx.filter_grad` go through it as through
any equinox model. Checked against the same module written with `jax.numpy`.
Run: python examples/equinox_module.py
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

import symkern as sk

q, p, k, c = sp.symbols("q p k c")
FIELD = sk.build_function(sp.Matrix([p, -k * q - c * p - sp.sin(q) ** 3]), [q, p],
                          params={"k": k, "c": c})


class Oscillator(eqx.Module):
    k: jax.Array
    c: jax.Array
    field: sk.Kernel = eqx.field(static=True)

    def __call__(self, z: jax.Array) -> jax.Array:
        return self.field(z, {"k": self.k, "c": self.c})


class Reference(eqx.Module):
    k: jax.Array
    c: jax.Array

    def __call__(self, z: jax.Array) -> jax.Array:
        q, p = z[..., 0], z[..., 1]
        return jnp.stack([p, -self.k * q - self.c * p - jnp.sin(q) ** 3], axis=-1)


def main() -> float:
    """The largest difference between the two modules' values and parameter gradients."""
    ours = Oscillator(jnp.float32(2.0), jnp.float32(0.1), FIELD)
    theirs = Reference(jnp.float32(2.0), jnp.float32(0.1))
    Z = jnp.asarray(np.random.default_rng(0).normal(size=(128, 2)), jnp.float32)
    target = jnp.zeros_like(Z)

    @eqx.filter_jit
    @eqx.filter_grad
    def grads(model, Z):
        return jnp.mean((model(Z) - target) ** 2)

    values = float(jnp.max(jnp.abs(eqx.filter_jit(ours)(Z) - theirs(Z))))
    g_ours, g_theirs = grads(ours, Z), grads(theirs, Z)
    gradient = max(float(jnp.abs(g_ours.k - g_theirs.k)), float(jnp.abs(g_ours.c - g_theirs.c)))
    return max(values, gradient)


if __name__ == "__main__":
    print(f"largest difference: {main():.2e}")
