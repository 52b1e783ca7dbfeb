"""symbolic: structured networks — a Chain of Dense layers kept as an array program, never scalarized.

Imports sympy, jax.tree_util and symkern.errors, plus Chain/Dense from this package; nothing upward.

A width-w layer scalarized is w² SymPy operations and, once compiled, w² XLA ops (0.5–1.5 ms of
compile each, ANCHORS.md), and SymPy's own array calculus cannot differentiate a network
(`MatrixExpr.diff` raises). Here a network stays three things:

* in SymPy, each output entry is an opaque applied function of the input expressions,
  `net1(k, x_1, …, x_n)`; its `fdiff` gives `net1(k, j, x…)` (∂/∂x_j) and `net1(k, i, j, x…)`
  (∂²/∂x_i∂x_j, indices sorted so the Hessian is one symmetric quantity), so SymPy's own chain
  rule handles every formula *around* a network (`H = net(q, p)[0] + V(q)`, a loss);
* `NetworkProgram` derives, at the array level, the quantities such nodes stand for (the
  output, the input Jacobian, the input Hessian, per-sample parameter gradients by backprop)
  as a short list of array steps (`Assign`, `Activate`) over a tiny array IR;
* `plan_structured` reads an equation tree, finds which quantities of which network
  application are needed, which equation leaves *are* such a quantity (returned whole), and
  which are scalar SymPy formulas reading entries of them (printed by the ordinary pipeline).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import jax
import sympy as sp
from sympy.matrices.expressions.matexpr import MatrixElement

from symkern.errors import BuildError
from symkern.symbolic.networks import Chain, Dense

#: a layer with more weights than this makes `SymbolicNetwork` pick the structured form.
#: Scalarized networks tie hand-written JAX at width 16 and fall to 0.54× at 32 (ANCHORS.md);
#: their compile time grows with the weight count (0.5–1.5 ms per scalar op) while the
#: structured form's does not. 64 weights is an 8×8 layer.
STRUCTURED_MIN_WEIGHTS = 64

Shape = tuple[int, ...]
Path = tuple[str, str]


def as_chain(net: Chain | Dense) -> Chain:
    if isinstance(net, Dense):
        return Chain(net)
    if not isinstance(net, Chain):
        raise BuildError(f"net: expected a Chain or a Dense, got {type(net).__name__}")
    return net


def prefer_structured(net: Chain | Dense, max_weights: int = STRUCTURED_MIN_WEIGHTS) -> bool:
    """Whether `SymbolicNetwork(net)` should be structured: some layer has > `max_weights` weights.

    >>> prefer_structured(Chain(Dense(2, 3, "tanh"), Dense(3, 2)))
    False
    >>> prefer_structured(Chain(Dense(8, 32, "tanh"), Dense(32, 8)))
    True
    """
    return any(layer.n_in * layer.n_out > max_weights for layer in as_chain(net).layers)


# ---- activations: σ, σ', σ'' from SymPy --------------------------------------------------


@dataclass(frozen=True)
class ActivationForms:
    """An activation and its first two derivatives, SymPy expressions in `variable`.

    The derivatives are `sympy.diff` of the activation's SymPy form; they are printed by
    SymPy's JAX printer like any other expression (codegen/structured.py).
    """

    variable: sp.Dummy
    value: sp.Expr
    first: sp.Expr
    second: sp.Expr

    @classmethod
    def of(cls, layer: Dense) -> ActivationForms:
        try:
            return _activation_forms(layer.activation, layer.forms.sympy)
        except TypeError:  # an unhashable callable activation: derive it afresh
            return _activation_forms.__wrapped__(layer.activation, layer.forms.sympy)

    @property
    def is_identity(self) -> bool:
        return self.value == self.variable

    @property
    def first_is_one(self) -> bool:
        return self.first == 1

    @property
    def second_is_zero(self) -> bool:
        return self.second == 0

    def __repr__(self) -> str:
        z = sp.Symbol("z")
        value, first, second = (e.xreplace({self.variable: z})
                                for e in (self.value, self.first, self.second))
        return f"ActivationForms(σ(z)={value}, σ'={first}, σ''={second})"


#: one variable for every activation, so SymPy's own cache serves repeated derivatives
_ACTIVATION_VARIABLE = sp.Dummy("z", real=True)  # real: |z|' is sign(z)


@functools.lru_cache(maxsize=128)
def _activation_forms(activation: Any, sympy_form: Any) -> ActivationForms:
    # keyed by the activation (a name or the user's callable): each network of the same
    # activations reuses σ', σ'' instead of differentiating again (SymPy's diff is ~0.05 s)
    z = _ACTIVATION_VARIABLE
    value = sp.sympify(sympy_form(z))
    first = sp.diff(value, z)
    return ActivationForms(z, value, first, sp.diff(first, z))


# ---- network outputs in SymPy --------------------------------------------------------------


class NetworkFunction(sp.Function):
    """An entry of a network output, or of one of its input derivatives, as a SymPy function.

    `net(k, x_1, …, x_n)` is output k at the input `(x_1, …, x_n)`; `net(k, j, x…)` its
    derivative w.r.t. input j; `net(k, i, j, x…)` (i ≤ j) the second derivative. Each
    network has its own subclass (`StructuredNetwork.function`), so class identity is network
    identity and nodes of two networks are never equal; the indices are leading Integer
    arguments, so `xreplace`, `cse` and hashing treat them structurally, and their
    derivative is zero. Differentiating w.r.t. a parameter raises: that is a backprop
    (`parameter_gradient`), never an entrywise derivative.
    """

    network: ClassVar[Any] = None
    n_inputs: ClassVar[int] = 0

    @classmethod
    def eval(cls, *args: sp.Basic) -> None:
        return None

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(int(i) for i in self.args[: len(self.args) - self.n_inputs])

    @property
    def output_index(self) -> int:
        return self.indices[0]

    @property
    def derivative_indices(self) -> tuple[int, ...]:
        return self.indices[1:]

    @property
    def order(self) -> int:
        return len(self.indices) - 1

    @property
    def inputs(self) -> tuple[sp.Expr, ...]:
        return self.args[len(self.args) - self.n_inputs:]

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        position = argindex - 1 - len(self.indices)
        if position < 0:
            # an index argument: its derivative is zero, so SymPy never asks for this
            raise sp.ArgumentIndexError(self, argindex)
        derivative = tuple(sorted((*self.derivative_indices, position)))
        return type(self)(self.output_index, *derivative, *self.inputs)

    def _eval_derivative(self, s: sp.Basic) -> sp.Expr:
        parameters = self.network.parameter_symbols if self.network is not None else ()
        parent = s.parent if isinstance(s, MatrixElement) else s
        if parent in parameters:
            raise BuildError(
                f"d/d{s}: the entries of a structured network are not differentiated w.r.t. "
                "single weights; use parameter_gradient(loss, snn), one backprop at the array level"
            )
        return super()._eval_derivative(s)

    def _sympystr(self, printer: Any) -> str:
        name = type(self).__name__
        inputs = ", ".join(printer.doprint(a) for a in self.inputs)
        head = f"{name}[{self.output_index}]"
        if self.order:
            head = f"d{''.join(f'[{j}]' for j in self.derivative_indices)}{head}"
        return f"{head}({inputs})"


_network_numbers = itertools.count(1)


@dataclass(frozen=True, eq=False)
class ParameterGradient:
    """d loss / d ps[layer][leaf], per sample: shape (out, in) for W, (out,) for b.

    A leaf of an equation tree; `build_structured_function` computes it by one backprop
    per application of the network in `loss`, seeded with `∂loss/∂out` from SymPy.
    """

    loss: sp.Expr
    network: StructuredNetwork
    path: Path

    @property
    def shape(self) -> Shape:
        return self.network.parameter_shapes[self.path]

    def __repr__(self) -> str:
        return f"ParameterGradient(d loss / d ps[{self.path[0]!r}][{self.path[1]!r}])"


class StructuredNetwork:
    """A network whose input is SymPy symbols and whose output stays an array program.

    The same interface as `SymbolicNetwork` where it makes sense — `input` (n×1 Matrix of
    Dummies), `params` (the tree `{"L1": {"W", "b"}, …}`, here `MatrixSymbol`s),
    `output` (m×1 Matrix), `snn(x)` on other inputs, `parameter_paths()` — but output entries
    are `NetworkFunction` nodes, so `jacobian(snn.output, snn.input)`, `hessian(...)` and any
    formula around them stay small whatever the width.

    >>> snn = StructuredNetwork(Chain(Dense(2, 3, "tanh"), Dense(3, 1)))
    >>> snn.output  # doctest: +ELLIPSIS
    Matrix([[net...[0](_x_1, _x_2)]])
    >>> snn.output.jacobian(snn.input)  # doctest: +ELLIPSIS
    Matrix([[d[0]net...[0](_x_1, _x_2), d[1]net...[0](_x_1, _x_2)]])
    """

    structured = True

    def __init__(self, net: Chain | Dense) -> None:
        self.net = as_chain(net)
        n = self.net.input_dim
        self.input = sp.Matrix(n, 1, lambda i, _: sp.Dummy(f"x_{i + 1}"))
        self.params: dict[str, dict[str, sp.MatrixSymbol]] = {
            name: {"W": sp.MatrixSymbol(sp.Dummy(f"{name}_W"), layer.n_out, layer.n_in),
                   "b": sp.MatrixSymbol(sp.Dummy(f"{name}_b"), layer.n_out, 1)}
            for name, layer in self.net.named_layers()
        }
        self.parameter_symbols = frozenset(m for tree in self.params.values() for m in tree.values())
        self.parameter_shapes: dict[Path, Shape] = {}
        for name, layer in self.net.named_layers():
            self.parameter_shapes[(name, "W")] = (layer.n_out, layer.n_in)
            self.parameter_shapes[(name, "b")] = (layer.n_out,)
        self.activations = tuple(ActivationForms.of(layer) for layer in self.net.layers)
        self.function: type[NetworkFunction] = type(
            f"net{next(_network_numbers)}", (NetworkFunction,), {"network": self, "n_inputs": n})
        self.output = self(self.input)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.net.named_layers())

    def __call__(self, x: sp.MatrixBase | Sequence[Any]) -> sp.Matrix:
        """The network's output entries at another input (n expressions)."""
        entries = list(x) if not isinstance(x, sp.MatrixBase) else list(x)
        n = self.net.input_dim
        if len(entries) != n or (isinstance(x, sp.MatrixBase) and 1 not in x.shape):
            raise BuildError(f"x: expected {n} input expressions, got {len(entries)}")
        inputs = [sp.sympify(e) for e in entries]
        return sp.Matrix([self.function(k, *inputs) for k in range(self.net.output_dim)])

    def parameter_paths(self) -> tuple[Path, ...]:
        """Access paths in kernel argument order (JAX's pytree order: keys sorted)."""
        return tuple(sorted(self.parameter_shapes))

    def parameter_gradient(self, loss: sp.Expr | sp.MatrixBase) -> dict[str, dict[str, ParameterGradient]]:
        """The tree `{"L1": {"W": d loss/dW, "b": …}, …}`, per sample, by backprop."""
        loss = _scalar(loss)
        return {name: {leaf: ParameterGradient(loss, self, (name, leaf)) for leaf in ("W", "b")}
                for name in self.layer_names}

    def __repr__(self) -> str:
        return f"StructuredNetwork({self.net!r})"


