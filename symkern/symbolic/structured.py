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
from symkern.symbolic.nodes import walk

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

    def derivative(self, order: int) -> sp.Expr:
        """σ⁽ᵒʳᵈᵉʳ⁾ (order 0 is σ): a third or higher derivative is taken when first asked for."""
        if order < 0:
            raise BuildError(f"order: expected a non-negative integer, got {order}")
        if order <= 2:
            return (self.value, self.first, self.second)[order]
        return _higher_derivative(self, order)

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


@functools.lru_cache(maxsize=256)
def _higher_derivative(forms: ActivationForms, order: int) -> sp.Expr:
    return sp.diff(forms.derivative(order - 1), forms.variable)


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
class Ones:
    """`jnp.ones_like(source[..., :1])`: a unit cotangent (…, 1) of the data's batch and dtype."""

    source: Any

    def __repr__(self) -> str:
        return f"ones_like({self.source!r}[..., :1])"


@dataclass(frozen=True)
class Sum:
    """`jnp.sum(x, axis=axes, keepdims=keepdims)` over per-sample axes (negative: the batch leads)."""

    operand: Any
    axes: tuple[int, ...]
    keepdims: bool

    def __repr__(self) -> str:
        return f"sum({self.operand!r}, {self.axes}{', keepdims' if self.keepdims else ''})"


@dataclass(frozen=True)
class Stack:
    """`jnp.stack(operands, axis)`, a None operand standing for zeros shaped like the others."""

    operands: tuple[Any, ...]
    axis: int

    def __repr__(self) -> str:
        shown = ", ".join("0" if o is None else repr(o) for o in self.operands)
        return f"stack([{shown}], {self.axis})"


@dataclass(frozen=True)
class Assign:
    target: str
    value: Any

    def __repr__(self) -> str:
        return f"{self.target} = {self.value!r}"


@dataclass(frozen=True)
class Activate:
    """`targets[k] = σ⁽ᵏ⁾(source)` for k = 0, 1, …, len(targets) − 1 (None: not computed,
    or ≡ 1 for k = 1, ≡ 0 for k ≥ 2, as `forms` says), from `forms`."""

    source: str
    targets: tuple[str | None, ...]
    forms: ActivationForms

    def __repr__(self) -> str:
        names = ", ".join(t or "_" for t in self.targets)
        primes = ", ".join(f"σ{chr(0x2032) * k}" if k < 3 else f"σ({k})" for k in range(len(self.targets)))
        return f"{names} = {primes}({self.source})"


Step = Assign | Activate


def _scale_columns(x: Any, d: Any) -> Any:
    """x * d[..., None, :]: scale the last axis of a (…, r, w) array by a (…, w) one."""
    return x if d is None else Mul(x, Index(d, (None, ":")))


def _scale_rows(d: Any, x: Any) -> Any:
    """d[..., :, None] * x: scale the second-to-last axis."""
    return x if d is None else Mul(Index(d, (":", None)), x)


def _swap(node: Any) -> Any:
    """The last two axes of `node` swapped, folding `W.T` back to `W`."""
    if isinstance(node, Transpose):
        return node.operand
    if isinstance(node, Param):
        return Transpose(node)
    return SwapLast(node)


def _outer(column: Any, row: Any) -> Any:
    """column[..., :, None] * row[..., None, :]."""
    return Mul(Index(column, (":", None)), Index(row, (None, ":")))


def _merge_stacks(parts: list[Any]) -> list[Any]:
    """Stacks of the same axis and length as one stack of the sums of their entries (the
    seeds of the entries of one vector, the columns of a first-layer weight)."""
    stacks = [p for p in parts if isinstance(p, Stack)]
    if len(stacks) < 2 or len({(p.axis, len(p.operands)) for p in stacks}) > 1:
        return parts
    merged: list[Any] = [None] * len(stacks[0].operands)
    for stack in stacks:
        for k, operand in enumerate(stack.operands):
            if operand is not None:
                merged[k] = operand if merged[k] is None else Add(merged[k], operand)
    return [Stack(tuple(merged), stacks[0].axis)] + [p for p in parts if not isinstance(p, Stack)]


