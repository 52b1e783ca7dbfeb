"""Training and ensemble steps through symkern's symbolic derivatives, against plain JAX.

    python benchmarks/training.py [--rounds 31] [--ensemble 10000] [--hnn 4096] [--pinn 4096]
                                  [--out benchmarks/results/training.json]

Three workloads, each timed round-robin in this process (`compare.round_robin`, float32,
every call jitted, compiled and warm before timing); each row is one formulation's median
step time, and `ratio` is the fastest plain-JAX formulation's time over symkern's (≥ 1:
symkern is at least as fast):

* ensemble: one `diffrax.diffeqsolve` of the double pendulum (symkern.models), fixed-step
  Tsit5, `ENSEMBLE_STEPS` steps, under `jax.vmap` over the initial conditions; the vector
  field is the symkern kernel or the same equations hand-written in `jax.numpy`;
* hnn: a gradient step of a Hamiltonian network `Chain(Dense(2, 40, tanh), Linear(40, 1))`
  whose loss is the mean squared error of its field J∇H against an oscillator's. symkern:
  the field from `sk.hamiltonian_vector_field` (symbolic input derivatives of a structured
  network), the parameters' gradient by `jax.grad` through its kernel ("grad-through-field")
  and by the kernel of `sk.parameter_gradient` of the per-sample loss, averaged
  ("parameter-gradient"); plain JAX: `jax.grad` of the loss over `jax.vmap(jax.grad(H))`,
  over ∇H of the batch as one reverse pass of `sum(H)`, and over the hand-written ∇H;
* pinn: a gradient step of a Burgers PINN 2-32-32-1 (residual u_t + u u_x − ν u_xx at the
  collocation points plus the initial condition at a quarter as many points). symkern: the
  residual kernel from `sk.gradient` / `sk.hessian` ("grad-through-residual") and the kernel
  of `sk.parameter_gradient` of the per-sample loss; plain JAX: the residual by nested
  `jax.jvp`, per point under `jax.vmap` (jnp and equinox MLPs) and on the whole batch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import round_robin  # noqa: E402

import symkern as sk  # noqa: E402

NU = 0.01 / np.pi
LEARNING_RATE = 1e-3
#: back-to-back calls of one formulation per round; the first is not timed (`_bursts`)
BURST = 5
ENSEMBLE_STEPS = 10
ENSEMBLE_DT = 0.01
PENDULUM = {"g": 9.81, "l1": 1.0, "l2": 0.7, "m1": 1.0, "m2": 1.3}


def _f32(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda v: jnp.asarray(v, jnp.float32), tree)


def _sgd(loss: Callable) -> Callable:
    """A jitted step `ps -> (ps - lr * ∇loss(ps), loss(ps))`."""
    def step(ps):
        value, grads = jax.value_and_grad(loss)(ps)
        return jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, ps, grads), value
    return jax.jit(step)


def _mean_gradient_step(loss: Callable, per_sample: Callable, scale: float) -> Callable:
    """A jitted step whose gradient is `scale` × the batch mean of per-sample gradients."""
    def step(ps):
        grads = jax.tree_util.tree_map(lambda g: scale * jnp.mean(g, axis=0), per_sample(ps))
        return jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, ps, grads), loss(ps)
    return jax.jit(step)


def _max_difference(a: Any, b: Any) -> float:
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(
        jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b), strict=True))


# ---- ensemble ---------------------------------------------------------------------------------


def pendulum_by_hand(y: jax.Array, ps: dict) -> jax.Array:
    """The double pendulum's (θ1, θ2, ω1, ω2)' written in jax.numpy."""
    th1, th2, w1, w2 = y[..., 0], y[..., 1], y[..., 2], y[..., 3]
    m1, m2, l1, l2, g = ps["m1"], ps["m2"], ps["l1"], ps["l2"], ps["g"]
    delta = th1 - th2
    sin, cos = jnp.sin(delta), jnp.cos(delta)
    den = 2 * m1 + m2 - m2 * jnp.cos(2 * delta)
    a1 = (-g * (2 * m1 + m2) * jnp.sin(th1) - m2 * g * jnp.sin(th1 - 2 * th2)
          - 2 * sin * m2 * (w2 ** 2 * l2 + w1 ** 2 * l1 * cos)) / (l1 * den)
    a2 = 2 * sin * (w1 ** 2 * l1 * (m1 + m2) + g * (m1 + m2) * jnp.cos(th1)
                    + w2 ** 2 * l2 * m2 * cos) / (l2 * den)
    return jnp.stack([w1, w2, a1, a2], axis=-1)


def ensemble(trajectories: int, rounds: int) -> dict:
    import diffrax

    from symkern.models import double_pendulum

    model = double_pendulum()
    kernel = sk.build_function(model.rhs, list(model.state), params=dict(model.params),
                               dtype="float32")
    ps = {key: jnp.float32(value) for key, value in PENDULUM.items()}

    def solver(field: Callable) -> Callable:
        def solve(y0):
            term = diffrax.ODETerm(lambda t, y, args: field(y, ps))
            return diffrax.diffeqsolve(term, diffrax.Tsit5(), t0=0.0,
                                       t1=ENSEMBLE_STEPS * ENSEMBLE_DT, dt0=ENSEMBLE_DT,
                                       y0=y0, max_steps=ENSEMBLE_STEPS).ys[-1]
        return jax.jit(jax.vmap(solve))

    y0 = jnp.asarray(np.random.default_rng(0).uniform(-1, 1, (trajectories, 4)), jnp.float32)
    calls = {"symkern": solver(kernel), "jax.numpy": solver(pendulum_by_hand)}
    return _rows("ensemble", trajectories, calls, lambda f, name: f(y0), rounds)


# ---- HNN --------------------------------------------------------------------------------------


def _hnn_setup(batch: int, width: int = 40) -> dict:
    net = sk.Chain(sk.Dense(2, width, "tanh"), sk.Linear(width, 1))
    snn = sk.StructuredNetwork(net)
    field_eqs = sk.hamiltonian_vector_field(snn.output[0], list(snn.input))
    targets = sp.Matrix(sp.symbols("t_q t_p"))
    sample_loss = sum((field_eqs - targets).applyfunc(lambda e: e ** 2))
    rng = np.random.default_rng(0)
    X = jnp.asarray(rng.uniform(-1.5, 1.5, (batch, 2)), jnp.float32)
    return {"net": net, "field": sk.build_nn_function(field_eqs, snn),
            "per_sample": sk.build_nn_function(sk.parameter_gradient(sample_loss, snn), snn, targets),
            "X": X, "T": jnp.stack([X[:, 1], -X[:, 0]], axis=-1),
            "ps": _f32(net.init_params(seed=0))}


def _j_grad(g: jax.Array) -> jax.Array:
    """J∇H from ∇H = (∂H/∂q, ∂H/∂p)."""
    return jnp.stack([g[..., 1], -g[..., 0]], axis=-1)


def hnn(batch: int, rounds: int) -> dict:
    """A gradient step of the mean squared field error."""
    setup = _hnn_setup(batch)
    net, field, per_sample, X, T = (setup[k] for k in ("net", "field", "per_sample", "X", "T"))

    def H(p, x):
        return net.apply(x, p)[..., 0]

    def mse(F):
        return jnp.mean((F - T) ** 2)

    def by_hand(p):
        d = 1 - jnp.tanh(X @ p["L1"]["W"].T + p["L1"]["b"]) ** 2
        return (d * p["L2"]["W"][0]) @ p["L1"]["W"]

    loss = lambda p: mse(field(X, p))  # noqa: E731
    calls = {
        "symkern grad-through-field": _sgd(loss),
        # mean over samples and the 2 components: half the mean of per-sample Σ_k gradients
        "symkern parameter-gradient, averaged": _mean_gradient_step(
            loss, lambda p: per_sample(X, T, p), 0.5),
        "jax vmap(grad(H))": _sgd(lambda p: mse(_j_grad(jax.vmap(jax.grad(H, 1), (None, 0))(p, X)))),
        "jax grad(sum H)": _sgd(lambda p: mse(_j_grad(jax.grad(lambda x: jnp.sum(H(p, x)))(X)))),
        "jax hand-written ∇H": _sgd(lambda p: mse(_j_grad(by_hand(p)))),
    }
    return _rows("hnn", batch, calls, lambda f, name: f(setup["ps"]), rounds)


def hnn_per_sample(batch: int, rounds: int) -> dict:
    """Per-sample gradients of the squared field error: the symbolic parameter gradient
    against `jax.vmap(jax.grad)` through the field kernel and of plain JAX."""
    setup = _hnn_setup(batch)
    net, field, per_sample, X, T = (setup[k] for k in ("net", "field", "per_sample", "X", "T"))

    def plain(p, x, t):
        return jnp.sum((_j_grad(jax.grad(lambda x: net.apply(x, p)[0])(x)) - t) ** 2)

    def through_kernel(p, x, t):
        return jnp.sum((field(x, p) - t) ** 2)

    calls = {
        "symkern parameter-gradient": jax.jit(lambda p: per_sample(X, T, p)),
        "symkern vmap(grad) through field": jax.jit(
            lambda p: jax.vmap(jax.grad(through_kernel), (None, 0, 0))(p, X, T)),
        "jax vmap(grad) of grad(H)": jax.jit(
            lambda p: jax.vmap(jax.grad(plain), (None, 0, 0))(p, X, T)),
    }
    return _rows("hnn-per-sample", batch, calls, lambda f, name: f(setup["ps"]), rounds)


# ---- PINN -------------------------------------------------------------------------------------


def mlp(ps: dict, z: jax.Array) -> jax.Array:
    """The 2-32-32-1 network on any batch: (..., 2) -> (...)."""
    h = z
    for name in ("L1", "L2"):
        h = jnp.tanh(h @ ps[name]["W"].T + ps[name]["b"])
    return (h @ ps["L3"]["W"].T + ps["L3"]["b"])[..., 0]


def jvp_residual(u: Callable, z: jax.Array) -> jax.Array:
    """u_t + u u_x − ν u_xx by nested forward mode; `z` one point or a batch of them."""
    e_t = jnp.zeros_like(z).at[..., 0].set(1)
    e_x = jnp.zeros_like(z).at[..., 1].set(1)
    value, u_t = jax.jvp(u, (z,), (e_t,))
    u_x, u_xx = jax.jvp(lambda z: jax.jvp(u, (z,), (e_x,))[1], (z,), (e_x,))
    return u_t + value * u_x - NU * u_xx


def _pinn_setup(batch: int) -> dict:
    net = sk.Chain(sk.Dense(2, 32, "tanh"), sk.Dense(32, 32, "tanh"), sk.Dense(32, 1))
    snn = sk.StructuredNetwork(net)
    u = snn.output[0]
    gradient = sk.gradient(u, snn.input)
    residual = gradient[0] + u * gradient[1] - NU * sk.hessian(u, snn.input)[1, 1]
    u0_symbol = sp.Symbol("u0")
    rng = np.random.default_rng(0)
    inside = jnp.asarray(np.c_[rng.uniform(0, 1, batch), rng.uniform(-1, 1, batch)], jnp.float32)
    x0 = rng.uniform(-1, 1, max(batch // 4, 1))
    return {
        "net": net, "residual": sk.build_nn_function(residual, snn),
        "u": sk.build_nn_function(u, snn),
        "per_sample_residual": sk.build_nn_function(sk.parameter_gradient(residual ** 2, snn), snn),
        "per_sample_initial": sk.build_nn_function(
            sk.parameter_gradient((u - u0_symbol) ** 2, snn), snn, u0_symbol),
        "inside": inside, "initial": jnp.asarray(np.c_[np.zeros_like(x0), x0], jnp.float32),
        "u0": jnp.asarray(-np.sin(np.pi * x0), jnp.float32), "ps": _f32(net.init_params(seed=1))}


def pinn(batch: int, rounds: int) -> dict:
    """A gradient step of the mean squared residual plus the initial condition's error."""
    import equinox as eqx

    setup = _pinn_setup(batch)
    inside, initial, u0, ps = (setup[k] for k in ("inside", "initial", "u0", "ps"))

    def loss_of(r, u_initial):
        return jnp.mean(r ** 2) + jnp.mean((u_initial - u0) ** 2)

    def symkern_loss(p):
        return loss_of(setup["residual"](inside, p), setup["u"](initial, p))

    def symkern_step(p):
        a = setup["per_sample_residual"](inside, p)
        b = setup["per_sample_initial"](initial, u0, p)
        grads = jax.tree_util.tree_map(lambda x, y: jnp.mean(x, 0) + jnp.mean(y, 0), a, b)
        return jax.tree_util.tree_map(lambda w, g: w - LEARNING_RATE * g, p, grads), symkern_loss(p)

    model = eqx.nn.MLP(2, "scalar", 32, 2, activation=jnp.tanh, key=jax.random.PRNGKey(0))
    model = eqx.tree_at(lambda m: [leaf for layer in m.layers for leaf in (layer.weight, layer.bias)],
                        model, [ps[f"L{k + 1}"][leaf] for k in range(3) for leaf in ("W", "b")])

    def equinox_loss(m):
        r = jax.vmap(lambda z: jvp_residual(m, z))(inside)
        return loss_of(r, jax.vmap(m)(initial))

    def equinox_step(m):
        value, grads = eqx.filter_value_and_grad(equinox_loss)(m)
        return eqx.apply_updates(m, jax.tree_util.tree_map(lambda g: -LEARNING_RATE * g, grads)), value

    calls = {
        "symkern grad-through-residual": _sgd(symkern_loss),
        "symkern parameter-gradient, averaged": jax.jit(symkern_step),
        "jax vmap(jvp) jnp MLP": _sgd(lambda p: loss_of(
            jax.vmap(lambda z: jvp_residual(lambda z: mlp(p, z), z))(inside), mlp(p, initial))),
        "jax batched jvp jnp MLP": _sgd(lambda p: loss_of(
            jvp_residual(lambda z: mlp(p, z), inside), mlp(p, initial))),
        "jax vmap(jvp) equinox MLP": eqx.filter_jit(equinox_step),
    }
    arguments = {name: (model if "equinox" in name else ps) for name in calls}
    return _rows("pinn", batch, calls, lambda f, name: f(arguments[name]), rounds)


