"""The exception types of symkern.

A leaf module: every part of the package may import it, it imports nothing of symkern.
"""

from __future__ import annotations


class SymkernError(Exception):
    """Base class of every error symkern raises on purpose."""


class BuildError(SymkernError, ValueError):
    """The equations, arguments or options given to a build cannot make a kernel."""


class UnsupportedFunctionError(BuildError):
    """An equation uses a SymPy function that has no JAX implementation."""


class ArgumentError(SymkernError, ValueError):
    """A kernel was called with arguments of the wrong structure, shape or dtype."""


class DtypeMismatchError(ArgumentError):
    """The dtype policy at execution differs from the one the kernel was lowered with."""


class ConstArgsError(SymkernError, ValueError):
    """Const args supplied to a loaded kernel do not match what it was exported with."""


class CodegenDriftError(SymkernError, RuntimeError):
    """A rewrite rule did not find the upstream form it was written against.

    The message names the rule, what it expected and what it found: such an error means
    an upgrade of SymPy, astor or JAX changed what they emit (run `python -m symkern doctor`).
    """


class CapturedConstantsWarning(UserWarning):
    """A kernel holds more constant bytes than SYMKERN_CAPTURED_CONSTANTS_WARN_BYTES."""


class CacheWarning(UserWarning):
    """The on-disk cache was not used: its directory is refused, or an entry was unusable
    and is rebuilt (see `symkern.enable_cache`)."""
