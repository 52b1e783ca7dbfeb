"""symbolic: networks (Chain, Dense, Linear), their activations and symbolic evaluation.

Imports sympy, numpy, jax.numpy and jax.scipy.special (the reference `apply` only) and
symkern.errors; nothing else of symkern.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np
import sympy as sp

from symkern.errors import BuildError

ParamTree = dict[str, dict[str, Any]]


class Activation(NamedTuple):
    """A named activation: its SymPy form (Expr -> Expr) and its jax.numpy form."""

    sympy: Callable[[sp.Expr], sp.Expr]
    jax: Callable[[Any], Any]


def _identity(x: Any) -> Any:
    return x


def _sigmoid(x: sp.Expr) -> sp.Expr:
    return 1 / (1 + sp.exp(-x))


def _softplus(x: sp.Expr) -> sp.Expr:
    return sp.log(1 + sp.exp(x))


# Max rather than Piecewise: SymPy folds a Piecewise nested in another's condition
# (`piecewise_fold`, which simplifies), so stacked Piecewise layers cost time exponential
# in their width. Max differentiates to Heaviside, printed for JAX as a `select`.
def _relu(x: sp.Expr) -> sp.Expr:
    return sp.Max(0, x)


# Piecewise, like SymbolicNeuralNetworks.jl; the fold above makes several stacked elu
# layers slow to build.
def _elu(x: sp.Expr) -> sp.Expr:
    return sp.Piecewise((x, x > 0), (sp.exp(x) - 1, True))


def _gelu(x: sp.Expr) -> sp.Expr:
    return x / 2 * (1 + sp.erf(x / sp.sqrt(2)))


def _jax_sigmoid(x: Any) -> Any:
    return 1 / (1 + jnp.exp(-x))


def _jax_softplus(x: Any) -> Any:
    return jnp.logaddexp(x, 0.0)


def _jax_relu(x: Any) -> Any:
    return jnp.maximum(x, 0.0)


def _jax_elu(x: Any) -> Any:
    return jnp.where(x > 0, x, jnp.expm1(x))


def _jax_gelu(x: Any) -> Any:
    return x / 2 * (1 + jsp.erf(x / np.sqrt(2.0)))


#: activation name -> (SymPy form, jax.numpy form); read-only.
ACTIVATIONS: Mapping[str, Activation] = MappingProxyType({
    "identity": Activation(_identity, _identity),
    "tanh": Activation(sp.tanh, jnp.tanh),
    "sigmoid": Activation(_sigmoid, _jax_sigmoid),
    "softplus": Activation(_softplus, _jax_softplus),
    "relu": Activation(_relu, _jax_relu),
    "elu": Activation(_elu, _jax_elu),
    "gelu": Activation(_gelu, _jax_gelu),
    "sin": Activation(sp.sin, jnp.sin),
    "cos": Activation(sp.cos, jnp.cos),
})


def _check_size(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise BuildError(f"{name}: expected a positive int, got {value!r}")
    return int(value)


def _activation_label(activation: str | Callable[..., Any]) -> str:
    if isinstance(activation, str):
        return repr(activation)
    return getattr(activation, "__name__", repr(activation))


def _resolve_activation(activation: str | Callable[[sp.Expr], sp.Expr]) -> Activation:
    if isinstance(activation, str):
        if activation not in ACTIVATIONS:
            raise BuildError(
                f"activation: expected one of {', '.join(ACTIVATIONS)} or a callable "
                f"mapping a SymPy expression to a SymPy expression, got {activation!r}"
            )
        return ACTIVATIONS[activation]
    if not callable(activation):
        raise BuildError(
            f"activation: expected a name or a callable, got {type(activation).__name__}"
        )
    probe = sp.Dummy("z")
    result = activation(probe)
    if not isinstance(result, sp.Expr):
        raise BuildError(
            f"activation: expected the callable {_activation_label(activation)} to return a "
            f"SymPy expression, got {type(result).__name__} {result!r}"
        )
    # The jax form is printed by SymPy from a Dummy, so no user-written text becomes code.
    jax_form = sp.lambdify(probe, result, modules="jax")
    return Activation(activation, jax_form)


@dataclass(frozen=True, repr=False)
class Dense:
    """A fully connected layer: `activation(W x + b)`, W of shape (n_out, n_in), b (n_out,).

    `activation` is a name from `ACTIVATIONS` or any callable mapping a SymPy expression
    to a SymPy expression (its jax form is then lambdified from its SymPy output).

    >>> Dense(2, 3, "tanh")
    Dense(2, 3, 'tanh')
    >>> Dense(2, 3, "swish")
    Traceback (most recent call last):
    ...
    symkern.errors.BuildError: activation: expected one of identity, tanh, sigmoid, \
