"""The parameter gradient of a Jacobian entry, symbolically, checked against nested JAX AD.

d/dθ (∂y₀/∂x₁) for a small network: SymPy differentiates twice, symkern compiles the
result into one batched kernel. Run: python examples/double_derivative.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import symkern as sk


def main() -> float:
    jax.config.update("jax_enable_x64", True)
    net = sk.Chain(sk.Dense(2, 3, "tanh"), sk.Dense(3, 2, "sigmoid"))
    snn = sk.SymbolicNetwork(net)
    entry = sk.jacobian(snn.output, snn.input)[0, 1]
    gradient = sk.parameter_gradient(entry, snn)          # same tree as snn.params
    kernel = sk.build_nn_function(gradient, snn, dtype="float64")

    ps = net.init_params(seed=3)
    X = np.random.default_rng(0).normal(size=(5, 2))
    ours = kernel(X, ps)

    def entry_of(x, p):
        return jax.jacfwd(lambda v: net.apply(v, p))(x)[0, 1]

    reference = jax.vmap(jax.grad(entry_of, argnums=1), in_axes=(0, None))(
        jnp.asarray(X), jax.tree_util.tree_map(jnp.asarray, ps))
    error = max(float(jnp.max(jnp.abs(a - b) / (jnp.abs(b) + 1e-12)))
                for a, b in zip(jax.tree_util.tree_leaves(ours),
                                jax.tree_util.tree_leaves(reference), strict=True))
    print(kernel.source)
    print(f"max relative difference vs jax.grad(jax.jacfwd(...)): {error:.2e}")
    return error


if __name__ == "__main__":
    main()
