"""Single-sample dispatch: a kernel call against the jitted function it wraps, same arguments.

Run: `python benchmarks/dispatch.py`. Prints one JSON line per form; the ratio is the
dispatch overhead (target ≤ 1.2). Minimum over repeats, since the machine is shared.
"""

from __future__ import annotations

import json
import timeit

import jax
import jax.numpy as jnp
import numpy as np

import symkern as sk
from symkern.symbolic.networks import Chain, Dense, SymbolicNetwork


def paired_microseconds(wrapped, underlying, number: int = 2000, rounds: int = 15):
    """Best of alternating rounds for both calls, so load on a shared machine hits both."""
    wrapped(), underlying()
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, call in enumerate((wrapped, underlying)):
            best[i] = min(best[i], timeit.timeit(call, number=number) / number * 1e6)
    return best


def main() -> None:
    net = Chain(Dense(2, 3, "tanh"), Dense(3, 2, "tanh"))
    snn = SymbolicNetwork(net)
    kernel = sk.build_function(snn.output, snn.input, params=snn.params)
    ps = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), net.init_params(0))
    x = jnp.ones(2, jnp.float32)
    flat = kernel.flat()
    theta = kernel.flatten(ps)
    numpy_ps = net.init_params(0)
    x_numpy = np.ones(2, np.float32)
    bound = kernel.bind(ps)
    consts = kernel._const_values
    # each form against the jitted function its call hands the same arguments to
    pairs = {
        "tree ps": (lambda: kernel(x, ps), lambda: kernel._direct(consts, (x, ps))),
        "flat theta": (lambda: flat(x, theta), lambda: flat._direct(consts, (x, theta))),
        "tree ps, numpy arrays": (lambda: kernel(x_numpy, numpy_ps),
                                  lambda: kernel._direct(consts, (x_numpy, numpy_ps))),
        "bound": (lambda: bound(x), lambda: kernel._direct(consts, (x,) + bound._tail)),
    }
    for form, (wrapped, underlying) in pairs.items():
        wrapped_us, underlying_us = paired_microseconds(wrapped, underlying)
        print(json.dumps({"form": form, "kernel_us": round(wrapped_us, 2),
                          "jitted_us": round(underlying_us, 2),
                          "ratio": round(wrapped_us / underlying_us, 2)}))


if __name__ == "__main__":
    main()
