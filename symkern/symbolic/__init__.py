"""symbolic: symbolic neural networks, their parameters, and symbolic derivatives.

Re-exports only; the modules import sympy, numpy, jax and symkern.errors, nothing upward.
"""

from symkern.symbolic.derivatives import gradient, hessian, jacobian, parameter_gradient
from symkern.symbolic.networks import (
    ACTIVATIONS,
    Activation,
    Chain,
    Dense,
    Linear,
    SymbolicNetwork,
)

__all__ = [
    "ACTIVATIONS",
    "Activation",
    "Chain",
    "Dense",
    "Linear",
    "SymbolicNetwork",
    "gradient",
    "hessian",
    "jacobian",
    "parameter_gradient",
]
