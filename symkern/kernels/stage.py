"""kernels, stage 3: compile the rewritten module, trace it to a jaxpr, lower and compile it.

Imports jax, symkern.codegen, symkern.errors and symkern.kernels.c_loop; nothing from batching.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable, Mapping
from typing import Any

from symkern.codegen.namespace import kernel_namespace
from symkern.codegen.rules import KERNEL_NAME
from symkern.kernels.c_loop import C_LINALG


def compile_kernel(module: ast.Module, functions: Mapping[str, Callable] | None,
                   filename: str) -> Callable[..., tuple[Any, ...]]:
    """Turn the rewritten tree into a Python function.

    The code is ours (built rule by rule from SymPy's output, never from a user's text);
    it runs in a namespace holding only the kernel namespace and no builtins.
    """
    namespace = kernel_namespace(dict(functions or {}), C_LINALG)
    # the rules leave new nodes without source positions; one pass here, not one per rule
    ast.fix_missing_locations(module)
    exec(compile(module, filename, "exec"), namespace)  # noqa: S102 - generated tree, no user text
    # popped, so the function's globals do not hold the function itself (no cycle)
    return namespace.pop(KERNEL_NAME)


class LazyKernelFunction:
    """`compile_kernel` on the first call, for functions a kernel may never call.

    A split kernel runs its pieces' executables; its whole-body function serves only traced
    calls (jit, grad, vmap, export), and the pieces' Python functions only tracing — which a
    second process that loads the compiled pieces from the cache never does. At 10^5
    operations compiling them all took 1.7 s of a cached 6 s build.
    """

    def __init__(self, module: ast.Module, functions: Mapping[str, Callable] | None,
                 filename: str) -> None:
        self._module = module
        self._functions = functions
        self._filename = filename
        self._function: Callable[..., tuple[Any, ...]] | None = None
        self._lock = threading.Lock()

    def __call__(self, *arguments: Any) -> tuple[Any, ...]:
        if self._function is None:
            with self._lock:
                if self._function is None:
                    self._function = compile_kernel(self._module, self._functions, self._filename)
        return self._function(*arguments)
