"""A Hamiltonian neural network: H(q, p) a network, its vector field J∇H a symkern kernel.

Trains H so that J∇H matches a harmonic oscillator's field (jax.grad through the kernel),
then runs a few hundred leapfrog steps for a batch of initial conditions and checks them
against the same integration with JAX's own autodiff field. Run: python examples/hnn.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

import symkern as sk


def build(width: int = 8):
    net = sk.Chain(sk.Dense(2, width, "tanh"), sk.Linear(width, 1))
    snn = sk.SymbolicNetwork(net)
    hamiltonian = snn.output[0]
    dq, dp = sk.gradient(hamiltonian, snn.input)
    field = sp.Matrix([dp, -dq])  # J∇H with J = [[0, 1], [-1, 0]]
    return net, sk.build_nn_function(field, snn)


def train(net, field, steps: int = 300, seed: int = 0):
    """Fit J∇H to the oscillator q' = p, p' = -q by gradient descent through the kernel."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.5, 1.5, size=(512, 2))
    target = np.stack([X[:, 1], -X[:, 0]], axis=-1)
    ps = jax.tree_util.tree_map(jnp.asarray, net.init_params(seed))

    @jax.jit
    def step(ps):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((field(X, p) - target) ** 2))(ps)
        return jax.tree_util.tree_map(lambda w, g: w - 0.5 * g, ps, grads), loss

    losses = []
    for _ in range(steps):
        ps, loss = step(ps)
        losses.append(float(loss))
    return ps, losses


def leapfrog(vector_field, z, dt: float, steps: int):
    """Störmer–Verlet on z = (q, p) with the field's components dq/dt, dp/dt."""
    def one(z, _):
        q, p = z[..., 0], z[..., 1]
        p_half = p + 0.5 * dt * vector_field(jnp.stack([q, p], -1))[..., 1]
        q_new = q + dt * vector_field(jnp.stack([q, p_half], -1))[..., 0]
        p_new = p_half + 0.5 * dt * vector_field(jnp.stack([q_new, p_half], -1))[..., 1]
        return jnp.stack([q_new, p_new], -1), None

    return jax.lax.scan(one, z, None, length=steps)[0]


def main(steps: int = 300, train_steps: int = 300) -> dict:
    net, field = build()
    ps, losses = train(net, field, train_steps)

    def autodiff_field(z):
        grad = jax.vmap(jax.grad(lambda x: net.apply(x, ps)[0]))(z)
        return jnp.stack([grad[..., 1], -grad[..., 0]], -1)

    z0 = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, size=(64, 2)), field.dtype)
    ours = leapfrog(lambda z: field(z, ps), z0, 0.05, steps)
    reference = leapfrog(autodiff_field, z0, 0.05, steps)
    difference = float(jnp.max(jnp.abs(ours - reference)))
    radius = jnp.linalg.norm(ours, axis=-1) / jnp.linalg.norm(z0, axis=-1)
    report = {"first_loss": losses[0], "last_loss": losses[-1], "max_difference": difference,
              "radius_ratio_range": (float(radius.min()), float(radius.max()))}
    print(f"trained J∇H: loss {losses[0]:.4f} -> {losses[-1]:.6f}")
    print(f"{steps} leapfrog steps for {z0.shape[0]} initial conditions; "
          f"max |symkern - jax autodiff| = {difference:.2e}")
    print(f"radius after/before: {report['radius_ratio_range'][0]:.3f} .. "
          f"{report['radius_ratio_range'][1]:.3f} (1 for the exact oscillator)")
    return report


if __name__ == "__main__":
    main()
