"""Every model of `sympy.physics.mechanics.models`, as a scalar kernel and as its solved
right-hand side, with XLA's program and with the C loop and C solve, against lambdify's
NumPy functions in float64 and NumPy's solve.

The models are found by walking the module, so a model SymPy adds is built here too (one
with arguments this file does not know is a failure, not a skip).
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import sympy as sp
import sympy.physics.mechanics.models as models
from sympy.core.function import AppliedUndef

import symkern as sk
from symkern.kernels import c_loop as loops

#: the keyword arguments each model is built with (its every option on, at two sizes)
ARGUMENTS = {
    "multi_mass_spring_damper": [{"n": 1}, {"n": 3, "apply_gravity": True,
                                            "apply_external_forces": True}],
    "n_link_pendulum_on_cart": [{"n": 1}, {"n": 2, "cart_force": True, "joint_torques": True}],
}
MODELS = sorted(name for name, f in inspect.getmembers(models, inspect.isfunction)
                if f.__module__ == models.__name__)
FORMS = ["xla", "c"]


def test_every_model_of_the_module_is_built_here():
    assert MODELS and set(MODELS) == set(ARGUMENTS)


def _equations(name: str, arguments: dict) -> tuple[sp.Matrix, sp.Matrix, list, list]:
    """The model's mass_matrix_full and forcing_full with its coordinates, speeds and
    specified inputs (functions of time) as plain symbols; the states and the constants."""
    kane = getattr(models, name)(**arguments)
    t = sp.Symbol("t")
    q, u = list(kane.q), list(kane.u)
    mass, forcing = kane.mass_matrix_full, kane.forcing_full
    functions = sorted((mass.atoms(AppliedUndef) | forcing.atoms(AppliedUndef))
                       - set(q) - set(u), key=sp.default_sort_key)
    plain = {f: sp.Symbol(f"s{k}") for k, f in enumerate([*q, *u, *functions])}
    mapping = {c.diff(t): plain[v] for c, v in zip(q, u, strict=True)}
    mapping.update(plain)
    mass, forcing = mass.xreplace(mapping), forcing.xreplace(mapping)
    states = [plain[c] for c in [*q, *u, *functions]]
    constants = sorted((mass.free_symbols | forcing.free_symbols) - set(states) - {t},
                       key=lambda s: s.name)
    return mass, forcing, states, constants


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize(("name", "arguments"), [
    # the first (smallest) arguments of each model in the long run (`SYMKERN_SLOW=1`) only
    pytest.param(name, a, marks=[pytest.mark.slow] if k == 0 else [])
    for name in sorted(ARGUMENTS) for k, a in enumerate(ARGUMENTS[name])])
def test_a_model_and_its_solved_right_hand_side(name, arguments, form):
    if form == "c" and loops.compiler() is None:
        pytest.skip("cpu_loop='c' needs a C++ compiler")
    mass, forcing, states, constants = _equations(name, arguments)
    options = sk.BuildOptions(cpu_loop=form)
    rng = np.random.default_rng(len(states))
    X = rng.uniform(-1.5, 1.5, (37, len(states)))
    values = {s.name: rng.uniform(0.5, 1.5) for s in constants}
    ps = {s.name: s for s in constants}
    args = [X[:, k] for k in range(len(states))] + [values[s.name] for s in constants]
    entries = sp.lambdify(states + constants, list(mass) + list(forcing), modules="numpy")(*args)
    size = mass.rows
    want_mass = np.stack([np.broadcast_to(e, (37,)) for e in entries[:size * size]], -1)
    want_forcing = np.stack([np.broadcast_to(e, (37,)) for e in entries[size * size:]], -1)

    kernel = sk.build_function({"M": mass, "f": forcing}, states, params=ps, dtype="float64",
                               options=options)
    got = kernel(X, values)
    np.testing.assert_allclose(np.asarray(got["M"]).reshape(37, -1), want_mass,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got["f"]).reshape(37, -1), want_forcing,
                               rtol=1e-12, atol=1e-12)

    solved = sk.build_function(
        sp.MatMul(sp.Inverse(sp.ImmutableMatrix(mass)), sp.ImmutableMatrix(forcing)), states,
        params=ps, dtype="float64", options=options)
    want = np.linalg.solve(want_mass.reshape(37, size, size), want_forcing[..., None])[..., 0]
    np.testing.assert_allclose(np.asarray(solved(X, values)).reshape(37, -1), want,
                               rtol=1e-9, atol=1e-9)
