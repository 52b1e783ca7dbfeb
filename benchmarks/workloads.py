"""The benchmark workloads: SymPy equations, their inputs, parameters and parameter values.

Shared by `compare.py` (every tool), `gpu.py` and the scripts in `experiments/`. Each
workload is built from scratch in the process that measures it (SymPy objects are not
passed between processes), deterministically, so every tool sees the same equations.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import shapes
import sympy as sp

#: 131072 float64 entries = 1 MiB: large enough that embedding it in HLO is visible.
TABLE_SIZE = 131072
TABLE = np.sin(np.linspace(0.0, 40.0, TABLE_SIZE)) + 0.5 * np.cos(np.linspace(0.0, 7.0, TABLE_SIZE))
#: the lookup covers inputs in [-TABLE_SPAN, TABLE_SPAN); outside it is clamped.
TABLE_SPAN = 4.0


def lookup_numpy(u: Any) -> Any:
    """The table lookup in numpy: nearest-below entry for u in [-4, 4), clamped outside."""
    index = np.clip(((np.asarray(u) + TABLE_SPAN) * (TABLE_SIZE / (2 * TABLE_SPAN))).astype(np.int64),
                    0, TABLE_SIZE - 1)
    return TABLE[index]


def lookup_jax(u: Any) -> Any:
    """The same lookup in jax.numpy, closing over the numpy table as a user would write it."""
    import jax.numpy as jnp

    index = jnp.clip(((u + TABLE_SPAN) * (TABLE_SIZE / (2 * TABLE_SPAN))).astype(jnp.int32),
                     0, TABLE_SIZE - 1)
    return jnp.take(TABLE, index)


@dataclass
class Workload:
    """Equations plus everything a tool needs to evaluate them on a batch.

    `eqs` is a pytree (Matrix / Expr / list) as a symkern user would pass it; `inputs`
    the per-sample data symbols (one vector data argument); `params` a dict of parameter
    leaves (Symbol or Matrix of symbols) and `param_values` the matching numpy tree.
    `functions` maps an undefined function name to `(jax implementation, numpy
    implementation)`. `net_sizes` / `jacobian` are set for network workloads, where the
    hand-written jax.numpy reference exists. A Workload pickles (the network itself is
    rebuilt from its sizes: its activations hold jax functions).
    """

    name: str
    eqs: Any
    inputs: list[sp.Symbol]
    params: dict[str, Any]
    param_values: dict[str, Any]
    ops: int
    functions: dict[str, tuple[Callable, Callable]] = field(default_factory=dict)
    net_sizes: tuple[int, ...] | None = None
    jacobian: bool = False
    note: str = ""
    #: the range the inputs are drawn from (`sample`)
    input_range: tuple[float, float] = (-1.5, 1.5)

    def make_net(self) -> Any:
        """The `Chain` of a network workload (cheap: no symbolic work)."""
        return make_chain(self.net_sizes)

    # ---- flat views used by the tools that take flat argument lists ---------------------
    def eq_leaves(self) -> list[Any]:
        """The equation leaves (Matrix or Expr) in order."""
        if isinstance(self.eqs, (list, tuple)):
            return list(self.eqs)
        return [self.eqs]

    def flat_entries(self) -> list[sp.Expr]:
        """Every scalar entry of every equation, row-major."""
        out: list[sp.Expr] = []
        for leaf in self.eq_leaves():
            out.extend(list(leaf) if isinstance(leaf, sp.MatrixBase) else [leaf])
        return out

    def flat_param_symbols(self) -> list[sp.Symbol]:
        """Parameter symbols in JAX pytree order (dict keys sorted), entries row-major."""
        out: list[sp.Symbol] = []
        for leaf in _tree_leaves(self.params):
            out.extend(list(leaf) if isinstance(leaf, sp.MatrixBase) else [leaf])
        return out

    def flat_param_values(self) -> np.ndarray:
        """The parameter values in the order of `flat_param_symbols`."""
        leaves = _tree_leaves(self.param_values)
        if not leaves:
            return np.zeros(0)
        return np.concatenate([np.ravel(np.asarray(v, dtype=np.float64)) for v in leaves])

    def perturbed_values(self, factor: float = 1.1) -> dict[str, Any]:
        """The same tree with new values (same shapes): must never force a recompile."""
        return _tree_map(lambda v: np.asarray(v, dtype=np.float64) * factor + 0.01, self.param_values)

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """`n` float64 input rows of shape (n, len(inputs)), in the range every tool handles."""
        rng = np.random.default_rng(seed)
        return rng.uniform(*self.input_range, size=(n, len(self.inputs)))


def _is_leaf(value: Any) -> bool:
    return not isinstance(value, dict)


def _tree_leaves(tree: Any) -> list[Any]:
    if isinstance(tree, dict):
        return [leaf for key in sorted(tree) for leaf in _tree_leaves(tree[key])]
    return [tree]


def _tree_map(fn: Callable, tree: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _tree_map(fn, value) for key, value in tree.items()}
    return fn(tree)


# ---- the workloads ----------------------------------------------------------------------


def pendulum() -> Workload:
    """The double pendulum's equation of motion (symkern.models): 4 states, 5 parameters."""
    from symkern.models import double_pendulum

    model = double_pendulum()
    values = {"g": 9.81, "l1": 1.0, "l2": 0.7, "m1": 1.0, "m2": 1.3}
    return Workload("pendulum", model.rhs, list(model.state), dict(model.params),
                    {k: np.float64(v) for k, v in values.items()}, _ops(model.rhs))


