"""A symbolic network trained with optax: the loss's gradient through the kernel.

`Chain(Dense(1, 16, tanh), Dense(16, 1))` as a symkern kernel fits sin(3x); optax's Adam
takes `jax.grad` of a mean squared error computed by the kernel. The gradient is checked
against the same network written in `jax.numpy` (`net.apply`), and the loss must fall.
Run: python examples/optax_training.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

import symkern as sk


def main(steps: int = 200) -> dict[str, float]:
    net = sk.Chain(sk.Dense(1, 16, "tanh"), sk.Dense(16, 1))
    snn = sk.SymbolicNetwork(net)
    kernel = sk.build_nn_function(snn.output, snn)
    X = jnp.asarray(np.linspace(-1, 1, 256)[:, None], jnp.float32)
    y = jnp.sin(3 * X)
    params = jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float32), net.init_params(seed=0))

    def loss(ps):
        return jnp.mean((kernel(X, ps) - y) ** 2)

    def reference_loss(ps):
        return jnp.mean((net.apply(X, ps) - y) ** 2)

    gradient_difference = max(
        float(jnp.max(jnp.abs(a - b))) for a, b in zip(
            jax.tree_util.tree_leaves(jax.jit(jax.grad(loss))(params)),
            jax.tree_util.tree_leaves(jax.jit(jax.grad(reference_loss))(params)), strict=True))
    optimizer = optax.adam(1e-2)
    state = optimizer.init(params)

    @jax.jit
    def step(ps, state):
        value, grads = jax.value_and_grad(loss)(ps)
        updates, state = optimizer.update(grads, state, ps)
        return optax.apply_updates(ps, updates), state, value

    loss = jax.jit(loss)
    first = float(loss(params))
    for _ in range(steps):
        params, state, _ = step(params, state)
    return {"first_loss": first, "last_loss": float(loss(params)),
            "gradient_difference": gradient_difference}


if __name__ == "__main__":
    print(main())
