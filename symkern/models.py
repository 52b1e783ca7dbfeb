"""symbolic: small physical models used by the demo, the examples and the benchmarks.

Imports sympy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp


@dataclass(frozen=True)
class DoublePendulum:
    """The equation of motion of a planar double pendulum with point masses.

    `state` is (θ1, θ2, ω1, ω2); `params` maps m1, m2, l1, l2, g to their symbols;
    `rhs` is d(state)/dt, a 4×1 Matrix derived from the Lagrangian by symkern's own
    SymPy code (no hand-written formula), so it is an honest mid-sized expression.
    """

    state: sp.Matrix
    params: dict[str, sp.Symbol]
    rhs: sp.Matrix


def double_pendulum() -> DoublePendulum:
    """Build the double pendulum's equations of motion.

    >>> model = double_pendulum()
    >>> model.rhs.shape, sorted(model.params)
    ((4, 1), ['g', 'l1', 'l2', 'm1', 'm2'])
    """
    t = sp.Symbol("t")
    m1, m2, l1, l2, g = sp.symbols("m1 m2 l1 l2 g", positive=True)
    th1, th2 = (sp.Function(name)(t) for name in ("theta1", "theta2"))
    x1, y1 = l1 * sp.sin(th1), -l1 * sp.cos(th1)
    x2, y2 = x1 + l2 * sp.sin(th2), y1 - l2 * sp.cos(th2)
    kinetic = (m1 * (x1.diff(t) ** 2 + y1.diff(t) ** 2)
               + m2 * (x2.diff(t) ** 2 + y2.diff(t) ** 2)) / 2
    potential = g * (m1 * y1 + m2 * y2)
    lagrangian = kinetic - potential
    q = [th1, th2]
    qd = [c.diff(t) for c in q]
    qdd = [c.diff(t) for c in qd]
    equations = [sp.diff(lagrangian.diff(v), t) - lagrangian.diff(c) for c, v in zip(q, qd, strict=True)]
    mass = sp.Matrix(2, 2, lambda i, j: equations[i].diff(qdd[j]))
    forcing = -sp.Matrix(equations).subs({a: 0 for a in qdd})
    accelerations = mass.LUsolve(forcing)
    theta1, theta2, omega1, omega2 = sp.symbols("theta1 theta2 omega1 omega2")
    plain = {qd[0]: omega1, qd[1]: omega2}
    plain_q = {th1: theta1, th2: theta2}
    accelerations = accelerations.subs(plain).subs(plain_q)
    rhs = sp.Matrix([omega1, omega2, accelerations[0], accelerations[1]])
    return DoublePendulum(
        sp.Matrix([theta1, theta2, omega1, omega2]),
        {"m1": m1, "m2": m2, "l1": l1, "l2": l2, "g": g},
        rhs,
    )
