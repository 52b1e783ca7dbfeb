"""The main job of `make demo`: build, show every stage, evaluate a million samples, check.

Imports symkern's public API and its models.
"""

from __future__ import annotations

import time

import jax
import numpy as np
import sympy as sp

from symkern.batching.build import build_function, build_nn_function
from symkern.models import double_pendulum
from symkern.symbolic import Chain, Dense, SymbolicNetwork, jacobian

SAMPLES = 1_000_000


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 72 - len(title)))


def _throughput(call, *args, repeats: int = 7) -> float:
    jax.block_until_ready(call(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(call(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def double_pendulum_demo(samples: int = SAMPLES) -> float:
    """Build the double pendulum's equation of motion, print its stages, check a batch.

    Returns the largest relative error against the float64 reference.
    """
    model = double_pendulum()
    start = time.perf_counter()
    kernel = build_function(model.rhs, model.state, params=model.params)
    build_seconds = time.perf_counter() - start

    rng = np.random.default_rng(0)
    states = rng.uniform(-np.pi, np.pi, size=(samples, 4)).astype(np.float32)
    values = {"m1": 1.0, "m2": 0.7, "l1": 1.2, "l2": 0.8, "g": 9.81}

    _section("stage 1: the per-sample code SymPy printed")
    print(kernel.upstream_source)
    _section("stage 2: after the rewrite rules (kernel.source)")
    print(kernel.source)
    _section("stage 3: the jaxpr of one sample")
    print(kernel.jaxpr(states[0], values))

    start = time.perf_counter()
    result = np.asarray(kernel(states, values))
    first_seconds = time.perf_counter() - start
    seconds = _throughput(kernel, states, values)

    symbols = [model.params[name] for name in ("m1", "m2", "l1", "l2", "g")]
    reference_function = sp.lambdify([list(model.state), symbols], list(model.rhs), "numpy")
    check = states[:: max(1, samples // 20_000)].astype(np.float64)
    reference = np.stack(
        np.broadcast_arrays(*reference_function(check.T, [values[n] for n in
                                                          ("m1", "m2", "l1", "l2", "g")])),
        axis=-1,
    )
    got = result[:: max(1, samples // 20_000)].astype(np.float64)
    # norm-wise relative error per sample: float32 against float64, so ~1e-6 is expected
    error = float(np.max(np.max(np.abs(got - reference), axis=-1)
                         / np.max(np.abs(reference), axis=-1)))

    _section("stage 4: a batch")
    print(f"batch {states.shape} -> result {result.shape} ({kernel.dtype.name})")
    print(f"build (emit, rewrite, compile to Python): {build_seconds:.2f} s; "
          f"first call (trace, lower, XLA compile, run): {first_seconds:.2f} s")
    print(f"throughput: {samples / seconds / 1e6:.1f} M samples/s ({seconds * 1e3:.1f} ms per "
          f"{samples:,} samples)")
    print(f"max norm-wise relative error vs a float64 NumPy reference on {len(check):,} samples: "
          f"{error:.2e}")
    return error


def network_demo(samples: int = SAMPLES) -> float:
    """The seed's network: output and input Jacobian on a million samples, against JAX."""
    net = Chain(Dense(2, 3, "tanh"), Dense(3, 2, "tanh"))
    snn = SymbolicNetwork(net)
    start = time.perf_counter()
    kernel = build_nn_function({"output": snn.output,
                                "jacobian": jacobian(snn.output, snn.input)}, snn)
    build_seconds = time.perf_counter() - start
    ps = net.init_params(seed=0)
    X = np.random.default_rng(1).normal(size=(samples, 2)).astype(np.float32)
    result = kernel(X, ps)
    seconds = _throughput(kernel, X, ps)
    jax_ps = jax.tree_util.tree_map(lambda a: jax.numpy.asarray(a, np.float32), ps)
    reference_output = jax.jit(net.apply)(X, jax_ps)
    reference_jacobian = jax.jit(jax.vmap(jax.jacfwd(net.apply), in_axes=(0, None)))(X, jax_ps)
    error = max(float(np.max(np.abs(np.asarray(result["output"]) - reference_output))),
                float(np.max(np.abs(np.asarray(result["jacobian"]) - reference_jacobian))))
    _section("the seed's network Chain(Dense(2, 3, tanh), Dense(3, 2, tanh))")
    print(kernel.source)
    print(f"output {result['output'].shape}, input Jacobian {result['jacobian'].shape}; "
          f"build {build_seconds:.2f} s; {samples / seconds / 1e6:.1f} M samples/s")
    print(f"max |difference| vs jax.vmap(jax.jacfwd(net.apply)): {error:.2e}")
    return error


def main() -> int:
    error = double_pendulum_demo()
    network_error = network_demo()
    if error > 1e-4 or network_error > 1e-5:
        print("FAILED: a kernel disagrees with its reference")
        return 1
    print("\ndemo OK")
    return 0
