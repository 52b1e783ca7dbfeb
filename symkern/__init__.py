"""symkern: SymPy equations and symbolic neural networks compiled to batched XLA kernels."""

from symkern.batching.build import build_function
from symkern.batching.kernel import BoundKernel, Kernel
from symkern.errors import (
    ArgumentError,
    BuildError,
    CodegenDriftError,
    ConstArgsError,
    DtypeMismatchError,
    SymkernError,
    UnsupportedFunctionError,
)

__version__ = "0.1.0"

__all__ = [
    "ArgumentError",
    "BoundKernel",
    "BuildError",
    "CodegenDriftError",
    "ConstArgsError",
    "DtypeMismatchError",
    "Kernel",
    "SymkernError",
    "UnsupportedFunctionError",
    "build_function",
]