NETWORKS = {"2-3-2": (2, 3, 2), "4-16-16-4": (4, 16, 16, 4), "8-32-32-8": (8, 32, 32, 8)}


def make_chain(sizes: tuple[int, ...]) -> Any:
    """`Chain(Dense(s0, s1, "tanh"), Dense(s1, s2, "tanh"), ...)`."""
    from symkern.symbolic import Chain, Dense

    return Chain(*(Dense(a, b, "tanh") for a, b in zip(sizes[:-1], sizes[1:], strict=True)))


def network(sizes: tuple[int, ...], jacobian: bool) -> Workload:
    """A scalarized tanh network or its input Jacobian, on SymbolicNetwork's symbols.

    The symbols are `SymbolicNetwork(net)`'s (`.input`, `.params`). The output is built
    with explicit row sums, the same expression as `SymbolicNetwork.output` (checked by
    `check_network`), because SymPy's Matrix product took 36 s at 4-16-16-4; the Jacobian
    by the chain rule per layer, `J_k = diag(1 - h_k**2) W_k J_(k-1)`, which is what
    `diff` of `tanh` gives, because `symbolic.jacobian` (Matrix.jacobian) did not finish
    4-16-16-4 in minutes. Both are recorded in docs/benchmarks.md.
    """
    from symkern.symbolic import SymbolicNetwork

    net = make_chain(sizes)
    snn = _symbols_only(SymbolicNetwork, net)
    h: list[sp.Expr] = list(snn.input)
    J = sp.eye(len(h))
    for name, layer in net.named_layers():
        W, b = snn.params[name]["W"], snn.params[name]["b"]
        h = [sp.tanh(sp.Add(*[W[i, j] * h[j] for j in range(layer.n_in)], b[i])) for i in range(layer.n_out)]
        if jacobian:
            J = sp.Matrix([[(1 - h[i] ** 2) * sp.Add(*[W[i, j] * J[j, c] for j in range(layer.n_in)
                                                        if J[j, c] != 0])
                            for c in range(J.cols)] for i in range(layer.n_out)])
    eqs = J if jacobian else sp.Matrix(h)
    label = "-".join(str(s) for s in sizes)
    return Workload(("jac-" if jacobian else "net-") + label, eqs, list(snn.input), snn.params,
                    net.init_params(seed=0), _ops(eqs), net_sizes=tuple(sizes), jacobian=jacobian)


def _symbols_only(cls: Any, net: Any) -> Any:
    """A SymbolicNetwork's input and parameter symbols without computing its output."""
    snn = cls.__new__(cls)
    original = type(net).symbolic_apply
    try:
        type(net).symbolic_apply = lambda self, x, params: sp.zeros(self.output_dim, 1)
        snn.__init__(net)
    finally:
        type(net).symbolic_apply = original
    return snn


def check_network(sizes: tuple[int, ...] = (2, 3, 2)) -> None:
    """Assert that `network` builds exactly `SymbolicNetwork.output` and `symbolic.jacobian`."""
    from symkern.symbolic import SymbolicNetwork, jacobian

    wl = network(sizes, False)
    jac = network(sizes, True)
    snn = SymbolicNetwork(wl.make_net())
    for target in (wl, jac):
        mapping = dict(zip(snn.input, target.inputs, strict=True))
        for name, tree in snn.params.items():
            for leaf, value in tree.items():
                mapping.update(zip(value, target.params[name][leaf], strict=True))
        if target is wl:
            assert snn.output.xreplace(mapping) == wl.eqs
    symbols = list(jac.inputs) + jac.flat_param_symbols()
    point = np.random.default_rng(0).uniform(-1, 1, len(symbols))
    ours = sp.lambdify(symbols, jac.eqs)(*point)
    theirs = sp.lambdify(symbols, jacobian(snn.output, snn.input).xreplace(mapping))(*point)
    assert np.allclose(ours, theirs, rtol=1e-12, atol=1e-14), (ours, theirs)