def _broadcast(left: Shape, right: Shape) -> Shape:
    rank = max(len(left), len(right))
    left, right = (1,) * (rank - len(left)) + left, (1,) * (rank - len(right)) + right
    out = []
    for a, b in zip(left, right, strict=True):
        if a != b and 1 not in (a, b):
            raise BuildError(f"internal: per-sample shapes {left} and {right} do not broadcast")
        out.append(max(a, b))
    return tuple(out)


def partitions(items: tuple[int, ...]) -> Iterator[list[tuple[int, ...]]]:
    """Every partition of the positions of `items` into blocks, each block as its sorted items.

    The terms of Faà di Bruno's formula: ∂_S σ(z) = Σ_π σ⁽|π|⁾(z) Π_{B ∈ π} ∂_B z.

    >>> [p for p in partitions((0, 1))]
    [[(0,), (1,)], [(0, 1)]]
    """
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in partitions(rest):
        yield [(first,), *partition]
        for k, block in enumerate(partition):
            yield [*partition[:k], tuple(sorted((first, *block))), *partition[k + 1:]]


#: widest layer for which the forward Jacobian is multiplied from the right (see below)
NARROW_JACOBIAN_WIDTH = 16


class NetworkProgram:
    """The array steps of one network application: forward pass and the derivatives asked for.

    Names get `suffix` (`""` for the first application, `"_2"`, … after). Each quantity is
    emitted once, the first time it is asked for (memoised), in dependency order:

    * forward: `z_l = h_{l-1} @ W_l.T + b_l`, `h_l, d_l, s_l, … = σ, σ', σ'', …(z_l)`;
    * input Jacobian, forward (n ≤ m): `diag(σ'(z_L)) W_L … diag(σ'(z_1)) W_1`. With
      layers at most NARROW_JACOBIAN_WIDTH wide, as `v_l = d_l[..., :, None] * (W_l @ v_{l-1})`,
      `v_1 = d_1[..., :, None] * W_1`, J = v_L, already (…, m, n); wider, as tangents
      `t_l = (t_{l-1} @ W_l.T) * d_l[..., None, :]` (…, n, w_l), `t_1 = W_1.T * d_1[..., None, :]`,
      J = swap(t_L): one GEMM per layer with the batch folded into its rows. Measured
      (docs/design/structured-networks.md): at width 8 the first form runs 1.9× the second, at 16 they tie,
      at 32 and 128 the second is 10–15 % ahead. The Hessian's `U_l` products use `t_l`;
    * input Jacobian, reverse (m < n, e.g. ∇H of a scalar H): adjoints
      `a_{L-1} = d_L[..., :, None] * W_L`, `a_{l-1} = (a_l * d_l[..., None, :]) @ W_l`, J = a_0;
      for one output the rows are vectors (…, w_l), so every product is a batch-folded GEMM;
    * input Hessian: `∇²y_k = Σ_l U_lᵀ diag(a_l[k] ⊙ σ''(z_l)) U_l` with U_l = ∂z_l/∂x
      (the tangents before scaling) and a_l = ∂y/∂h_l (a_L = I): only activations curve, z is
      affine. That needs (…, n, w) per layer, where forward-over-forward needs (…, n, n, w);
    * entries of derivatives of any order along input directions S = (i, j, …), as vectors
      (…, w_l) per direction set (`tangent`): `∂_S z_l = ∂_S h_{l-1} @ W_l.T`, `∂_i z_1 = W_1[:, i]`,
      `∂_S h_l = Σ_π σ⁽|π|⁾(z_l) Π_{B∈π} ∂_B z_l` over the partitions π of S (Faà di Bruno);
    * per-sample parameter gradients of any scalar formula of the above (`vjp`): reverse mode
      over these very steps, seeded with the formula's partial derivatives from SymPy.
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
        #: (batched, per-sample shape) of every named array of the forward program
        self.shapes: dict[str, tuple[bool, Shape]] = {}
        if isinstance(source, Ref):
            self.shapes[source.name] = (True, (network.net.input_dim,))

    def __repr__(self) -> str:
        return f"NetworkProgram({self.network!r}, {len(self.steps)} steps)"

    def local_name(self, stem: str) -> str:
        """The name of a value of this program in the generated code (`H` → `H_2`)."""
        return f"{stem}{self.suffix}"

    def _once(self, key: tuple, build: Any) -> Any:
        if key not in self._memo:
            self._memo[key] = build()
        return self._memo[key]

    def _assign(self, stem: str, value: Any) -> Ref:
        name = self.local_name(stem)
        self.shapes[name] = self.shape_of(value)
        self.steps.append(Assign(name, value))
        return Ref(name)

    def _w(self, layer: int) -> Param:
        return Param((self.network.layer_names[layer - 1], "W"))

    def _b(self, layer: int) -> Param:
        return Param((self.network.layer_names[layer - 1], "b"))

    # -- shapes ----------------------------------------------------------------------------------
    def shape_of(self, node: Any) -> tuple[bool, Shape]:
        """Whether `node` carries the batch dimensions, and its shape per sample."""
        if isinstance(node, Ref):
            return self.shapes[node.name]
        if isinstance(node, Param):
            return False, self.network.parameter_shapes[node.path]
        if isinstance(node, Zeros):
            return False, node.shape
        if isinstance(node, Ones):
            return True, (1,)
        if isinstance(node, (Transpose, SwapLast)):
            batched, shape = self.shape_of(node.operand)
            return batched, shape[:-2] + (shape[-1], shape[-2])
        if isinstance(node, Index):
            batched, shape = self.shape_of(node.operand)
            consumed = sum(item is not None for item in node.items)
            mapped = []
            axes = iter(shape[len(shape) - consumed:])
            for item in node.items:
                if item is None:
                    mapped.append(1)
                elif item == ":":
                    mapped.append(next(axes))
                else:
                    next(axes)
            return batched, shape[:len(shape) - consumed] + tuple(mapped)
        if isinstance(node, (Mul, Add)):
            (lb, ls), (rb, rs) = self.shape_of(node.left), self.shape_of(node.right)
            if (lb != rb) and len(rs if lb else ls) > len(ls if lb else rs):
                raise BuildError(f"internal: {node!r} would broadcast a weight against the batch")
            return lb or rb, _broadcast(ls, rs)
        if isinstance(node, MatMul):
            (lb, ls), (rb, rs) = self.shape_of(node.left), self.shape_of(node.right)
            if len(ls) == 1 and len(rs) == 2 and not rb:
                return lb, (rs[1],)
            if len(ls) < 2 or len(rs) < 2:
                raise BuildError(f"internal: {node!r}: a batched vector times a batched matrix")
            return lb or rb, _broadcast(ls[:-2], rs[:-2]) + (ls[-2], rs[-1])
        raise BuildError(f"internal: no shape for {node!r}")

    # -- forward ---------------------------------------------------------------------------------
    def _layer(self, layer: int) -> tuple[Any, ...]:
        """(h_l, σ'(z_l), σ''(z_l), …) up to `orders`: None where σ' ≡ 1 or σ⁽ᵏ⁾ ≡ 0 (k ≥ 2)."""
        def build() -> tuple[Any, ...]:
            previous = self.h(layer - 1)
            z = self._assign(f"z{layer}", Add(MatMul(previous, Transpose(self._w(layer))),
                                               self._b(layer)))
            forms = self.network.activations[layer - 1]
            if forms.is_identity:
                return (z,) + (None,) * self.orders
            wanted: list[str | None] = [f"h{layer}"]
            for k in range(1, self.orders + 1):
                constant = forms.derivative(k)
                if constant == (1 if k == 1 else 0):
                    wanted.append(None)
                else:
                    wanted.append({1: f"d{layer}", 2: f"s{layer}"}.get(k, f"s{layer}_{k}"))
            targets = tuple(self.local_name(t) if t else None for t in wanted)
            self.steps.append(Activate(z.name, targets, forms))
            for target in targets:
                if target:
                    self.shapes[target] = self.shapes[z.name]
            return tuple(Ref(t) if t else None for t in targets)
        return self._once(("layer", layer), build)

    def sigma(self, layer: int, order: int) -> Any:
        """σ⁽ᵒʳᵈᵉʳ⁾(z_l), or None (≡ 1 for order 1, ≡ 0 above)."""
        if order > self.orders:
            raise BuildError(f"internal: σ of order {order} asked for but not planned")
        return self._layer(layer)[order]

    def h(self, layer: int) -> Any:
        return self.source if layer == 0 else self._layer(layer)[0]

    def d(self, layer: int) -> Any:
        return self.sigma(layer, 1)

    def s(self, layer: int) -> Any:
        return self.sigma(layer, 2)

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
        if self.network.net.output_dim == 1:
            return Index(self.row(layer), (None, ":"))

        def build() -> Any:
            if layer == self.depth - 1:
                value = _scale_rows(self.d(self.depth), self._w(self.depth))
            else:
                value = MatMul(_scale_columns(self.a(layer + 1), self.d(layer + 1)),
                               self._w(layer + 1))
            return self._assign(f"a{layer}", value)
        return self._once(("a", layer), build)

    def row(self, layer: int) -> Any:
        """∂y_0/∂h_l of a one-output network: (…, w_l), for l < L.

        The last row is `σ'(z_L) @ W_L`, `(…, 1) @ (1, w)` (a unit cotangent for a linear
        output), not `σ'(z_L) * W_L[0]`: `jax.grad` through the kernel then takes W_L's
        cotangent as a matrix product over the batch instead of a reduction, a training step
        of the 2-40-1 HNN field at batch 4,096 0.58 → 0.51 ms."""
        def build() -> Any:
            if layer == self.depth - 1:
                d = self.d(self.depth)
                value = MatMul(Ones(self.source) if d is None else d, self._w(self.depth))
            else:
                d = self.d(layer + 1)
                above = self.row(layer + 1)
                value = MatMul(above if d is None else Mul(above, d), self._w(layer + 1))
            return self._assign(f"a{layer}", value)
        return self._once(("row", layer), build)

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

    def _direction_name(self, stem: str, layer: int, directions: tuple[int, ...]) -> str:
        return f"{stem}{layer}x{'x'.join(map(str, directions))}"

    def pre_tangent(self, layer: int, directions: tuple[int, ...]) -> Any:
        """∂_S z_l for the sorted input directions S: (…, w_l), or None (≡ 0)."""
        def build() -> Any:
            if layer == 1:
                return Index(self._w(1), (":", directions[0])) if len(directions) == 1 else None
            below = self.tangent(layer - 1, directions)
            if below is None:
                return None
            return self._assign(self._direction_name("dz", layer, directions),
                                MatMul(below, Transpose(self._w(layer))))
        return self._once(("dz", layer, directions), build)

    def tangent(self, layer: int, directions: tuple[int, ...]) -> Any:
        """∂_S h_l for the sorted input directions S: (…, w_l), or None (≡ 0)."""
        def build() -> Any:
            terms = []
            for partition in partitions(directions):
                factors = [self.pre_tangent(layer, block) for block in partition]
                sigma = self.sigma(layer, len(partition))
                if any(f is None for f in factors) or (sigma is None and len(partition) > 1):
                    continue
                product = factors[0]
                for factor in factors[1:]:
                    product = Mul(product, factor)
                terms.append(product if sigma is None else Mul(sigma, product))
            if not terms:
                return None
            total = terms[0]
            for term in terms[1:]:
                total = Add(total, term)
            if isinstance(total, Ref) or self.shape_of(total)[0] is False:
                return total
            return self._assign(self._direction_name("dh", layer, directions), total)
        return self._once(("dh", layer, directions), build)

    def derivative_entry(self, output: int, directions: tuple[int, ...], reverse: bool) -> Any:
        """∂_S y_k, per sample (…,); first derivatives from the reverse rows if `reverse`."""
        if reverse and len(directions) == 1:
            if self.network.net.output_dim == 1:
                return Index(self.row(0), (directions[0],))
            return Index(self.a(0), (output, directions[0]))
        value = self.tangent(self.depth, directions)
        return Zeros(()) if value is None else Index(value, (output,))

    # -- parameter gradients -----------------------------------------------------------------------
    def vjp(self, cotangents: Sequence[tuple[Any, Ref]], tag: str) -> dict[Path, Any]:
        """Per-sample Σ_c ⟨seed_c, ∂node_c/∂ps⟩ for `cotangents` (node of this program, seed):
        reverse mode over the steps emitted so far, its steps appended; names get `tag`.
        A parameter the nodes do not depend on gets `Zeros` of its shape."""
        adjoints: dict[str, list[Any]] = {}
        parameters: dict[Path, list[Any]] = {}

        def reduce_to(adjoint: Any, source: Shape, target: Shape) -> Any:
            extra = len(source) - len(target)
            if extra < 0:
                raise BuildError(f"internal: adjoint of shape {source} for a {target} operand")
            if extra:
                adjoint = Sum(adjoint, tuple(range(-len(source), -len(target))), False)
            kept = tuple(k - len(target) for k, (a, b) in enumerate(zip(source[extra:], target, strict=True))
                         if b == 1 and a != 1)
            return Sum(adjoint, kept, True) if kept else adjoint

        def deposit(node: Any, adjoint: Any) -> None:
            if isinstance(node, Ref):
                adjoints.setdefault(node.name, []).append(adjoint)
            elif isinstance(node, Param):
                parameters.setdefault(node.path, []).append(adjoint)
            elif isinstance(node, (Transpose, SwapLast)):
                deposit(node.operand, _swap(adjoint))
            elif isinstance(node, (Zeros, Ones)):
                return
            elif isinstance(node, (Add, Mul)):
                shape = self.shape_of(node)[1]
                for side, other in ((node.left, node.right), (node.right, node.left)):
                    part = adjoint if isinstance(node, Add) else Mul(adjoint, other)
                    deposit(side, reduce_to(part, shape, self.shape_of(side)[1]))
            elif isinstance(node, MatMul):
                shape = self.shape_of(node)[1]
                left, right = self.shape_of(node.left)[1], self.shape_of(node.right)[1]
                if len(left) == 1:  # a vector times a weight: the weight's adjoint is an outer product
                    back = _swap(node.right)
                    deposit(node.left, Mul(adjoint, Index(back, (0, ":"))) if shape == (1,)
                            else MatMul(adjoint, back))  # (…, 1) @ (1, q): a broadcast
                    if isinstance(node.right, Transpose):
                        deposit(node.right.operand, _outer(adjoint, node.left))
                    else:
                        deposit(node.right, _outer(node.left, adjoint))
                else:
                    deposit(node.left, reduce_to(MatMul(adjoint, _swap(node.right)),
                                                 shape[:-1] + (left[-1],), left))
                    deposit(node.right, reduce_to(MatMul(_swap(node.left), adjoint),
                                                  shape[:-2] + (left[-1], shape[-1]), right))
            elif isinstance(node, Index):
                deposit(node.operand, self._index_adjoint(node, adjoint))
            else:
                raise BuildError(f"internal: no adjoint rule for {node!r}")

        def total(name: str) -> Any:
            parts = _merge_stacks(adjoints.pop(name))
            value = parts[0]
            for part in parts[1:]:
                value = Add(value, part)
            if isinstance(value, Ref):
                return value
            target = f"{name}_bar{tag}"
            self.steps.append(Assign(target, value))
            return Ref(target)

        for node, seed in cotangents:
            deposit(node, seed)
        for step in reversed(list(self.steps)):
            if isinstance(step, Assign):
                if step.target in adjoints:
                    deposit(step.value, total(step.target))
                continue
            z_bar = []
            for k, target in enumerate(step.targets):
                if target is None or target not in adjoints:
                    continue
                adjoint = total(target)
                if k + 1 < len(step.targets) and step.targets[k + 1] is not None:
                    z_bar.append(Mul(adjoint, Ref(step.targets[k + 1])))
                elif step.forms.derivative(k + 1) == (1 if k == 0 else 0) and k + 1 < len(step.targets):
                    if k == 0:
                        z_bar.append(adjoint)
                else:
                    raise BuildError(f"internal: σ of order {k + 1} asked for but not planned")
            for part in z_bar:
                adjoints.setdefault(step.source, []).append(part)
        gradients: dict[Path, Any] = {}
        for layer, name in enumerate(self.network.layer_names, 1):
            for leaf in ("W", "b"):
                path = (name, leaf)
                parts = parameters.get(path)
                if not parts:
                    gradients[path] = Zeros(self.network.parameter_shapes[path])
                    continue
                parts = _merge_stacks(parts)
                value = parts[0]
                for part in parts[1:]:
                    value = Add(value, part)
                if not isinstance(value, Ref):
                    target = f"g{leaf}{layer}{tag}"
                    self.steps.append(Assign(target, value))
                    value = Ref(target)
                gradients[path] = value
        return gradients

    def _index_adjoint(self, node: Index, adjoint: Any) -> Any:
        """The adjoint of `node.operand` from that of `x[..., items]`: new axes summed away,
        indexed positions scattered back (`Stack` with zeros), whole axes kept."""
        result_axes = [item for item in node.items if not isinstance(item, int) or item is None]
        # drop the new axes (size 1), rightmost first so the negative positions stay valid
        positions = [k - len(result_axes) for k, item in enumerate(result_axes) if item is None]
        if positions:
            adjoint = Sum(adjoint, tuple(positions), False)
        operand_shape = self.shape_of(node.operand)[1]
        kept = [item for item in node.items if item is not None]
        sizes = operand_shape[len(operand_shape) - len(kept):]
        for k in range(len(kept) - 1, -1, -1):
            item = kept[k]
            if isinstance(item, int) and sizes[k] == 1:
                adjoint = Index(adjoint, (None,) + (":",) * (len(kept) - 1 - k))
            elif isinstance(item, int):
                operands = [None] * sizes[k]
                operands[item] = adjoint
                adjoint = Stack(tuple(operands), k - len(kept))
        return adjoint


# ---- planning an equation tree -------------------------------------------------------------


def network_nodes(exprs: Sequence[sp.Basic]) -> list[NetworkFunction]:
    """Every `NetworkFunction` node under `exprs`, each once, in a deterministic order."""
    found = {node for node in walk(list(exprs)) if isinstance(node, NetworkFunction)}
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
    """What one application must compute, and the SymPy placeholders scalar code reads.

    `placeholders["output"]` stands for the output vector; `derivatives[(k, S)]` for the
    entry ∂_S y_k (S the sorted input directions) read by a scalar formula or a loss.
    """

    output: bool = False
    jacobian: bool = False
    hessian: bool = False
    gradient: bool = False
    placeholders: dict[str, sp.Matrix] = field(default_factory=dict)
    derivatives: dict[tuple[int, tuple[int, ...]], sp.Dummy] = field(default_factory=dict)

    @property
    def highest_entry(self) -> int:
        return max((len(directions) for _, directions in self.derivatives), default=0)

    @property
    def orders(self) -> int:
        """The highest activation derivative needed: σ'' for a Hessian, σ' for J, and one more
        than the entries read where a gradient goes back through them."""
        gradient = self.highest_entry + 1 if self.gradient else 0
        return max(2 if self.hessian else 0, 1 if self.jacobian else 0, self.highest_entry, gradient)

    def reverse_entries(self, outputs: int) -> bool:
        """Whether first-derivative entries come from the reverse rows: only first derivatives
        are read, along more input directions than the network has outputs (m passes
        instead of one per direction)."""
        directions = {d for _, ds in self.derivatives for d in ds}
        return self.highest_entry == 1 and len(directions) > outputs


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
    """One loss whose parameter gradients are asked for, and its partial derivatives (SymPy,
    placeholders substituted): per application, ∂loss/∂y (m entries) and ∂loss/∂(∂_S y_k);
    per weight the loss reads directly, ∂loss/∂ entry."""

    loss: sp.Expr
    seeds: dict[int, list[sp.Expr]]
    derivative_seeds: dict[int, dict[tuple[int, tuple[int, ...]], sp.Expr]] = field(default_factory=dict)
    weight_seeds: dict[Path, dict[tuple[int, ...], sp.Expr]] = field(default_factory=dict)

    @property
    def applications(self) -> list[int]:
        return sorted(set(self.seeds) | set(self.derivative_seeds))


@dataclass
class StructuredPlan:
    """An equation tree read for a structured build: applications, needs, leaves, losses."""

    network: StructuredNetwork
    applications: list[Application]
    needs: list[Needs]
    leaves: list[LeafPlan]
    treedef: Any
    groups: list[GradientGroup]
    #: entries of the network's weights read by formulas (a penalty), as placeholders
    weights: dict[sp.Basic, sp.Dummy] = field(default_factory=dict)

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
        if network_nodes(node.inputs):
            raise BuildError(f"eqs{where}: a network applied to a network output is not supported")
        return application_index(Application(network, node.inputs))

    weights: dict[sp.Basic, sp.Dummy] = {}

    def substitute(expr: sp.Basic, where: str) -> sp.Basic:
        """Network nodes and weight entries → placeholder symbols (entries of arrays computed
        at array level, entries of parameters)."""
        m = network.net.output_dim
        mapping: dict[sp.Basic, sp.Basic] = {}
        for node in network_nodes([expr]):
            a = check(node, where)
            need, suffix = needs[a], f"{a + 1}"
            k, directions = node.output_index, node.derivative_indices
            if node.order == 0:
                need.output = True
                mapping[node] = _placeholder(need, "output", (m, 1), f"y{suffix}")[k, 0]
            else:
                if (k, directions) not in need.derivatives:
                    need.derivatives[(k, directions)] = sp.Dummy(
                        f"d{suffix}_{k}_{'_'.join(map(str, directions))}")
                mapping[node] = need.derivatives[(k, directions)]
        for entry in _weight_entries(expr, network, where):
            mapping[entry] = weights.setdefault(entry, sp.Dummy(f"w_{entry}"))
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
                groups.append(_gradient_group(leaf.loss, network, check, substitute, where))
                for a in groups[-1].applications:
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
    return StructuredPlan(network, applications, needs, leaves, treedef, groups, weights)


def _weight_entries(expr: sp.Basic, network: StructuredNetwork, where: str) -> list[sp.Basic]:
    """The entries `W[i, j]` of the network's weights that `expr` reads (a penalty)."""
    if not expr.free_symbols & network.parameter_symbols:  # an entry's symbols hold its matrix
        return []
    entries, whole, seen = set(), set(), set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if isinstance(node, MatrixElement) and node.parent in network.parameter_symbols:
            entries.add(node)
            continue
        if node in network.parameter_symbols:
            whole.add(str(node))
        stack.extend(node.args)
    if whole:
        raise BuildError(f"eqs{where}: {sorted(whole)} read as a whole matrix; write a formula of "
                         "the network's weights over their entries, e.g. sum(e**2 for e in sp.Matrix(W))")
    return sorted(entries, key=sp.default_sort_key)


def _gradient_group(loss: sp.Expr, network: StructuredNetwork, check: Any, substitute: Any,
                    where: str) -> GradientGroup:
    """The partial derivatives of `loss` w.r.t. every network quantity and weight entry it
    reads (SymPy), placeholders in.

    ∂loss/∂W = Σ_applications Σ_q (∂loss/∂q) ∂q/∂W over the quantities q read (outputs y_k,
    entries ∂_S y_k), + ∂loss/∂W read directly: the scalar factors are SymPy's, the sum over q
    is one reverse pass over the application's array program seeded with them.
    """
    nodes = network_nodes([loss])
    entries = _weight_entries(loss, network, where)
    if not nodes and not entries:
        raise BuildError(f"eqs{where}: the loss does not depend on the network")
    substitute(loss, where)  # every quantity the loss reads is computed, even where ∂loss/∂q is constant
    paths = {matrix: (name, leaf) for name, tree in network.params.items()
             for leaf, matrix in tree.items()}
    mapping: dict[sp.Basic, sp.Dummy] = {}
    keys: dict[sp.Dummy, tuple] = {}
    for node in nodes:
        a = check(node, where)
        symbol = sp.Dummy(f"o{a}_{node.output_index}")
        mapping[node] = symbol
        keys[symbol] = (a, node.output_index, node.derivative_indices)
    for entry in entries:
        symbol = sp.Dummy(f"p_{entry}")
        mapping[entry] = symbol
        keys[symbol] = (paths[entry.parent], (int(entry.i), int(entry.j)))
    reduced = loss.xreplace(mapping)
    back = {symbol: node for node, symbol in mapping.items()}
    group = GradientGroup(loss, {})
    m = network.net.output_dim
    for symbol, key in keys.items():
        partial = substitute(_diff(reduced, symbol).xreplace(back), where)
        if len(key) == 2:
            path, (i, j) = key
            index = (i, j) if path[1] == "W" else (i,)
            group.weight_seeds.setdefault(path, {})[index] = partial
        elif not key[2]:
            group.seeds.setdefault(key[0], [sp.S.Zero] * m)[key[1]] = partial
        elif partial != 0:
            group.derivative_seeds.setdefault(key[0], {})[(key[1], key[2])] = partial
    return group


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

