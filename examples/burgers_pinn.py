"""A physics-informed network for Burgers' equation u_t + u u_x = ν u_xx, trained with optax.

The network u(t, x) is `Chain(Dense(2, 32, tanh), Dense(32, 32, tanh), Dense(32, 1))`; the
residual is written with symkern's symbolic derivatives (`sk.gradient`, `sk.hessian`) and
compiled as one structured kernel; the training loss (the residual at collocation points
plus the initial condition u(0, x) = -sin(πx)) is differentiated by `jax.grad` through it.
Checked against the residual formed with forward-mode `jax.jvp` on the same network
written in `jax.numpy`. Run: python examples/burgers_pinn.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import sympy as sp

import symkern as sk

NU = 0.01 / np.pi


def mlp(ps, z):
    h = z
    for name in ("L1", "L2"):
        h = jnp.tanh(ps[name]["W"] @ h + ps[name]["b"])
    return (ps["L3"]["W"] @ h + ps["L3"]["b"])[0]


def jvp_residual(ps, z):
    """u_t + u u_x - ν u_xx at one point z = (t, x), by nested forward mode."""
    u = lambda z: mlp(ps, z)  # noqa: E731
    e_t, e_x = jnp.zeros_like(z).at[0].set(1), jnp.zeros_like(z).at[1].set(1)
    value, u_t = jax.jvp(u, (z,), (e_t,))
    u_x_of = lambda z: jax.jvp(u, (z,), (e_x,))[1]  # noqa: E731
    u_x, u_xx = jax.jvp(u_x_of, (z,), (e_x,))
    return u_t + value * u_x - NU * u_xx


def main(steps: int = 60) -> dict[str, float]:
    net = sk.Chain(sk.Dense(2, 32, "tanh"), sk.Dense(32, 32, "tanh"), sk.Dense(32, 1))
    snn = sk.StructuredNetwork(net)
    u = snn.output[0]
    gradient = sk.gradient(u, snn.input)
    residual = gradient[0] + u * gradient[1] - NU * sk.hessian(u, snn.input)[1, 1]
    kernels = {"residual": sk.build_nn_function(residual, snn),
               "u": sk.build_nn_function(sp.Matrix([u]), snn)}
    rng = np.random.default_rng(0)
    inside = jnp.asarray(np.c_[rng.uniform(0, 1, 512), rng.uniform(-1, 1, 512)], jnp.float32)
    x0 = rng.uniform(-1, 1, 128)
    initial = jnp.asarray(np.c_[np.zeros_like(x0), x0], jnp.float32)
    u0 = jnp.asarray(-np.sin(np.pi * x0), jnp.float32)
    params = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float32), net.init_params(seed=1))

    def loss(ps):
        r = kernels["residual"](inside, ps)
        return jnp.mean(r ** 2) + jnp.mean((kernels["u"](initial, ps)[..., 0] - u0) ** 2)

    def reference_loss(ps):
        r = jax.vmap(lambda z: jvp_residual(ps, z))(inside)
        return jnp.mean(r ** 2) + jnp.mean((jax.vmap(lambda z: mlp(ps, z))(initial) - u0) ** 2)

    residual_difference = float(jnp.max(jnp.abs(
        kernels["residual"](inside, params) - jax.vmap(lambda z: jvp_residual(params, z))(inside))))
    gradient_difference = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(params)),
        jax.tree_util.tree_leaves(jax.jit(jax.grad(reference_loss))(params)), strict=True))
    optimizer = optax.adam(3e-3)
    state = optimizer.init(params)

    @jax.jit
    def step(ps, state):
        grads = jax.grad(loss)(ps)
        updates, state = optimizer.update(grads, state, ps)
        return optax.apply_updates(ps, updates), state

    loss = jax.jit(loss)
    first = float(loss(params))
    for _ in range(steps):
        params, state = step(params, state)
    return {"first_loss": first, "last_loss": float(loss(params)),
            "residual_difference": residual_difference,
            "gradient_difference": gradient_difference}


if __name__ == "__main__":
    print(main())