def nlink_pendulum(n: int = 3, constant_entries: bool = True, cart: bool = True) -> Workload:
    """`n_link_pendulum_on_cart(n)` mass_matrix_full and forcing_full, q and u plain symbols.

    `constant_entries=False` leaves out the entries that are numbers (the 0s and 1s of
    mass_matrix_full's identity and zero blocks), which SymPy's and PyTensor's functions
    return unbroadcast and a kernel writes for every sample: the like-for-like form.
    `cart=False` holds the cart still (q0 = u0 = 0): the cart's rows and columns go, which
    leaves the n-link pendulum's own equations (a pendulum on a fixed pivot).
    """
    from sympy.physics.mechanics.models import n_link_pendulum_on_cart

    kane = n_link_pendulum_on_cart(n=n, cart_force=False)
    q = list(kane.q)
    u = list(kane.u)
    plain_q = sp.symbols(f"q0:{len(q)}")
    plain_u = sp.symbols(f"u0:{len(u)}")
    # Derivatives first: q'(t) must not become d(q_i)/dt of a plain symbol (= 0).
    t = sp.Symbol("t")
    mapping = {c.diff(t): v for c, v in zip(q, plain_u, strict=True)}
    mapping.update({c: v for c, v in zip(u, plain_u, strict=True)})
    mapping.update({c: v for c, v in zip(q, plain_q, strict=True)})
    mass = kane.mass_matrix_full.xreplace(mapping)
    forcing = kane.forcing_full.xreplace(mapping)
    states = list(plain_q) + list(plain_u)
    if not cart:
        keep = [k for k in range(len(states)) if k not in (0, len(plain_q))]
        still = {plain_q[0]: 0, plain_u[0]: 0}
        mass = mass.extract(keep, keep).xreplace(still)
        forcing = forcing.extract(keep, [0]).xreplace(still)
        states = [states[k] for k in keep]
    constants = sorted((mass.free_symbols | forcing.free_symbols) - set(states), key=lambda s: s.name)
    rng = np.random.default_rng(1)
    values = {s.name: np.float64(9.81 if s.name == "g" else rng.uniform(0.5, 1.5)) for s in constants}
    size = len(states)
    note = f"mass_matrix_full ({size}x{size}) and forcing_full ({size}x1)"
    name = f"nlink-{n}" if cart else f"nlink-fixed-{n}"
    if not constant_entries:
        varying = [e for e in mass if not e.is_Number]
        note += f"; the {len(mass) - len(varying)} constant mass-matrix entries left out"
        mass = sp.Matrix(varying)
        name += "-nonconstant"
    eqs = [mass, forcing]
    return Workload(name, eqs, states, {s.name: s for s in constants}, values,
                    _ops(mass) + _ops(forcing), note=note)


def table_lookup() -> Workload:
    """A small expression around a user function closing over a 1 MiB float64 table."""
    x = sp.symbols("x0:4")
    a, b = sp.symbols("a b")
    lookup = sp.Function("lookup")
    expr = (a * lookup(x[0]) + lookup(b * x[1]) * sp.sin(x[2])
            + sp.cos(x[3]) * lookup(x[2] + x[3]))
    return Workload("table-1MB", expr, list(x), {"a": a, "b": b},
                    {"a": np.float64(1.3), "b": np.float64(0.7)}, _ops(expr),
                    functions={"lookup": (lookup_jax, lookup_numpy)},
                    note=f"lookup closes over a {TABLE_SIZE}-entry float64 table (1 MiB)")


def oscillator_energy() -> Workload:
    """The energy of a 2-D harmonic oscillator, `|p|^2/(2m) + k|q|^2/2`: 4 inputs, one
    output, 12 operations on 20 bytes a sample, so its speed is the speed of moving its bytes
    (the memory-bound workload the copy-bandwidth target is about)."""
    q0, q1, p0, p1 = x = sp.symbols("q0 q1 p0 p1")
    m, k = sp.symbols("m k", positive=True)
    expr = (p0**2 + p1**2) / (2 * m) + k * (q0**2 + q1**2) / 2
    return Workload("energy-2d", expr, list(x), {"m": m, "k": k},
                    {"m": np.float64(1.3), "k": np.float64(0.7)}, _ops(expr),
                    note="memory-bound: 12 operations on 20 bytes a sample")