def parameter_gradient(loss: sp.Expr | sp.MatrixBase, snn: StructuredNetwork) -> dict:
    """`snn.parameter_gradient(loss)`: per-sample gradients of a scalar loss, as a tree."""
    if not isinstance(snn, StructuredNetwork):
        raise BuildError(f"snn: expected a StructuredNetwork, got {type(snn).__name__}")
    return snn.parameter_gradient(loss)


def hamiltonian_vector_field(H: sp.Expr | sp.MatrixBase, coordinates: Sequence[sp.Symbol]) -> sp.Matrix:
    """`J ∇H` for coordinates `(q, p)` (first half q): `(∂H/∂p, -∂H/∂q)`, an n×1 Matrix.

    >>> q, p = sp.symbols("q p")
    >>> hamiltonian_vector_field(p**2 / 2 + q**2 / 2, [q, p]).T
    Matrix([[p, -q]])
    """
    H = _scalar(H)
    coordinates = list(coordinates)
    if len(coordinates) % 2:
        raise BuildError(f"coordinates: expected an even number (q then p), got {len(coordinates)}")
    half = len(coordinates) // 2
    grad = [H.diff(c) for c in coordinates]
    return sp.Matrix(grad[half:] + [-g for g in grad[:half]])


def _scalar(value: Any) -> sp.Expr:
    if isinstance(value, sp.MatrixBase):
        if value.shape != (1, 1):
            raise BuildError(f"loss: expected a scalar or a 1×1 Matrix, got shape {value.shape}")
        value = value[0, 0]
    expr = sp.sympify(value)
    if not isinstance(expr, sp.Expr):
        raise BuildError(f"loss: expected a SymPy expression, got {type(expr).__name__}")
    return expr


