"""Single-sample dispatch: a kernel call against the jitted function it wraps, same arguments.

Run: `python benchmarks/dispatch.py`. Prints one JSON line per form; the ratio is what
issue 8 asks about (target ≤ 1.2). Minimum over repeats, since the machine is shared.
"""

from __future__ import annotations

import json
import timeit

import jax
import jax.numpy as jnp
import numpy as np

import symkern as sk
from symkern.symbolic.networks import Chain, Dense, SymbolicNetwork


def best_microseconds(call, number: int = 5000, repeat: int = 7) -> float:
    call()
    return min(timeit.repeat(call, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    net = Chain(Dense(2, 3, "tanh"), Dense(3, 2, "tanh"))
    snn = SymbolicNetwork(net)
    kernel = sk.build_function(snn.output, snn.input, params=snn.params)
    ps = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), net.init_params(0))
    x = jnp.ones(2, jnp.float32)
    prepared = kernel._prepare((x, ps))
    kernel(x, ps)
    tree = best_microseconds(lambda: kernel(x, ps))
    direct = best_microseconds(lambda: kernel._jitted(*prepared))
    flat = kernel.flat()
    theta = kernel.flatten(ps)
    flat(x, theta)
    flat_call = best_microseconds(lambda: flat(x, theta))
    flat_direct = best_microseconds(lambda: flat._fused(kernel._const_values, (x,), theta))
    numpy_ps = net.init_params(0)
    numpy_tree = best_microseconds(lambda: kernel(np.ones(2, np.float32), numpy_ps), number=2000)
    for form, wrapped, underlying in (("tree ps", tree, direct), ("flat theta", flat_call, flat_direct)):
        print(json.dumps({"form": form, "kernel_us": round(wrapped, 2),
                          "jitted_us": round(underlying, 2), "ratio": round(wrapped / underlying, 2)}))
    print(json.dumps({"form": "tree ps, numpy arrays", "kernel_us": round(numpy_tree, 2)}))


if __name__ == "__main__":
    main()