def generated(ops: int, seed: int = 0) -> Workload:
    """About `ops` operations: sums of products of sin/cos of inputs with parameters.

    Terms `p_a * sin(p_b*x_i + x_j) * cos(p_c*x_k)` (8 operations each) share their
    sin/cos arguments heavily, like real models; the outputs hold about 2500 operations
    each, so no single sum is deep enough to hit Python's compiler recursion limit.
    """
    x = sp.symbols("x0:8")
    p = sp.symbols("p0:16")
    n_out = max(1, ops // 2500)
    rng = random.Random(seed)
    entries = []
    for _ in range(n_out):
        terms = [
            p[rng.randrange(16)] * sp.sin(p[rng.randrange(16)] * x[rng.randrange(8)] + x[rng.randrange(8)])
            * sp.cos(p[rng.randrange(16)] * x[rng.randrange(8)])
            for _ in range(max(1, ops // n_out // 8))
        ]
        entries.append(sp.Add(*terms))
    eqs = sp.Matrix(entries)
    rng_values = np.random.default_rng(seed)
    values = {s.name: np.float64(rng_values.uniform(-1, 1)) for s in p}
    return Workload(f"expr-{_short(ops)}", eqs, list(x), {s.name: s for s in p}, values, _ops(eqs),
                    note=f"{n_out} output(s), nominal {ops} operations")


def random_shape(profile: str, target: int, seed: int = 0) -> Workload:
    """About `target` operations drawn from one of `shapes.PROFILES` (the scale benchmarks'
    random expression generator): shapes nobody tuned a kernel for, as a column Matrix."""
    shape = shapes.generate(profile, target, seed)
    values = {name: np.float64(v) for name, v in shape.param_values.items()}
    # The generator leaves its sums and products unevaluated (to hold the operation count);
    # sympy.lambdify(..., cse=True) computes another function from some of them (at 10^4
    # operations, log(1 + 2*x2) where the tree has log(1 + x2**2)), which would make the
    # reference and numba's source wrong. Evaluated, as a user's expressions are, it agrees
    # with evalf.
    eqs = shape.eqs.doit()
    return Workload(f"shape-{profile}-{_short(target)}", eqs, list(shape.inputs),
                    dict(shape.params), values, _ops(eqs),
                    note=f"{shape.eqs.rows} output(s), {shape.dag_operations} distinct "
                         f"operations; shapes.generate({profile!r}, {target}, seed={seed})",
                    input_range=(-1.0, 1.0))  # where the generator keeps every value finite


def _short(n: int) -> str:
    exponent = int(round(np.log10(n)))
    return f"1e{exponent}" if 10**exponent == n else str(n)


#: every profile of benchmarks/shapes.py at 10^3 and 10^4 operations, by size
#: (compare.py --peers --shapes SIZE; make bench runs both)
SHAPE_TARGETS = (1_000, 10_000)
SHAPE_WORKLOADS = {_short(target): [f"shape-{profile}-{_short(target)}"
                                    for profile in shapes.PROFILES]
                   for target in SHAPE_TARGETS}


def _ops(eqs: Any) -> int:
    """Operation count of the equations as written (no CSE), iteratively (no recursion)."""
    from symkern.codegen.linearize import count_operations

    leaves = eqs if isinstance(eqs, (list, tuple)) else [eqs]
    entries = [e for leaf in leaves for e in (list(leaf) if isinstance(leaf, sp.MatrixBase) else [leaf])]
    return int(count_operations(entries))


#: workload name -> constructor; the order is the report's order.
WORKLOADS: dict[str, Callable[[], Workload]] = {
    "pendulum": pendulum,
    **{f"net-{k}": (lambda s=s: network(s, False)) for k, s in NETWORKS.items()},
    **{f"jac-{k}": (lambda s=s: network(s, True)) for k, s in NETWORKS.items()},
    "nlink-3": nlink_pendulum,
    # sympy.physics.mechanics models beyond the tuned set (compare.py --peers)
    **{f"nlink-{n}": (lambda n=n: nlink_pendulum(n)) for n in (2, 4, 8)},
    **{f"nlink-{n}-nonconstant": (lambda n=n: nlink_pendulum(n, constant_entries=False)) for n in (2, 4, 8)},
    "nlink-fixed-2": lambda: nlink_pendulum(2, cart=False),
    "table-1MB": table_lookup,
    "energy-2d": oscillator_energy,
    "expr-1e3": lambda: generated(1000),
    "expr-1e4": lambda: generated(10_000),
    "expr-1e5": lambda: generated(100_000),
    # the random shapes (SHAPE_WORKLOADS)
    **{name: (lambda profile=profile, target=target: random_shape(profile, target))
       for target in SHAPE_TARGETS for profile, name in zip(
           shapes.PROFILES, SHAPE_WORKLOADS[_short(target)], strict=True)},
    # not in the full profile (minutes per tool): benchmarks/compare.py --workloads expr-1e6
    "expr-1e6": lambda: generated(1_000_000),
}


def build(name: str) -> Workload:
    """Construct the workload called `name`."""
    return WORKLOADS[name]()
