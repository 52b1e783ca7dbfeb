"""lambdify's ways of supplying implementations, on build_function's functions=."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy as sp
from sympy.utilities.lambdify import implemented_function

import symkern as sk

jax.config.update("jax_enable_x64", True)

x, y = sp.symbols("x y")


@pytest.mark.parametrize("cse", [True, False], ids=["cse", "nocse"])
def test_functions_replaces_a_sympy_function_like_a_lambdify_modules_dict(cse):
    # lambdify(x, expr, modules=[{"sin": my_sin}, "jax"]) is functions={"sin": my_sin}
    def my_sin(v):
        return 2 * v

    expr = sp.sin(sp.sin(x)) * y + sp.cos(x)
    kernel = sk.build_function(expr, [x, y], functions={"sin": my_sin}, cse=cse, dtype="float64")
    data = np.array([[0.5, 2.0], [-1.0, 0.5]])
    expected = 4 * data[:, 0] * data[:, 1] + np.cos(data[:, 0])
    np.testing.assert_allclose(kernel(data), expected, rtol=1e-15)
    reference = sp.lambdify([x, y], expr, modules=[{"sin": my_sin}, "numpy"])
    np.testing.assert_allclose(kernel(data), reference(data[:, 0], data[:, 1]), rtol=1e-15)
    gradient = jax.grad(lambda v: kernel(v))(data[0])
    np.testing.assert_allclose(gradient, [4 * 2.0 - np.sin(0.5), 4 * 0.5], rtol=1e-15)


def test_implemented_function_brings_its_implementation():
    f = implemented_function("f", lambda v: jnp.exp(-v * v))
    kernel = sk.build_function(f(x) + 1, x, dtype="float64")
    np.testing.assert_allclose(kernel(np.array([0.0, 1.0])), [2.0, 1 + np.exp(-1.0)],
                               rtol=1e-15)
    # functions= takes precedence over the attached implementation
    kernel = sk.build_function(f(x), x, functions={"f": jnp.cos}, dtype="float64")
    np.testing.assert_allclose(kernel(np.array([1.0])), [np.cos(1.0)], rtol=1e-15)


@pytest.mark.parametrize("implementation", [lambda v: math.sin(v), lambda v: math.exp(-v)],
                         ids=["math.sin", "math.exp"])
def test_an_implementation_written_with_math_is_a_build_error_naming_it(implementation):
    f = implemented_function("g", implementation)
    with pytest.raises(sk.BuildError, match=r'functions\["g"\]: .*write it with jax.numpy'):
        sk.build_function(f(x), x, dtype="float64")