def pinn_per_sample(batch: int, rounds: int) -> dict:
    """Per-sample gradients of the squared residual."""
    setup = _pinn_setup(batch)
    inside, ps, residual = setup["inside"], setup["ps"], setup["residual"]

    def plain(p, z):
        return jvp_residual(lambda z: mlp(p, z), z) ** 2

    calls = {
        "symkern parameter-gradient": jax.jit(lambda p: setup["per_sample_residual"](inside, p)),
        "symkern vmap(grad) through residual": jax.jit(lambda p: jax.vmap(
            jax.grad(lambda p, z: residual(z, p) ** 2), (None, 0))(p, inside)),
        "jax vmap(grad) of the jvp residual": jax.jit(
            lambda p: jax.vmap(jax.grad(plain), (None, 0))(p, inside)),
    }
    return _rows("pinn-per-sample", batch, calls, lambda f, name: f(ps), rounds)


# ---- timing -------------------------------------------------------------------------------------


def _bursts(calls: dict[str, Callable], rounds: int) -> dict[str, list[float]]:
    """Per round and call, the median of the last BURST − 1 of BURST back-to-back calls,
    the calls of a round in a shuffled order (a fixed seed).

    A training step runs after itself, so a call is timed with its own data in cache.
    `compare.round_robin` times one call after the previous one of another formulation,
    always the same neighbour: with five formulations of the HNN step the same two
    programs (one XLA program, as their HLO shows) measured 0.86–1.09× each other across
    runs, and 1.00× twice when timed alone; in bursts the neighbour no longer decides."""
    order = list(calls)
    rng = random.Random(0)
    times: dict[str, list[float]] = {name: [] for name in order}
    for _ in range(rounds):
        rng.shuffle(order)
        for name in order:
            burst = round_robin({name: calls[name]}, BURST)[name]
            times[name].append(statistics.median(burst[1:]))
    return times


