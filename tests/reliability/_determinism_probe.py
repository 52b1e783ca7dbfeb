"""Build a fixed set of kernels and print their sources as JSON (run in a fresh process).

Used by test_determinism.py with different PYTHONHASHSEED values; not a test module.
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_enable_x64", True)

import sympy as sp  # noqa: E402

import symkern as sk  # noqa: E402


def cases() -> dict[str, tuple]:
    x0, x1, x2, y = sp.symbols("x0 x1 x2 y")
    a, b, c = sp.symbols("a b c")
    W = sp.Matrix(2, 3, sp.symbols("w0:6"))
    v = sp.Matrix(sp.symbols("v0:2"))
    shared = sp.sin(x0 * a + x1) * sp.exp(-x2 * b)
    piecewise = sp.Piecewise((sp.sqrt(x0) * a, x0 > 0), (x1**2 - c, sp.Eq(x1, b)),
                             (sp.cos(x2), True))
    return {
        "several_symbols": (shared + sp.tanh(shared) * c + x0 * x1 * x2 * y,
                            [x0, x1, x2], y, {"a": a, "b": b, "c": c}),
        "piecewise": ({"p": piecewise, "q": sp.Matrix([piecewise * x0, shared])},
                      [x0, x1, x2], None, {"a": a, "b": b, "c": c}),
        "parameter_tree": ([W * sp.Matrix([x0, x1, x2]) + v, sp.Max(x0, a) * b],
                           [x0, x1, x2], None,
                           {"z": {"W": W, "v": v}, "b": b, "m": [a, (c,)], "1": {"y": y}}),
    }


def main() -> None:
    out = {}
    for name, (eqs, data, scalar, params) in cases().items():
        data_args = [data] + ([scalar] if scalar is not None else [])
        for cse in (False, True):
            kernel = sk.build_function(eqs, *data_args, params=params, cse=cse, dtype="float64")
            out[f"{name}/cse={cse}"] = {"source": kernel.source,
                                        "upstream_source": kernel.upstream_source}
    json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