# ---- the array IR ----------------------------------------------------------------------------
# Every array carries the batch dimensions first; `Index(x, (None, ":"))` is `x[..., None, :]`.


@dataclass(frozen=True)
class Ref:
    """A named array (a data argument `x1` or a program local)."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Param:
    """A parameter leaf, read as `ps["L1"]["W"]` (no batch dimension)."""

    path: Path

    def __repr__(self) -> str:
        return f"ps{list(self.path)}"


@dataclass(frozen=True)
class Transpose:
    """`w.T` of a 2-D parameter."""

    operand: Param

    def __repr__(self) -> str:
        return f"{self.operand!r}.T"


@dataclass(frozen=True)
class Binary:
    """`left <operator> right`; the subclass says which (its `operator`, as printed)."""

    left: Any
    right: Any
    operator: ClassVar[str] = "?"

    def __repr__(self) -> str:
        return f"({self.left!r} {self.operator} {self.right!r})"


class MatMul(Binary):
    operator = "@"


class Mul(Binary):
    operator = "*"


class Add(Binary):
    operator = "+"


@dataclass(frozen=True)
class Index:
    """`x[..., *items]` with items ":" (a whole axis), None (a new axis) or an int."""

    operand: Any
    items: tuple[Any, ...]

    def __repr__(self) -> str:
        shown = ", ".join("None" if i is None else str(i) for i in self.items)
        return f"{self.operand!r}[..., {shown}]"


@dataclass(frozen=True)
class SwapLast:
    """The last two axes swapped (a batch of transposes)."""

    operand: Any

    def __repr__(self) -> str:
        return f"swap({self.operand!r})"


@dataclass(frozen=True)
class Zeros:
    """An all-zero array of this per-sample shape (broadcast to the batch by the kernel)."""

    shape: Shape

    def __repr__(self) -> str:
        return f"zeros{self.shape}"


@dataclass(frozen=True)
class Assign:
    target: str
    value: Any

    def __repr__(self) -> str:
        return f"{self.target} = {self.value!r}"


@dataclass(frozen=True)
class Activate:
    """`targets[k] = σ⁽ᵏ⁾(source)` for k = 0, 1, 2 (None: not computed), from `forms`."""

    source: str
    targets: tuple[str | None, str | None, str | None]
    forms: ActivationForms

    def __repr__(self) -> str:
        names = ", ".join(t or "_" for t in self.targets)
        return f"{names} = σ, σ', σ''({self.source})"


Step = Assign | Activate


def _scale_columns(x: Any, d: Any) -> Any:
    """x * d[..., None, :]: scale the last axis of a (…, r, w) array by a (…, w) one."""
    return x if d is None else Mul(x, Index(d, (None, ":")))


def _scale_rows(d: Any, x: Any) -> Any:
    """d[..., :, None] * x: scale the second-to-last axis."""
    return x if d is None else Mul(Index(d, (":", None)), x)


#: widest layer for which the forward Jacobian is multiplied from the right (see below)
NARROW_JACOBIAN_WIDTH = 16


class NetworkProgram:
    """The array steps of one network application: forward pass and the derivatives asked for.

    Names get `suffix` (`""` for the first application, `"_2"`, … after). Each quantity is
    emitted once, the first time it is asked for (memoised), in dependency order:

    * forward: `z_l = h_{l-1} @ W_l.T + b_l`, `h_l, d_l, s_l = σ, σ', σ''(z_l)`;
    * input Jacobian, forward (n ≤ m): `diag(σ'(z_L)) W_L … diag(σ'(z_1)) W_1`. With
      layers at most NARROW_JACOBIAN_WIDTH wide, as `v_l = d_l[..., :, None] * (W_l @ v_{l-1})`,
      `v_1 = d_1[..., :, None] * W_1`, J = v_L, already (…, m, n); wider, as tangents
      `t_l = (t_{l-1} @ W_l.T) * d_l[..., None, :]` (…, n, w_l), `t_1 = W_1.T * d_1[..., None, :]`,
      J = swap(t_L): one GEMM per layer with the batch folded into its rows. Measured
      (docs/design/structured-networks.md): at width 8 the first form runs 1.9× the second, at 16 they tie,
      at 32 and 128 the second is 10–15 % ahead. The Hessian's `U_l` products use `t_l`;
    * input Jacobian, reverse (m < n, e.g. ∇H of a scalar H): adjoints
      `a_{L-1} = d_L[..., :, None] * W_L`, `a_{l-1} = (a_l * d_l[..., None, :]) @ W_l`, J = a_0;
    * input Hessian: `∇²y_k = Σ_l U_lᵀ diag(a_l[k] ⊙ σ''(z_l)) U_l` with U_l = ∂z_l/∂x
      (the tangents before scaling) and a_l = ∂y/∂h_l (a_L = I): only activations curve, z is
      affine. That needs (…, n, w) per layer, where forward-over-forward needs (…, n, n, w);
    * parameter gradient for a seed `g = ∂loss/∂y`: `e_L = g * d_L`, `e_{l-1} = (e_l @ W_l) * d_{l-1}`,
      `∂/∂W_l = e_l[..., :, None] * h_{l-1}[..., None, :]`, `∂/∂b_l = e_l`.
    """

    def __init__(self, network: StructuredNetwork, source: Any, suffix: str = "",
                 orders: int = 0) -> None:
        self.network = network
        self.source = source
        self.suffix = suffix
        self.orders = orders  # highest activation derivative any quantity needs
        self.steps: list[Step] = []
        self._memo: dict[tuple, Any] = {}
        self.depth = len(network.net.layers)

    def __repr__(self) -> str:
        return f"NetworkProgram({self.network!r}, {len(self.steps)} steps)"

    def local_name(self, stem: str) -> str:
        """The name a value of this program takes in the generated code (`H` → `H2`)."""
        """The name of a value of this program in the generated code (`H` → `H_1`)."""
        return f"{stem}{self.suffix}"

    def _once(self, key: tuple, build: Any) -> Any:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def _assign(self, stem: str, value: Any) -> Ref:
        name = self.local_name(stem)
        self.steps.append(Assign(name, value))
        return Ref(name)

    def _w(self, layer: int) -> Param:
        return Param((self.network.layer_names[layer - 1], "W"))

    def _b(self, layer: int) -> Param:
        return Param((self.network.layer_names[layer - 1], "b"))

    # -- forward ---------------------------------------------------------------------------------
    def _layer(self, layer: int) -> tuple[Any, Any, Any]:
        """(h_l, d_l, s_l): value, σ' and σ'' (None where σ' ≡ 1 or σ'' ≡ 0)."""
        def build() -> tuple[Any, Any, Any]:
            previous = self.h(layer - 1)
            z = self._assign(f"z{layer}", Add(MatMul(previous, Transpose(self._w(layer))),
                                               self._b(layer)))
            forms = self.network.activations[layer - 1]
            if forms.is_identity:
                return z, None, None
            wanted = [f"h{layer}",
                      None if self.orders < 1 or forms.first_is_one else f"d{layer}",
                      None if self.orders < 2 or forms.second_is_zero else f"s{layer}"]
            targets = tuple(self.local_name(t) if t else None for t in wanted)
            self.steps.append(Activate(z.name, targets, forms))
            return tuple(Ref(t) if t else None for t in targets)
        return self._once(("layer", layer), build)

    def h(self, layer: int) -> Any:
        return self.source if layer == 0 else self._layer(layer)[0]

    def d(self, layer: int) -> Any:
        if self.orders < 1:
            raise BuildError("internal: σ' asked for but not planned")
        return self._layer(layer)[1]

    def s(self, layer: int) -> Any:
        if self.orders < 2:
            raise BuildError("internal: σ'' asked for but not planned")
        return self._layer(layer)[2]

    def output(self) -> Any:
        return self.h(self.depth)

    # -- input derivatives -----------------------------------------------------------------------
    def u(self, layer: int) -> Any:
        """∂z_l/∂x, transposed: (…, n, w_l)."""
        if layer == 1:
            return Transpose(self._w(1))
        return self._once(("u", layer), lambda: self._assign(
            f"u{layer}", MatMul(self.t(layer - 1), Transpose(self._w(layer)))))

    def t(self, layer: int) -> Any:
        """∂h_l/∂x, transposed: (…, n, w_l)."""
        def build() -> Any:
            d = self.d(layer)
            return self.u(layer) if d is None else self._assign(
                f"t{layer}", _scale_columns(self.u(layer), d))
        return self._once(("t", layer), build)

    def v(self, layer: int) -> Any:
        """∂h_l/∂x: (…, w_l, n) — forward tangents with the n input directions last."""
        def build() -> Any:
            d = self.d(layer)
            base = self._w(1) if layer == 1 else MatMul(self._w(layer), self.v(layer - 1))
            value = _scale_rows(d, base)
            return value if isinstance(value, (Ref, Param)) else self._assign(f"v{layer}", value)
        return self._once(("v", layer), build)

    def a(self, layer: int) -> Any:
        """∂y/∂h_l: (…, m, w_l), for l < L (a_L is the identity)."""
        def build() -> Any:
            if layer == self.depth - 1:
                value = _scale_rows(self.d(self.depth), self._w(self.depth))
            else:
                value = MatMul(_scale_columns(self.a(layer + 1), self.d(layer + 1)),
                               self._w(layer + 1))
            return self._assign(f"a{layer}", value)
        return self._once(("a", layer), build)

    def jacobian(self) -> Any:
        """∂y/∂x: (…, m, n), forward if n ≤ m, else reverse (cost min(m, n) passes)."""
        def build() -> Any:
            net = self.network.net
            if net.input_dim > net.output_dim:
                value = self.a(0)
            elif max(layer.n_out for layer in net.layers) <= NARROW_JACOBIAN_WIDTH:
                value = self.v(self.depth)
            else:
                value = SwapLast(self.t(self.depth))
            return value if isinstance(value, Ref) else self._assign("J", value)
        return self._once(("J",), build)

    def hessian(self) -> Any:
        """∂²y_k/∂x∂x: (…, m, n, n)."""
        def build() -> Any:
            terms = []
            last = self.depth
            s_last = self.s(last)
            if s_last is not None:
                ut = self._assign(f"uT{last}", SwapLast(self.u(last)))  # (…, m, n)
                terms.append(self._assign(f"q{last}", Mul(
                    Index(s_last, (":", None, None)),
                    Mul(Index(ut, (":", ":", None)), Index(ut, (":", None, ":"))))))
            for layer in range(1, last):
                s = self.s(layer)
                if s is None:
                    continue
                c = self._assign(f"c{layer}", _scale_columns(self.a(layer), s))  # (…, m, w)
                u = self.u(layer)
                # U_lᵀ: for the first layer that is W_1 itself, no swap needed
                ut = self._w(1) if layer == 1 else SwapLast(u)
                terms.append(self._assign(f"q{layer}", MatMul(
                    Mul(Index(u, (None, ":", ":")), Index(c, (":", None, ":"))),
                    Index(ut, (None, ":", ":")))))
            if not terms:
                net = self.network.net
                return self._assign("H", Zeros((net.output_dim, net.input_dim, net.input_dim)))
            total = terms[0]
            for term in terms[1:]:
                total = Add(total, term)
            return self._assign("H", total)
        return self._once(("H",), build)

    # -- parameter gradients -----------------------------------------------------------------------
    def backprop(self, seed: Ref, tag: str) -> dict[Path, Any]:
        """Per-sample ∂loss/∂ps for `seed` = ∂loss/∂y (…, m); names get `tag`."""
        gradients: dict[Path, Any] = {}
        delta: Any = None
        for layer in range(self.depth, 0, -1):
            d = self.d(layer)
            if layer == self.depth:
                value: Any = seed if d is None else Mul(seed, d)
            else:
                back = MatMul(delta, self._w(layer + 1))
                value = back if d is None else Mul(back, d)
            delta = value if isinstance(value, Ref) else self._assign(f"e{layer}{tag}", value)
            name = self.network.layer_names[layer - 1]
            gradients[(name, "W")] = self._assign(
                f"gW{layer}{tag}", Mul(Index(delta, (":", None)), Index(self.h(layer - 1), (None, ":"))))
            gradients[(name, "b")] = delta
        return gradients


# ---- planning an equation tree -------------------------------------------------------------


def _walk(roots: Sequence[sp.Basic]) -> Iterator[sp.Basic]:
    seen: set[sp.Basic] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(node.args)


def network_nodes(exprs: Sequence[sp.Basic]) -> list[NetworkFunction]:
    """Every `NetworkFunction` node under `exprs`, each once, in a deterministic order."""
    found = {node for node in _walk(list(exprs)) if isinstance(node, NetworkFunction)}
    return sorted(found, key=sp.default_sort_key)


@dataclass(frozen=True)
class Application:
    """One evaluation of a network at one input (a tuple of expressions)."""

    network: StructuredNetwork
    inputs: tuple[sp.Expr, ...]

    def __repr__(self) -> str:
        return f"{self.network.function.__name__}({', '.join(map(str, self.inputs))})"


@dataclass
class Needs:
    """What one application must compute, and the SymPy placeholders scalar code reads."""

    output: bool = False
    jacobian: bool = False
    hessian: bool = False
    gradient: bool = False
    placeholders: dict[str, sp.Matrix] = field(default_factory=dict)

    @property
    def orders(self) -> int:
        """The highest activation derivative needed: σ'' for a Hessian, σ' for J or backprop."""
        return 2 if self.hessian else 1 if (self.jacobian or self.gradient) else 0