def _rows(workload: str, batch: int, calls: dict[str, Callable], run: Callable,
          rounds: int) -> dict:
    """Time `calls` round-robin; plain JAX is every call whose name does not start "symkern"."""
    plain = [name for name in calls if not name.startswith("symkern")]
    bound = {name: (lambda f=f, name=name: jax.block_until_ready(run(f, name)))
             for name, f in calls.items()}
    results = {name: call() for name, call in bound.items()}  # compile, and check agreement
    reference = results[plain[0]]
    differences = {name: _max_difference(_leaves_of(result), _leaves_of(reference))
                   for name, result in results.items()}
    for call in bound.values():
        call()
    times = _bursts(bound, rounds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    fastest_plain = min(plain, key=medians.__getitem__)
    rows = [{"formulation": name, "median_s": medians[name],
             "fastest_plain_over_this": medians[fastest_plain] / medians[name],
             "max_difference": differences[name]} for name in calls]
    symkern_rows = [row for row in rows if row["formulation"].startswith("symkern")]
    best = max(symkern_rows, key=lambda row: row["fastest_plain_over_this"])
    entry = {"workload": workload, "batch": batch, "rounds": rounds,
             "fastest_plain": fastest_plain, "best_symkern": best["formulation"],
             "ratio": best["fastest_plain_over_this"], "rows": rows}
    through = [name for name in calls if name.startswith("symkern vmap(grad)")]
    if through and "symkern parameter-gradient" in medians:
        # the symbolic route against jax.grad through the kernel, both per sample
        entry["symbolic_over_grad_through_kernel"] = (medians[through[0]]
                                                      / medians["symkern parameter-gradient"])
    return entry


def _leaves_of(result: Any) -> Any:
    """The part of a step's result that all formulations share (new parameters as arrays)."""
    import equinox as eqx

    return [leaf for leaf in jax.tree_util.tree_leaves(eqx.filter(result, eqx.is_array))]


#: every workload, and which size option sets its batch
WORKLOADS = {"ensemble": (ensemble, "ensemble"), "hnn": (hnn, "hnn"), "pinn": (pinn, "pinn"),
             "hnn-per-sample": (hnn_per_sample, "hnn"), "pinn-per-sample": (pinn_per_sample, "pinn")}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--ensemble", type=int, default=10_000, help="initial conditions")
    parser.add_argument("--hnn", type=int, default=4096, help="HNN training batch")
    parser.add_argument("--pinn", type=int, default=4096, help="PINN collocation points")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = {"jax": jax.__version__, "backend": jax.default_backend(),
              "cpus": os.cpu_count(), "workloads": []}
    for name in args.workloads.split(","):
        if name not in WORKLOADS:
            parser.error(f"--workloads: unknown workload {name!r}; expected some of {list(WORKLOADS)}")
        measure, size = WORKLOADS[name]
        entry = measure(getattr(args, size), args.rounds)
        report["workloads"].append(entry)
        print(f"{name} (batch {entry['batch']}, {entry['rounds']} rounds): "
              f"{entry['best_symkern']} / {entry['fastest_plain']} = {entry['ratio']:.2f}",
              flush=True)
        if "symbolic_over_grad_through_kernel" in entry:
            print(f"  parameter-gradient / vmap(grad) through the kernel = "
                  f"{entry['symbolic_over_grad_through_kernel']:.2f}", flush=True)
        for row in entry["rows"]:
            print(f"  {row['formulation']:38s} {row['median_s'] * 1e3:9.3f} ms  "
                  f"x{row['fastest_plain_over_this']:.2f}  max diff {row['max_difference']:.1e}",
                  flush=True)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
