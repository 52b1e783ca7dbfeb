"""The command line: `python -m symkern demo | inspect | doctor`.

Imports symkern's own modules lazily, per command.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

#: the largest batch `inspect` shows stages 3 and 4 for (its arrays are allocated)
MAX_INSPECT_BATCH = 1 << 20
INSPECT_EXAMPLE = "python -m symkern inspect 'sin(x0) * a + x1**2' --data x0,x1 --params a"


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 72 - len(title)))


def doctor() -> int:
    """Run every drift check against the installed SymPy, astor and JAX; 0 only if none drifted."""
    from symkern.codegen import drift

    results = drift.run_checks()
    width = max(len(result.label) for result in results)
    print("symkern doctor: the upstream forms symkern's rewrite rules depend on\n")
    print(f"{'status':<6}  {'check':<{width}}  assumption")
    for result in results:
        print(f"{'ok' if result.ok else 'DRIFT':<6}  {result.label:<{width}}  {result.assumption}")
        if not result.ok:
            print(f"{'':<6}  {'':<{width}}    expected: {result.expected}")
            print(f"{'':<6}  {'':<{width}}    found:    {result.found}")
    drifted = [result for result in results if not result.ok]
    versions = ", ".join(f"{name} {version}" for name, version in drift.versions().items())
    print(f"\nversions: {versions}")
    print(f"{len(results)} checks: {len(results) - len(drifted)} ok, {len(drifted)} drifted")
    if drifted:
        print("a drift means an installed version prints code the rules were not written "
              "against; see docs/codegen.md")
    return 1 if drifted else 0


def _symbols(groups: Sequence[str], what: str) -> list[list[str]]:
    """`["x0,x1", "t"]` → `[["x0", "x1"], ["t"]]`, each name checked."""
    from symkern.errors import BuildError
    from symkern.symbolic.parse import declared_symbol_name

    parsed = []
    for group in groups:
        names = [name.strip() for name in group.split(",") if name.strip()]
        if not names:
            raise BuildError(f"{what} {group!r}: expected comma-separated symbol names")
        parsed.append([declared_symbol_name(name) for name in names])
    return parsed


def inspect_kernel(text: str, data: Sequence[str], params: Sequence[str], *, cse: bool,
                   batch: int) -> int:
    """Print the four stages of the kernel for the expression `text`; nothing of it is run."""
    import numpy as np
    import sympy as sp

    from symkern.batching.build import build_function
    from symkern.codegen.callee import SUPPORTED_SYMPY_FUNCTIONS
    from symkern.errors import BuildError
    from symkern.symbolic.parse import EXTRA_NAMES, parse_expression, resolve_sympy_functions

    data_groups = _symbols(data, "--data")
    parameter_names = [name for group in _symbols(params, "--params") for name in group]
    names = [name for group in data_groups for name in group] + parameter_names
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise BuildError(f"symbols {', '.join(duplicates)} are declared more than once")
    symbols = {name: sp.Symbol(name) for name in names}
    # Matrix and Array build equations' structure, not values: not part of an expression
    functions = resolve_sympy_functions(
        sorted(SUPPORTED_SYMPY_FUNCTIONS - {"Matrix", "Array"}) + list(EXTRA_NAMES))
    expression = parse_expression(text, symbols, functions)

    # one name is a scalar data argument; a comma-separated group is a vector
    data_arguments: list[Any] = [
        symbols[group[0]] if len(group) == 1 and "," not in raw else [symbols[n] for n in group]
        for group, raw in zip(data_groups, data, strict=True)
    ]
    parameters = {name: symbols[name] for name in parameter_names} or None
    kernel = build_function(expression, *data_arguments, params=parameters, cse=cse)

    samples = [np.zeros((batch, *spec.shape), kernel.dtype) for spec in kernel.signature.data]
    arguments = samples + ([dict.fromkeys(parameter_names, 0.0)] if parameters else [])
    print(f"expression: {expression}")
    print(f"kernel:     {kernel!r}  (cse={cse}; stages 3 and 4 for a batch of {batch})")
    _section("stage 1: the per-sample code SymPy printed (kernel.upstream_source)")
    print(kernel.upstream_source.rstrip())
    _section("stage 2: after the rewrite rules (kernel.source)")
    print(kernel.source.rstrip())
    _section("stage 3: the jaxpr (kernel.jaxpr)")
    print(kernel.jaxpr(*arguments))
    _section("stage 4: the lowered program, StableHLO (kernel.hlo)")
    print(kernel.hlo(*arguments).rstrip())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m symkern", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="build the demo kernels, print their stages, run them")
    commands.add_parser("doctor", help="check that the installed SymPy, astor and JAX still "
                        "emit the forms the rewrite rules depend on")
    inspect = commands.add_parser(
        "inspect", help="print the four stages of the kernel for an expression",
        description="Print the four stages of a kernel: SymPy's source, the rewritten source, "
                    "the jaxpr and the HLO. The expression is parsed, never run as Python: it "
                    "may use numbers, arithmetic, comparisons, the declared symbols and SymPy "
                    f"functions. Example: {INSPECT_EXAMPLE}",
    )
    inspect.add_argument("expr", metavar="EXPR", help="a SymPy expression, e.g. 'sin(x0) * a'")
    inspect.add_argument("--data", action="append", default=[], metavar="NAMES",
                         help="one data argument: a symbol, or a comma-separated vector of "
                              "them (x0,x1); repeat for more data arguments")
    inspect.add_argument("--params", action="append", default=[], metavar="NAMES",
                         help="scalar parameters, comma-separated (a,b); read as ps['a'], ...")
    inspect.add_argument("--cse", action=argparse.BooleanOptionalAction, default=True,
                         help="common-subexpression elimination (default: on)")
    inspect.add_argument("--batch", type=int, default=8,
                         help="the batch size stages 3 and 4 are shown for (default: 8)")
    arguments = parser.parse_args(argv)
    if arguments.command == "demo":
        from symkern.demo import main as demo

        return demo()
    if arguments.command == "doctor":
        return doctor()
    if arguments.command == "inspect":
        from symkern.errors import SymkernError

        if not 1 <= arguments.batch <= MAX_INSPECT_BATCH:
            parser.error(f"--batch: expected a number of samples from 1 to "
                         f"{MAX_INSPECT_BATCH:,}, got {arguments.batch}")
        try:
            return inspect_kernel(arguments.expr, arguments.data, arguments.params,
                                  cse=arguments.cse, batch=arguments.batch)
        except SymkernError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    parser.error(f"unknown command {arguments.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
