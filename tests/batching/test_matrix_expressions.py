"""Matrix and array expressions stay array operations: each against a float64 reference.

Every operation is built once and evaluated over the batch shapes (), 1, 5 and (2, 3), and
at batch 5 along every call path (eager, jax.jit, jax.vmap, jax.grad w.r.t. data and
parameters, bind, flat, export/load). References are written with jax.numpy in float64
(so that the gradients have references too); the forms of the kernel source are checked
where they are the point (one matrix product, a const arg, no entry written out).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sympy.codegen.matrix_nodes import MatrixSolve
from sympy.matrices.expressions.hadamard import HadamardPower
from sympy.matrices.expressions.matexpr import MatrixElement
from sympy.tensor.array.expressions import (
    ArrayAdd,
    ArrayContraction,
    ArrayDiagonal,
    ArrayTensorProduct,
    PermuteDims,
)

import symkern as sk
from symkern.codegen.arrays import check_batch_polymorphic
from symkern.errors import CodegenDriftError

N = 3
A, B = sp.MatrixSymbol("A", N, N), sp.MatrixSymbol("B", N, N)
W, U = sp.MatrixSymbol("W", N, N), sp.MatrixSymbol("U", N, N)
x, y = sp.MatrixSymbol("x", N, 1), sp.MatrixSymbol("y", N, 1)
b, r = sp.MatrixSymbol("b", N, 1), sp.MatrixSymbol("r", 1, N)
a, c = sp.symbols("a c")
NUMERIC = np.array([[1.5, -2.0, 0.5], [0.25, 3.0, -1.0], [2.0, 0.0, 1.0], [-0.5, 1.0, 4.0]])


@dataclass(frozen=True)
class Case:
    """An operation: its equations, data arguments and parameters, and a jnp reference."""

    eqs: Any
    data: tuple[Any, ...]
    data_shapes: tuple[tuple[int, ...], ...]
    params: dict[str, Any]
    reference: Callable[..., Any]
    #: data arguments that are square matrices solved against or inverted
    invertible: tuple[int, ...] = ()


def _t(m):
    return jnp.swapaxes(m, -1, -2)


def _col(v):
    return v[..., :, None]


CASES: dict[str, Case] = {
    "matmul_add": Case(W * x + b, (x,), ((N,),), {"W": W, "b": b},
                       lambda X, ps: (ps["W"] @ _col(X))[..., 0] + ps["b"]),
    "scalar_factor": Case(a * W * x + c * b, (x, a), ((N,), ()), {"W": W, "b": b, "c": c},
                          lambda X, s, ps: s[..., None] * (X @ ps["W"].T) + ps["c"] * ps["b"]),
    "transpose": Case(A.T * W * x, (A, x), ((N, N), (N,)), {"W": W},
                      lambda M, X, ps: (_t(M) @ ps["W"] @ _col(X))[..., 0]),
    "row_vector": Case(r * A, (r, A), ((N,), (N, N)), {},
                       lambda R, M, ps: R[..., None, :] @ M),
    "solve": Case(MatrixSolve(A, x), (A, x), ((N, N), (N,)), {},
                  lambda M, X, ps: jnp.linalg.solve(M, _col(X))[..., 0], (0,)),
    "inverse": Case(sp.Inverse(A) + W, (A,), ((N, N),), {"W": W},
                    lambda M, ps: jnp.linalg.inv(M) + ps["W"], (0,)),
    "inverse_times": Case(A.inv() * x, (A, x), ((N, N), (N,)), {},
                          lambda M, X, ps: jnp.linalg.solve(M, _col(X))[..., 0], (0,)),
    "determinant": Case(sp.Determinant(A) * a, (A, a), ((N, N), ()), {},
                        lambda M, s, ps: jnp.linalg.det(M) * s, (0,)),
    "trace": Case(sp.Trace(A * W) + sp.sin(a), (A, a), ((N, N), ()), {"W": W},
                  lambda M, s, ps: jnp.trace(M @ ps["W"], axis1=-2, axis2=-1) + jnp.sin(s)),
    "matpow": Case(A**3, (A,), ((N, N),), {}, lambda M, ps: M @ M @ M),
    "hadamard": Case(sp.HadamardProduct(A, W) + HadamardPower(A, 2), (A,), ((N, N),),
                     {"W": W}, lambda M, ps: M * ps["W"] + M**2),
    "kronecker": Case(sp.KroneckerProduct(A, W), (A,), ((N, N),), {"W": W},
                      lambda M, ps: jnp.einsum("...ij,kl->...ikjl", M, ps["W"]).reshape(
                          M.shape[:-2] + (N * N, N * N))),
    "block": Case(sp.BlockMatrix([[A, W], [sp.ZeroMatrix(N, N), sp.Identity(N)]]), (A,),
                  ((N, N),), {"W": W},
                  lambda M, ps: jnp.concatenate([
                      jnp.concatenate([M, jnp.broadcast_to(ps["W"], M.shape)], -1),
                      jnp.broadcast_to(jnp.concatenate([jnp.zeros((N, N)), jnp.eye(N)], -1),
                                       M.shape[:-2] + (N, 2 * N))], -2)),
    "special_matrices": Case(sp.Identity(N) * x + sp.OneMatrix(N, 1) * a, (x, a),
                             ((N,), ()), {}, lambda X, s, ps: X + s[..., None]),
    "elementwise": Case(A.applyfunc(sp.sin) * x, (A, x), ((N, N), (N,)), {},
                        lambda M, X, ps: (jnp.sin(M) @ _col(X))[..., 0]),
    "dot": Case(sp.DotProduct(x, y) + 1, (x, y), ((N,), (N,)), {},
                lambda X, Y, ps: jnp.sum(X * Y, -1) + 1),
    "element": Case(MatrixElement(A * W, 0, 1) ** 2, (A,), ((N, N),), {"W": W},
                    lambda M, ps: (M @ ps["W"])[..., 0, 1] ** 2),
    "numeric_matrix": Case(sp.Matrix(NUMERIC) * x, (x,), ((N,),), {},
                           lambda X, ps: X @ jnp.asarray(NUMERIC).T),
    "explicit_matrix": Case(sp.Matrix([[a, 1, 0], [0, sp.cos(a), 0], [1, 0, a**2]]) * W * x,
                            (x, a), ((N,), ()), {"W": W},
                            lambda X, s, ps: (jnp.stack([
                                jnp.stack([s, jnp.ones_like(s), jnp.zeros_like(s)], -1),
                                jnp.stack([jnp.zeros_like(s), jnp.cos(s), jnp.zeros_like(s)], -1),
                                jnp.stack([jnp.ones_like(s), jnp.zeros_like(s), s**2], -1)], -2)
                                @ ps["W"] @ _col(X))[..., 0]),
    "contraction": Case(ArrayContraction(ArrayTensorProduct(A, W), (1, 2)), (A,), ((N, N),),
                        {"W": W}, lambda M, ps: M @ ps["W"]),
    "tensor_product": Case(PermuteDims(ArrayTensorProduct(A, x), [2, 0, 1, 3]), (A, x),
                           ((N, N), (N,)), {},
                           lambda M, X, ps: jnp.einsum("...ij,...k->...kij", M, X)[..., None]),
    "diagonal_add": Case(ArrayAdd(ArrayDiagonal(ArrayTensorProduct(A, W), (1, 2)),
                                  ArrayDiagonal(ArrayTensorProduct(W, A), (0, 3))),
                         (A,), ((N, N),), {"W": W},
                         lambda M, ps: jnp.einsum("...ij,jk->...ikj", M, ps["W"])
                         + jnp.einsum("ij,...ki->...jki", ps["W"], M)),
    "derivative": Case((x.T * W * x).diff(x), (x,), ((N,),), {"W": W},
                       lambda X, ps: X @ ps["W"].T + X @ ps["W"]),
    "list_argument": Case(W * sp.Matrix(sp.symbols("q0:3")) + sp.Matrix([c, 2 * c, 1]),
                          (list(sp.symbols("q0:3")), c), ((N,), ()), {"W": W},
                          lambda X, s, ps: X @ ps["W"].T + jnp.stack(
                              [s, 2 * s, jnp.ones_like(s)], -1)),
    "as_explicit_part": Case(W * x.as_explicit() + (a * b).as_explicit(), (x, a), ((N,), ()),
                             {"W": W, "b": b},
                             lambda X, s, ps: X @ ps["W"].T + s[..., None] * ps["b"]),
    # SymPy's array calculus: PermuteDims(ArrayTensorProduct(I, x), (1 2)), δ_ac x_b
    "matrix_derivative": Case((W * x).diff(W), (x,), ((N,),), {},
                              lambda X, ps: jnp.einsum("ac,...b->...abc", jnp.eye(N), X)[..., None]),
    "mixed_leaves": Case({"y": W * x, "s": a**2, "v": sp.Matrix([a, 2 * a]),
                          "t": sp.Array([[a, a**2], [1, a]])}, (x, a),
                         ((N,), ()), {"W": W},
                         lambda X, s, ps: {"y": X @ ps["W"].T, "s": s**2,
                                           "v": jnp.stack([s, 2 * s], -1),
                                           "t": jnp.stack([jnp.stack([s, s**2], -1),
                                                           jnp.stack([jnp.ones_like(s), s], -1)],
                                                          -2)}),
}


def _kalman():
    n, m = 6, 3
    P, H, R = sp.MatrixSymbol("P", n, n), sp.MatrixSymbol("H", m, n), sp.MatrixSymbol("R", m, m)
    xs, z = sp.MatrixSymbol("x", n, 1), sp.MatrixSymbol("z", m, 1)
    K = P * H.T * (H * P * H.T + R).inv()
    eqs = [xs + K * (z - H * xs), (sp.Identity(n) - K * H) * P]

    def reference(X, Z, Pv, Hv, Rv, ps):
        K = Pv @ _t(Hv) @ jnp.linalg.inv(Hv @ Pv @ _t(Hv) + Rv)
        return [X + (K @ (_col(Z) - Hv @ _col(X)))[..., 0], (jnp.eye(n) - K @ Hv) @ Pv]

    return Case(eqs, (xs, z, P, H, R), ((n,), (m,), (n, n), (m, n), (m, m)), {}, reference,
                (2, 4))


CASES["kalman"] = _kalman()


@functools.cache
def kernel_of(name: str) -> sk.Kernel:
    case = CASES[name]
    return sk.build_function(case.eqs, *case.data, params=case.params or None, dtype="float64")


def _values(name: str, batch: tuple[int, ...], seed: int = 0) -> tuple[tuple, Any]:
    case = CASES[name]
    rng = np.random.default_rng(seed)
    data = []
    for k, shape in enumerate(case.data_shapes):
        value = rng.uniform(-1, 1, batch + shape)
        if k in case.invertible:
            value = value + 3 * np.eye(shape[-1])  # diagonally dominant: well conditioned
        data.append(value)
    ps = {}
    for key, symbol in case.params.items():
        shape = tuple(int(d) for d in symbol.shape) if isinstance(symbol, sp.MatrixSymbol) else ()
        if len(shape) == 2 and shape[1] == 1:
            shape = shape[:1]
        ps[key] = rng.uniform(-1, 1, shape)
    return tuple(data), ps


def _call(kernel, data, ps):
    return kernel(*data, ps) if ps else kernel(*data)


def _total(tree):
    return sum(jnp.sum(leaf) for leaf in jax.tree_util.tree_leaves(tree))


_REFERENCES: dict[str, Any] = {}


def reference_of(name: str) -> Any:
    """The case's reference as one jitted program of (data, parameters): a call compiles it
    once per shape, where its operations run one by one compile each of them at each shape."""
    if name not in _REFERENCES:
        ref = CASES[name].reference
        _REFERENCES[name] = jax.jit(lambda d, p: ref(*(jnp.asarray(v, jnp.float64) for v in d),
                                                   {key: jnp.asarray(v) for key, v in p.items()}))
    return _REFERENCES[name]


def run_path(name: str, path: str, data: tuple, ps: dict) -> tuple[Any, Any]:
    """(what symkern computed, what the reference computes) along `path`."""
    k, jitted = kernel_of(name), reference_of(name)

    def reference(*d, p=ps):
        return jitted(d, p)

    if path == "eager":
        return _call(k, data, ps), reference(*data)
    if path == "jit":
        return jax.jit(lambda d, p: _call(k, d, p))(data, ps), reference(*data)
    if path == "vmap":
        return jax.vmap(lambda *d: _call(k, d, ps))(*data), jax.vmap(reference)(*data)
    if path == "grad_data":
        first = jnp.asarray(data[0])
        return (jax.grad(lambda d: _total(_call(k, (d, *data[1:]), ps)))(first),
                jax.grad(lambda d: _total(reference(d, *data[1:])))(first))
    if path == "grad_params":
        wide = {key: jnp.asarray(v) for key, v in ps.items()}
        return (jax.grad(lambda p: _total(k(*data, p)))(wide),
                jax.grad(lambda p: _total(jitted(data, p)))(wide))
    if path == "bind":
        return k.bind(ps)(*data), reference(*data)
    if path == "flat":
        return k.flat()(*data, k.flatten(ps)), reference(*data)
    if path == "shard":
        return _call(k.shard(), data, ps), reference(*data)
    if path == "stream":
        chunks = list(k.stream(tuple(data) if len(data) > 1 else data[0], ps or None, chunk=2,
                               progress=False))
        return (jax.tree_util.tree_map(lambda *parts: np.concatenate(parts), *chunks),
                reference(*data))
    if path == "export":
        loaded = sk.load(k.export(*data, ps) if ps else k.export(*data), k.const_args)
        return _call(loaded, data, ps), reference(*data)
    raise AssertionError(path)


def assert_close(got: Any, want: Any, rtol: float = 1e-10) -> None:
    got_leaves, want_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(got_leaves, want_leaves, strict=True):
        w = np.asarray(w, np.float64)
        assert np.shape(g) == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol,
                                   atol=rtol * max(1.0, float(np.abs(w).max(initial=0.0))))


#: the bounded run: every operation on a 2-D batch, the operations below at one sample and
#: along every call path (a product on rows, a solve, a scalar of a matrix, a block
#: matrix, a scalar and a Matrix leaf beside a matrix one, an explicit Matrix of scalar
#: formulas); SYMKERN_SLOW=1 runs the whole matrix (each compile of a linear-algebra
#: kernel or reference in float64 took 0.3-1 s on a shared core)
REPRESENTATIVE = ("matmul_add", "solve", "trace", "block", "mixed_leaves", "explicit_matrix")
PATHS = ("jit", "vmap", "grad_data", "grad_params", "bind", "flat", "shard", "stream", "export")


def _bounded(values, keep):
    return [value if keep(value) else pytest.param(*value, marks=pytest.mark.slow)
            for value in values]


@pytest.mark.parametrize(("name", "batch"), _bounded(
    [(name, batch) for name in sorted(CASES) for batch in [(), (1,), (5,), (2, 3)]],
    lambda value: value[1] == (2, 3) or (value[1] == () and value[0] in REPRESENTATIVE)),
    ids=str)
def test_each_operation_over_each_batch_shape_matches_the_reference(name, batch):
    data, ps = _values(name, batch)
    assert_close(*run_path(name, "eager", data, ps))


@pytest.mark.parametrize(("name", "path"), _bounded(
    [(name, path) for name in sorted(CASES) for path in PATHS],
    lambda value: value[0] in REPRESENTATIVE), ids=str)
def test_each_operation_along_each_call_path_matches_the_reference(name, path):
    if path in ("grad_params", "bind", "flat") and not CASES[name].params:
        pytest.skip("no parameters")
    data, ps = _values(name, (5,))
    assert_close(*run_path(name, path, data, ps))


@pytest.mark.parametrize("path", ["jit", "vmap", "grad_data", "export"])
@pytest.mark.parametrize("name", ["matmul_add", "trace",
                                  pytest.param("kalman", marks=pytest.mark.slow)])
def test_a_two_dimensional_batch_goes_through_the_call_paths(name, path):
    data, ps = _values(name, (2, 3))
    assert_close(*run_path(name, path, data, ps))


def test_matrix_product_is_one_product_in_the_source():
    n = 64
    Wn, xn, bn = sp.MatrixSymbol("W", n, n), sp.MatrixSymbol("x", n, 1), sp.MatrixSymbol("b", n, 1)
    kernel = sk.build_function(Wn * xn + bn, xn, params={"W": Wn, "b": bn}, dtype="float64")
    assert kernel.source.count("@") == 1
    assert len(kernel.source.splitlines()) == 2
    # x @ W.T + b on the batch of vectors, no entry read, no axis of one added
    assert "return x1 @ jnp.swapaxes(ps['W'], -1, -2) + ps['b']," in kernel.source


def test_a_transpose_swaps_the_last_two_axes():
    source = sk.build_function(A.T * W, A, params={"W": W}).source
    assert "jnp.swapaxes(x1, -1, -2) @ ps['W']" in source and ".T" not in source
    # a column product with a factor read from the data is printed on rows: xᵀ Wᵀ A
    assert "x2[..., None, :] @ jnp.swapaxes(ps['W'], -1, -2) @ x1" in kernel_of("transpose").source


def test_a_numeric_matrix_is_a_const_arg_and_the_hlo_does_not_grow_with_it():
    v = sp.MatrixSymbol("v", 4, 1)
    sizes = {}
    for rows in (4, 4096):
        values = np.random.default_rng(rows).uniform(-1, 1, (rows, 4))
        kernel = sk.build_function(sp.Matrix(values) * v, v, dtype="float64")
        assert [c.value.shape for c in kernel.const_args] == [(rows, 4)]
        X = np.random.default_rng(0).uniform(-1, 1, (3, 4))
        np.testing.assert_allclose(kernel(X), X @ values.T, rtol=1e-12)
        sizes[rows] = len(kernel.hlo(X))
    assert sizes[4096] <= 1.1 * sizes[4]


def test_a_small_numeric_matrix_stays_embedded():
    v = sp.MatrixSymbol("v", 2, 1)
    kernel = sk.build_function(sp.Matrix([[1.0, 2.0], [3.0, 4.0]]) * v, v, dtype="float64")
    assert kernel.const_args == () and "jnp.array([[1.0, 2.0], [3.0, 4.0]]" in kernel.source
    np.testing.assert_allclose(kernel(np.array([1.0, 1.0])), [3.0, 7.0])


def test_a_shared_subexpression_is_computed_once():
    source = kernel_of("kalman").source
    # S = H P Hᵀ + R once (R is x5), solved against at each use of its inverse
    body = source.split("\n", 1)[1]
    assert body.count("x5") == 1 and body.count("jnp.linalg.inv(") == 1
    gain = next(line.split(" = ")[0].strip() for line in body.splitlines() if "jnp.linalg.inv(" in line)
    assert body.count(f"@ {gain}") == 1  # K = P Hᵀ S⁻¹ once, for both outputs


def test_a_matrix_symbol_neither_data_nor_parameter_is_a_build_error():
    with pytest.raises(sk.BuildError, match="W: a MatrixSymbol that is neither"):
        sk.build_function(W * x, x)


def test_a_symbolic_matrix_power_is_a_build_error():
    with pytest.raises(sk.BuildError, match="integer exponent"):
        sk.build_function(sp.MatPow(A, a), A, a)


def test_an_unsupported_matrix_operation_is_a_build_error_naming_it():
    from sympy.matrices.expressions.factorizations import LofLU

    with pytest.raises(sk.BuildError, match="LofLU"):
        sk.build_function(LofLU(A) * x, A, x)


def test_a_derivative_sympy_leaves_unevaluated_is_a_build_error():
    leaves = r"SymPy leaves the derivative Derivative\(Determinant\(A\), A\) unevaluated"
    with pytest.raises(sk.BuildError, match=leaves):
        sk.build_function(sp.Determinant(A).diff(A) * a, A, a)


def test_the_rule_rejects_a_whole_vector_and_a_batch_index():
    import ast

    for source in ("def kernel(x1):\n    return x1 @ x1,", "def kernel(x1):\n    return x1[0],",
                   "def kernel(x1):\n    return jnp.sum(x1, axis=0),",
                   "def kernel(x1):\n    return jnp.sum(x1),", "def kernel(x1):\n    return x1.T,"):
        module = ast.parse(source)
        with pytest.raises(CodegenDriftError, match="check_batch_polymorphic"):
            check_batch_polymorphic(module, {"x1": 1 if "@" in source else 2})
    accepted = ast.parse("def kernel(x1):\n    return jnp.linalg.solve(x1, x1) @ x1,")
    assert check_batch_polymorphic(accepted, {"x1": 2}) is accepted


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 4), inner=st.integers(1, 4), cols=st.integers(1, 4),
       batch=st.sampled_from([(), (2,), (2, 3)]), seed=st.integers(0, 2**16))
def test_random_shapes_of_a_product_plus_a_transpose_match_numpy(rows, inner, cols, batch, seed):
    P, Q, S = (sp.MatrixSymbol("P", rows, inner), sp.MatrixSymbol("Q", inner, cols),
               sp.MatrixSymbol("S", cols, rows))
    kernel = sk.build_function(P * Q + 2 * S.T, P, params={"Q": Q, "S": S}, dtype="float64")
    rng = np.random.default_rng(seed)
    Pv = rng.uniform(-1, 1, batch + (rows, inner))
    Qv, Sv = rng.uniform(-1, 1, (inner, cols)), rng.uniform(-1, 1, (cols, rows))
    want = Pv @ Qv + 2 * Sv.T
    if cols == 1:
        want = want[..., 0]
    if inner == 1 and rows != 1:
        Pv = Pv[..., 0]  # a column MatrixSymbol is passed as (..., rows)
    elif rows == 1:
        Pv = Pv[..., 0, :]  # a row data argument is passed as (..., inner)
    assert_close(kernel(Pv, {"Q": Qv.reshape(sk_shape(Q)), "S": Sv.reshape(sk_shape(S))}), want)


def sk_shape(symbol: sp.MatrixSymbol) -> tuple[int, ...]:
    rows, cols = (int(d) for d in symbol.shape)
    return (rows,) if cols == 1 else (rows, cols)


@settings(max_examples=6, deadline=None)
@given(n=st.integers(1, 4), batch=st.sampled_from([(), (3,), (2, 2)]), seed=st.integers(0, 2**16))
def test_random_sizes_of_solve_inverse_and_determinant_match_numpy(n, batch, seed):
    M, v = sp.MatrixSymbol("M", n, n), sp.MatrixSymbol("v", n, 1)
    kernel = sk.build_function([MatrixSolve(M, v), M.inv(), sp.Determinant(M)], M, v,
                               dtype="float64")
    rng = np.random.default_rng(seed)
    Ms = rng.uniform(-1, 1, batch + (n, n)) + 2 * n * np.eye(n)
    vs = rng.uniform(-1, 1, batch + (n,))
    solved, inverse, determinant = kernel(Ms, vs)
    assert_close(solved, np.linalg.solve(Ms, vs[..., None])[..., 0])
    want = np.linalg.inv(Ms)
    assert_close(inverse, want[..., 0] if n == 1 else want)  # a 1×1 matrix is a column
    assert_close(determinant, np.linalg.det(Ms))


def test_a_saved_array_kernel_loads_as_one_file(tmp_path):
    kernel = kernel_of("numeric_matrix")
    path = tmp_path / "numeric.symkern"
    kernel.save(path)
    data, _ = _values("numeric_matrix", (4,))
    assert_close(sk.load(path)(*data), kernel(*data), rtol=0)


def test_user_functions_inside_a_matrix_expression_are_a_build_error():
    with pytest.raises(sk.BuildError, match="functions: user functions are not available"):
        sk.build_function(W * x, x, params={"W": W}, functions={"f": jnp.sin})