@dataclass(frozen=True)
class LeafPlan:
    """How one equation leaf is produced.

    kind "array": a whole quantity of an application (`quantity` is "output", "jacobian",
    or ("hessian", k)); kind "scalar": SymPy entries (`expr`, network nodes replaced by
    placeholder symbols); kind "gradient": a parameter gradient (`group`, `path`).
    """

    kind: str
    shape: Shape
    label: str
    application: int | None = None
    quantity: Any = None
    expr: sp.Basic | None = None
    group: int | None = None
    path: Path | None = None


@dataclass
class GradientGroup:
    """One loss whose parameter gradients are asked for: a seed ∂loss/∂y per application."""

    loss: sp.Expr
    seeds: dict[int, list[sp.Expr]]  # application index -> m entries (placeholders substituted)


@dataclass
class StructuredPlan:
    """An equation tree read for a structured build: applications, needs, leaves, losses."""

    network: StructuredNetwork
    applications: list[Application]
    needs: list[Needs]
    leaves: list[LeafPlan]
    treedef: Any
    groups: list[GradientGroup]

    def __repr__(self) -> str:
        kinds = ", ".join(leaf.kind for leaf in self.leaves)
        return f"StructuredPlan({len(self.applications)} application(s); leaves: {kinds})"


def _leaf_shape(leaf: Any) -> Shape:
    if isinstance(leaf, sp.MatrixBase):
        rows, cols = leaf.shape
        return (rows,) if cols == 1 else (rows, cols)
    return ()


