"""An ensemble of double pendulums in diffrax: a SymPy-derived vector field, `jax.vmap`.

The equation of motion comes from the Lagrangian (symkern.models); the kernel is the vector
field of `diffrax.ODETerm`, and `jax.vmap` over `diffeqsolve` integrates one trajectory per
initial condition, each with its own step sizes. `jax.vmap` folds the mapped axis into the
kernel's own batch, so every step is one batched kernel call. Checked against the same
integration with the right-hand side from `sympy.lambdify(..., "jax")`.
Run: python examples/diffrax_ensemble.py
"""

from __future__ import annotations

import diffrax
import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

import symkern as sk
from symkern.models import double_pendulum

VALUES = {"g": 9.81, "l1": 1.0, "l2": 0.7, "m1": 1.0, "m2": 1.3}


def solve(field, y0: jax.Array, t1: float) -> jax.Array:
    term = diffrax.ODETerm(lambda t, y, args: field(y))
    solution = diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=0.0, t1=t1, dt0=0.01, y0=y0,
                                   stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6))
    return solution.ys[-1]


def main(trajectories: int = 64, t1: float = 1.0) -> float:
    """The largest difference between the two ensembles' end states."""
    model = double_pendulum()
    kernel = sk.build_function(model.rhs, list(model.state), params=dict(model.params),
                               dtype="float32")
    ps = {key: jnp.float32(value) for key, value in VALUES.items()}
    names = sorted(model.params)
    reference = sp.lambdify([list(model.state)] + [model.params[n] for n in names],
                            list(model.rhs), modules="jax")

    def reference_field(y):
        return jnp.stack(reference(list(y), *[ps[n] for n in names]))

    y0 = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (trajectories, 4)), jnp.float32)
    ours = jax.jit(jax.vmap(lambda y: solve(lambda z: kernel(z, ps), y, t1)))(y0)
    theirs = jax.jit(jax.vmap(lambda y: solve(reference_field, y, t1)))(y0)
    return float(jnp.max(jnp.abs(ours - theirs)))


if __name__ == "__main__":
    print(f"largest end-state difference: {main():.2e}")
