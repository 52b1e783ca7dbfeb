"""symkern: SymPy equations and symbolic neural networks compiled to batched XLA kernels."""

from symkern.batching.build import build_function, build_nn_function
from symkern.batching.caching import disable_cache, enable_cache
from symkern.batching.kernel import BoundKernel, Kernel
from symkern.codegen.passes import BuildOptions
from symkern.errors import (
    ArgumentError,
    BuildError,
    CacheWarning,
    CapturedConstantsWarning,
    CodegenDriftError,
    ConstArgsError,
    DtypeMismatchError,
    SymkernError,
    UnsupportedFunctionError,
)
from symkern.kernels.constants import ConstArg
from symkern.kernels.export import LoadedKernel, load
from symkern.kernels.memory import reuse_cpu_memory
from symkern.kernels.threads import set_cpu_threads
from symkern.symbolic import (
    ACTIVATIONS,
    Chain,
    Dense,
    Linear,
    SymbolicNetwork,
    gradient,
    hessian,
    jacobian,
    parameter_gradient,
)
from symkern.symbolic.structured import StructuredNetwork, hamiltonian_vector_field, prefer_structured

__version__ = "0.1.0"

__all__ = [
    "ACTIVATIONS",
    "Chain",
    "Dense",
    "Linear",
    "StructuredNetwork",
    "SymbolicNetwork",
    "build_nn_function",
    "hamiltonian_vector_field",
    "prefer_structured",
    "gradient",
    "hessian",
    "jacobian",
    "parameter_gradient",
    "ArgumentError",
    "BoundKernel",
    "BuildOptions",
    "BuildError",
    "CacheWarning",
    "CapturedConstantsWarning",
    "ConstArg",
    "CodegenDriftError",
    "ConstArgsError",
    "DtypeMismatchError",
    "Kernel",
    "LoadedKernel",
    "SymkernError",
    "UnsupportedFunctionError",
    "build_function",
    "disable_cache",
    "enable_cache",
    "load",
    "reuse_cpu_memory",
    "set_cpu_threads",
]
