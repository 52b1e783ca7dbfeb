"""codegen, documentation: docs/coverage.md, generated from the callee table.

Imports symkern.codegen.callee, symkern.codegen.emit and symkern.codegen.special.
`python -m symkern.codegen.coverage` prints the page; tests/codegen/test_coverage_doc.py
checks that the committed page is it.
"""

from __future__ import annotations

import inspect

from symkern.codegen import special
from symkern.codegen.callee import CALLEE_TABLE, COMPOSITE_SYMPY, REFUSED_SYMPY
from symkern.codegen.emit import UNROLL_MAX_TERMS

#: where the committed page lives, relative to the repository root
PAGE = "docs/coverage.md"

_HEADER = """# SymPy coverage

What a kernel evaluates, function by function. Generated from
`symkern.codegen.callee` (`python -m symkern.codegen.coverage > docs/coverage.md`); a test
fails when this page and the table disagree.

Every function SymPy's JAX, NumPy and SciPy printers know is either below as supported or
refused with its reason (tests/codegen/test_special.py reads the printers' own tables).
Supported functions are tested against mpmath at 30 digits in float64 and float32, and
their derivatives against mpmath's where JAX differentiates them.
"""


def _domain(target: str) -> str:
    """The first line of a symkern.codegen.special function's docstring."""
    if not target.startswith("special."):
        return ""
    function = getattr(special, target.removeprefix("special."))
    doc = inspect.getdoc(function) or ""
    return " ".join(doc.split("\n\n")[0].split())


def coverage_page() -> str:
    """docs/coverage.md as it should read for the installed table.

    >>> "| `besselj` | `special.besselj` |" in coverage_page()
    True
    """
    lines = [_HEADER, "## Supported functions", "",
             "| SymPy | kernel | domain and method |", "|---|---|---|"]
    rows = sorted((name, row.target) for row in CALLEE_TABLE.values()
                  if row.target not in ("jnp.array", "jnp.asarray") for name in row.sympy)
    seen: set[tuple[str, str]] = set()
    for name, target in rows:
        if (name, target) in seen:
            continue
        seen.add((name, target))
        domain = _domain(target).replace("|", "\\|")
        lines.append(f"| `{name}` | `{target}` | {domain} |")
    lines += ["", "## Written through other functions", "",
              "These print as expressions of the functions above: "
              + ", ".join(f"`{name}`" for name in sorted(COMPOSITE_SYMPY)) + ".", "",
              "## Refused", "",
              "Each raises `symkern.UnsupportedFunctionError` (a `BuildError`) at build, "
              "with this reason and route.", "",
              "| SymPy | why, and what to do |", "|---|---|"]
    for name in sorted(REFUSED_SYMPY):
        lines.append(f"| `{name}` | {REFUSED_SYMPY[name]} |")
    lines += ["", "Any other SymPy function is refused the same way, naming the nearest "
              "supported functions. Undefined functions (`sp.Function(\"f\")`) take their "
              "implementation from `functions=`; unevaluated `Integral` and `Derivative` "
              "are refused with `.doit()` as the route.", "", _FORMS]
    return "\n".join(lines)


_FORMS = f"""## Forms beyond functions

- Conditions (relationals, `And`, `Or`, `Not`, `Xor`, `ITE`, `true`/`false`) as equations,
  alone or in a Matrix, are bool arrays; an `ITE` is written in negation normal form.
- `Sum` and `Product` are written out term by term (at most {UNROLL_MAX_TERMS:,} terms): over integer
  bounds, or up to the largest value of a bound that reads a parameter, stated with `Min`
  (`Sum(f, (k, 0, Min(n, 100)))`; a lower bound `Max(m, 0)`), the terms outside the bounds
  masked by a `Piecewise`. A bound with no largest value is refused with that route.
- The imaginary unit `I` makes a complex kernel (complex64 / complex128); each output is
  real or complex as JAX computes it. With a real `dtype=` it is refused.
"""


if __name__ == "__main__":
    print(coverage_page(), end="")