def _is_leaf(obj: Any) -> bool:
    return isinstance(obj, (sp.Basic, sp.MatrixBase, ParameterGradient))


def _whole_quantity(leaf: sp.MatrixBase, network: StructuredNetwork) -> tuple[Application, Any] | None:
    """If `leaf` is exactly an output, Jacobian or Hessian (of one output) of one application."""
    entries = list(leaf)
    if not entries or not all(isinstance(e, network.function) for e in entries):
        return None
    inputs = entries[0].inputs
    if any(e.inputs != inputs for e in entries):
        return None
    f, (rows, cols) = network.function, leaf.shape
    m, n = network.net.output_dim, network.net.input_dim
    application = Application(network, inputs)
    if (rows, cols) == (m, 1) and entries == [f(k, *inputs) for k in range(m)]:
        return application, "output"
    if (rows, cols) == (m, n) and entries == [f(k, j, *inputs) for k in range(m) for j in range(n)]:
        return application, "jacobian"
    if (rows, cols) == (n, n):
        k = entries[0].output_index
        if entries == [f(k, min(i, j), max(i, j), *inputs) for i in range(n) for j in range(n)]:
            return application, ("hessian", k)
    return None


def _placeholder(needs: Needs, quantity: str, shape: tuple[int, int], stem: str) -> sp.Matrix:
    if quantity not in needs.placeholders:
        needs.placeholders[quantity] = sp.Matrix(
            *shape, lambda i, j: sp.Dummy(f"{stem}_{i}_{j}"))
    return needs.placeholders[quantity]