softplus, relu, elu, gelu, sin, cos or a callable mapping a SymPy expression to a SymPy \
expression, got 'swish'
    """

    n_in: int
    n_out: int
    activation: str | Callable[[sp.Expr], sp.Expr] = "identity"
    _forms: Activation = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "n_in", _check_size(self.n_in, "n_in"))
        object.__setattr__(self, "n_out", _check_size(self.n_out, "n_out"))
        object.__setattr__(self, "_forms", _resolve_activation(self.activation))

    @property
    def forms(self) -> Activation:
        """The activation as a SymPy function and as a JAX function."""
        return self._forms

    def __repr__(self) -> str:
        return f"Dense({self.n_in}, {self.n_out}, {_activation_label(self.activation)})"

    def init_params(self, rng: np.random.Generator | int | None = None, *,
                    seed: int | None = None) -> dict[str, np.ndarray]:
        """Glorot-uniform `W` (n_out, n_in) and zero `b` (n_out,), float64, drawn from `rng`
        (a NumPy Generator, or a seed as `Chain.init_params` takes).

        This layer's own `{"W", "b"}`; a network's tree (`{"L1": {...}}`, also for
        `SymbolicNetwork(Dense(...))`) is `Chain(...).init_params(seed)`.
        """
        if seed is not None or not isinstance(rng, np.random.Generator):
            if rng is not None and seed is not None:
                raise BuildError("init_params: pass a Generator or a seed, not both")
            given = seed if seed is not None else rng
            if given is not None and not isinstance(given, (int, np.integer)):
                raise BuildError(f"init_params: expected a numpy Generator or an int seed, got "
                                 f"{type(given).__name__}")
            rng = np.random.default_rng(0 if given is None else int(given))
        limit = np.sqrt(6.0 / (self.n_in + self.n_out))
        weight = rng.uniform(-limit, limit, size=(self.n_out, self.n_in))
        return {"W": weight.astype(np.float64), "b": np.zeros(self.n_out, dtype=np.float64)}

    def apply(self, x: Any, ps: Mapping[str, Any]) -> Any:
        """`activation(x @ W.T + b)` in jax.numpy, for `x` of shape (..., n_in)."""
        return self._forms.jax(x @ jnp.asarray(ps["W"]).T + jnp.asarray(ps["b"]))

    def symbolic_apply(self, x: sp.Matrix, ps: Mapping[str, sp.Matrix]) -> sp.Matrix:
        """`activation(W*x + b)` entrywise, for an n_in×1 Matrix `x` of expressions."""
        # explicit row sums: SymPy's Matrix product took 36 s on a 4-16-16-4 network
        W, b = ps["W"], ps["b"]
        return sp.Matrix([
            self._forms.sympy(sp.Add(*[W[i, j] * x[j] for j in range(self.n_in)], b[i]))
            for i in range(self.n_out)
        ])


@dataclass(frozen=True, repr=False)
class Linear(Dense):
    """`Dense(n_in, n_out, "identity")`: W x + b. It keeps the bias `b`, as in
    SymbolicNeuralNetworks.jl, so its parameters are `{"W", "b"}` like any Dense.

    >>> Linear(3, 1)
    Linear(3, 1)
    """

    activation: str = field(default="identity", init=False)

    def __repr__(self) -> str:
        return f"Linear({self.n_in}, {self.n_out})"


class Chain:
    """Layers applied in order; layer k's parameters live under `"L{k}"` (1-based).

    >>> net = Chain(Dense(2, 3, "tanh"), Linear(3, 1))
    >>> net
    Chain(Dense(2, 3, 'tanh'), Linear(3, 1))
    >>> net.input_dim, net.output_dim
    (2, 1)
    >>> {k: {n: a.shape for n, a in v.items()} for k, v in net.init_params(seed=0).items()}
    {'L1': {'W': (3, 2), 'b': (3,)}, 'L2': {'W': (1, 3), 'b': (1,)}}
    """

    def __init__(self, *layers: Dense) -> None:
        if not layers:
            raise BuildError("layers: expected at least one layer, got none")
        for k, layer in enumerate(layers, start=1):
            if not isinstance(layer, Dense):
                raise BuildError(f"layer {k}: expected a Dense or Linear, got {layer!r}")
        for k in range(1, len(layers)):
            before, after = layers[k - 1], layers[k]
            if before.n_out != after.n_in:
                raise BuildError(
                    f"layers: layer {k + 1} ({after!r}) expects {after.n_in} inputs but "
                    f"layer {k} ({before!r}) gives {before.n_out} outputs"
                )
        self._layers = tuple(layers)

    @property
    def layers(self) -> tuple[Dense, ...]:
        return self._layers

    @property
    def input_dim(self) -> int:
        return self._layers[0].n_in

    @property
    def output_dim(self) -> int:
        return self._layers[-1].n_out

    def named_layers(self) -> Iterator[tuple[str, Dense]]:
        """`("L1", layer 1), ("L2", layer 2), ...` in order."""
        for k, layer in enumerate(self._layers, start=1):
            yield f"L{k}", layer

    def __repr__(self) -> str:
        return f"Chain({', '.join(repr(layer) for layer in self._layers)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Chain) and self._layers == other._layers

    def __hash__(self) -> int:
        return hash(self._layers)

    def init_params(self, seed: int = 0) -> ParamTree:
        """A parameter tree of float64 numpy arrays, deterministic per `seed`."""
        rng = np.random.default_rng(seed)
        return {name: layer.init_params(rng) for name, layer in self.named_layers()}

    def apply(self, X: Any, ps: Mapping[str, Mapping[str, Any]]) -> Any:
        """Evaluate the network in plain jax.numpy: `X` (..., n_in) -> (..., n_out).

        The reference the generated kernels are tested against.

        >>> net = Chain(Dense(2, 3, "tanh"), Linear(3, 2))
        >>> net.apply(np.ones((5, 2)), net.init_params(seed=0)).shape
        (5, 2)
        """
        X = jnp.asarray(X)
        if X.ndim == 0 or X.shape[-1] != self.input_dim:
            raise BuildError(f"X: expected shape (..., {self.input_dim}), got {X.shape}")
        self._check_params(ps)
        for name, layer in self.named_layers():
            X = layer.apply(X, ps[name])
        return X

    def symbolic_apply(self, x: sp.Matrix, params: Mapping[str, Mapping[str, sp.Matrix]]
                       ) -> sp.Matrix:
        """The network on an n_in×1 Matrix of expressions, with a tree of symbolic parameters."""
        for name, layer in self.named_layers():
            x = layer.symbolic_apply(x, params[name])
        return x

    def _check_params(self, ps: Mapping[str, Mapping[str, Any]]) -> None:
        expected_names = [name for name, _ in self.named_layers()]
        if not isinstance(ps, Mapping) or sorted(ps) != sorted(expected_names):
            got = sorted(ps) if isinstance(ps, Mapping) else type(ps).__name__
            raise BuildError(f"ps: expected keys {expected_names}, got {got}")
        for name, layer in self.named_layers():
            shapes = {"W": (layer.n_out, layer.n_in), "b": (layer.n_out,)}
            for leaf, shape in shapes.items():
                if not isinstance(ps[name], Mapping) or leaf not in ps[name]:
                    raise BuildError(f'ps["{name}"]: expected keys ["W", "b"]')
                got = np.shape(ps[name][leaf])
                if got != shape:
                    raise BuildError(f'ps["{name}"]["{leaf}"]: expected shape {shape}, got {got}')


def _symbol_vector(prefix: str, rows: int) -> sp.Matrix:
    return sp.Matrix(rows, 1, lambda i, _: sp.Dummy(f"{prefix}_{i + 1}"))


def _symbol_matrix(prefix: str, rows: int, cols: int) -> sp.Matrix:
    return sp.Matrix(rows, cols, lambda i, j: sp.Dummy(f"{prefix}_{i + 1}_{j + 1}"))


class SymbolicNetwork:
    """A network whose input and parameters are SymPy symbols, and its symbolic output.

    Scalarized (every weight a Symbol, the output an explicit expression) when every layer
    has at most 64 weights; otherwise — or with `structured=True` — a `StructuredNetwork`
    whose output and derivatives stay matrix products (docs/guide.md, "Structured
    networks"). `structured=False` forces the scalarized form.

    The symbols are `sympy.Dummy` objects with deterministic names (`x_1`, ..., `L1_W_2_1`,
    `L1_b_2`; SymPy prints a Dummy with a leading underscore). A Dummy equals only itself,
    so two SymbolicNetworks never share a symbol, and no symbol a user creates with the
    same name can be confused with them: `H = snn_a(q)[0] + snn_b(q)[0]` differentiates
    correctly w.r.t. `snn_a.params` alone.

    >>> snn = SymbolicNetwork(Chain(Dense(2, 3, "tanh"), Linear(3, 1)))
    >>> snn.input.shape, snn.params["L1"]["W"].shape, snn.output.shape
    ((2, 1), (3, 2), (1, 1))
    >>> snn.parameter_paths()
    (('L1', 'W'), ('L1', 'b'), ('L2', 'W'), ('L2', 'b'))
    >>> snn.params["L1"]["b"][1]
    _L1_b_2
    """

    def __new__(cls, net: Chain | Dense | None = None, structured: bool | None = None) -> Any:
        # One API, two forms: a network with any layer above 64 weights stays an array
        # program (symkern.symbolic.structured); `structured=` overrides the choice.
        from symkern.symbolic.structured import StructuredNetwork, prefer_structured

        if structured is None:
            structured = net is not None and isinstance(net, (Chain, Dense)) \
                and prefer_structured(net)
        if structured:
            return StructuredNetwork(net)
        return super().__new__(cls)

    def __init__(self, net: Chain | Dense, structured: bool | None = None) -> None:
        if isinstance(net, Dense):
            net = Chain(net)
        if not isinstance(net, Chain):
            raise BuildError(f"net: expected a Chain or a Dense, got {type(net).__name__}")
        self.net = net
        self.input = _symbol_vector("x", net.input_dim)
        self.params: ParamTree = {
            name: {
                "W": _symbol_matrix(f"{name}_W", layer.n_out, layer.n_in),
                "b": _symbol_vector(f"{name}_b", layer.n_out),
            }
            for name, layer in net.named_layers()
        }
        self.output = self(self.input)

    def __call__(self, x: sp.Matrix | list[Any] | tuple[Any, ...]) -> sp.Matrix:
        """The network on another input: an n_in×1 Matrix (or list/tuple) of expressions.

        >>> snn = SymbolicNetwork(Linear(1, 1))
        >>> q = sp.Symbol("q")
        >>> snn([q])
        Matrix([[_L1_W_1_1*q + _L1_b_1]])
        """
        if isinstance(x, (list, tuple)):
            x = sp.Matrix(x)
        if not isinstance(x, sp.MatrixBase) or x.shape != (self.net.input_dim, 1):
            got = f"shape {x.shape}" if isinstance(x, sp.MatrixBase) else type(x).__name__
            raise BuildError(
                f"x: expected a {self.net.input_dim}×1 Matrix (or a list of "
                f"{self.net.input_dim} expressions), got {got}"
            )
        return self.net.symbolic_apply(x, self.params)

    def parameter_paths(self) -> tuple[tuple[str, str], ...]:
        """Access paths of the parameter leaves in kernel argument order.

        That is JAX's pytree order: dict keys sorted, so `"L10"` comes before `"L2"`.
        """
        return tuple(sorted((name, leaf) for name, tree in self.params.items() for leaf in tree))

    def __repr__(self) -> str:
        return f"SymbolicNetwork({self.net!r})"