def plan_structured(eqs: Any, network: StructuredNetwork) -> StructuredPlan:
    """Read an equation tree whose leaves are Expr, Matrix or `ParameterGradient`.

    Network nodes must belong to `network`; derivatives of order ≤ 2 are supported.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(eqs, is_leaf=_is_leaf)
    if not flat:
        raise BuildError("eqs: expected at least one equation, got an empty structure")
    applications: list[Application] = []
    needs: list[Needs] = []

    def application_index(application: Application) -> int:
        if application not in applications:
            applications.append(application)
            needs.append(Needs())
        return applications.index(application)

    def check(node: NetworkFunction, where: str) -> int:
        if type(node).network is not network:
            raise BuildError(f"eqs{where}: {type(node).__name__} belongs to another network; "
                             "a structured kernel evaluates one network (its ps tree)")
        if node.order > 2:
            raise BuildError(f"eqs{where}: derivative of order {node.order} of a network output; "
                             "structured kernels compute up to second derivatives")
        if network_nodes(node.inputs):
            raise BuildError(f"eqs{where}: a network applied to a network output is not supported")
        return application_index(Application(network, node.inputs))

    def substitute(expr: sp.Basic, where: str) -> sp.Basic:
        """Network nodes → placeholder symbols (entries of arrays computed at array level)."""
        m, n = network.net.output_dim, network.net.input_dim
        mapping: dict[sp.Basic, sp.Basic] = {}
        for node in network_nodes([expr]):
            a = check(node, where)
            need, suffix = needs[a], f"{a + 1}"
            k, derivative = node.output_index, node.derivative_indices
            if node.order == 0:
                need.output = True
                mapping[node] = _placeholder(need, "output", (m, 1), f"y{suffix}")[k, 0]
            elif node.order == 1:
                need.jacobian = True
                mapping[node] = _placeholder(need, "jacobian", (m, n), f"J{suffix}")[k, derivative[0]]
            else:
                need.hessian = True
                mapping[node] = _placeholder(need, f"hessian{k}", (n, n), f"H{suffix}_{k}")[derivative]
        return expr.xreplace(mapping) if mapping else expr

    leaves: list[LeafPlan] = []
    groups: list[GradientGroup] = []
    losses: dict[sp.Expr, int] = {}
    for key_path, leaf in flat:
        where = jax.tree_util.keystr(key_path)
        label = f"eqs{where}"
        if isinstance(leaf, ParameterGradient):
            if leaf.network is not network:
                raise BuildError(f"{label}: a parameter gradient of another network")
            if leaf.loss not in losses:
                losses[leaf.loss] = len(groups)
                groups.append(GradientGroup(leaf.loss, _seeds(leaf.loss, network, check, substitute,
                                                              label)))
                for a in groups[-1].seeds:
                    needs[a].gradient = True
            leaves.append(LeafPlan("gradient", leaf.shape, label, group=losses[leaf.loss],
                                   path=leaf.path))
            continue
        if isinstance(leaf, sp.MatrixExpr) and not isinstance(leaf, sp.MatrixBase):
            leaf = leaf.as_explicit()
        if isinstance(leaf, sp.MatrixBase):
            if 0 in leaf.shape:
                raise BuildError(f"{label}: expected a non-empty Matrix, got shape {leaf.shape}")
            whole = _whole_quantity(leaf, network)
            if whole is not None:
                application, quantity = whole
                a = check(list(leaf)[0], where)
                need = needs[a]
                if quantity == "output":
                    need.output = True
                elif quantity == "jacobian":
                    need.jacobian = True
                else:
                    need.hessian = True
                leaves.append(LeafPlan("array", _leaf_shape(leaf), label, application=a,
                                       quantity=quantity))
                continue
            leaves.append(LeafPlan("scalar", _leaf_shape(leaf), label,
                                   expr=substitute(sp.ImmutableMatrix(leaf), where)))
            continue
        try:
            expr = sp.sympify(leaf, strict=True)
        except (sp.SympifyError, TypeError) as error:
            raise BuildError(f"{label}: expected a SymPy expression, Matrix or ParameterGradient, "
                             f"got {type(leaf).__name__}") from error
        if not isinstance(expr, sp.Expr):
            raise BuildError(f"{label}: expected a numeric SymPy expression, got {expr}")
        leaves.append(LeafPlan("scalar", (), label, expr=substitute(expr, where)))
    return StructuredPlan(network, applications, needs, leaves, treedef, groups)


def _seeds(loss: sp.Expr, network: StructuredNetwork, check: Any, substitute: Any,
           label: str) -> dict[int, list[sp.Expr]]:
    """∂loss/∂y_k for each application of `network` in `loss` (SymPy), placeholders in.

    ∂loss/∂W = Σ_applications Σ_k (∂loss/∂y_k) ∂y_k/∂W: the scalar factor is SymPy's, the
    sum over k is one backprop seeded with it.
    """
    nodes = network_nodes([loss])
    if not nodes:
        raise BuildError(f"{label}: the loss does not depend on the network")
    if any(node.order for node in nodes):
        raise BuildError(f"{label}: the loss reads input derivatives of the network; a parameter "
                         "gradient through them (a second-order backprop) is not supported")
    if any(isinstance(s, MatrixElement) and s.parent in network.parameter_symbols
           or s in network.parameter_symbols for s in loss.free_symbols):
        raise BuildError(f"{label}: the loss reads the network's weights directly (e.g. a weight "
                         "penalty); write that term outside the structured loss")
    outputs: dict[int, dict[int, sp.Dummy]] = {}
    mapping: dict[sp.Basic, sp.Dummy] = {}
    for node in nodes:
        a = check(node, label)
        symbol = sp.Dummy(f"o{a}_{node.output_index}")
        outputs.setdefault(a, {})[node.output_index] = symbol
        mapping[node] = symbol
    reduced = loss.xreplace(mapping)
    back = {symbol: node for node, symbol in mapping.items()}
    seeds: dict[int, list[sp.Expr]] = {}
    for a, symbols in outputs.items():
        entries = []
        for k in range(network.net.output_dim):
            if k in symbols:
                entries.append(substitute(_diff(reduced, symbols[k]).xreplace(back), label))
            else:
                entries.append(sp.S.Zero)
        seeds[a] = entries
    return seeds


def _diff(expr: sp.Expr, symbol: sp.Symbol) -> sp.Expr:
    """`expr.diff(symbol)`, differentiating only the terms of a sum that contain `symbol`.

    A loss Σ_k (y_k − t_k)² has one term per output; SymPy's diff of the whole sum visits
    all of them for each k (quadratic, ~0.2 s for 8 outputs), this visits one.
    """
    if isinstance(expr, sp.Add):
        return sp.Add(*(term.diff(symbol) for term in expr.args if term.has(symbol)))
    return expr.diff(symbol)


def input_data_position(inputs: Sequence[sp.Expr], data: Sequence[Sequence[sp.Basic]]) -> int | None:
    """The index of the data argument whose entries are exactly `inputs`, if any."""
    for position, entries in enumerate(data):
        if tuple(entries) == tuple(inputs):
            return position
    return None

