"""codegen: a kernel's entries as one C++ loop over the batch (`BuildOptions(cpu_loop="c")`).

Imports numpy, sympy and symkern.codegen.trig. XLA's CPU program makes one pass over the
batch per loop fusion and writes each entry as its own array before copying it into the
result; a loop per sample computes a sample's entries in registers and writes each once,
where it belongs in the result (docs/design/cpu-throughput.md, "A C loop per sample"). This module prints that
loop: SymPy's C99 printer over the entries after `sympy.cse`, the body of a loop over a
block of `BLOCK` samples (one 512-bit vector of the dtype's numbers) under `#pragma omp
simd`, which the compiler vectorizes across the block, reading sample i's data and writing
its entries straight into row i of each equation's `(samples, *shape)` result; the samples
after the last whole block, and a block in which an argument of sin or cos lies outside the
polynomial's range, run sample by sample (`each`), with the same operations. All of it is
inside a handler of XLA's FFI (`xla/ffi/api/ffi.h`, shipped in jaxlib) that splits the batch
between threads. symkern.kernels.c_loop compiles and registers it; the kernel's program
calls it through `jax.ffi.ffi_call`.

Symbols are renamed to generated names before printing (`x1_0`, `p_3`, `s_7`), so no name
of a user's reaches the source. What the printer may meet is a closed list: arithmetic,
integer and rational powers, `Piecewise` over comparisons, and the functions of
`C_FUNCTIONS`, each the C library's function of the same meaning — but sin and cos, which
are symkern.codegen.trig's polynomials as in the XLA program (the C library for an argument
outside their range); anything else is refused with a BuildError naming it. The library's
functions are calls the compiler does not vectorize: a body of exp, tanh, ... runs its
blocks one sample at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import sympy as sp
from sympy.codegen.ast import float32, real
from sympy.printing.c import C99CodePrinter

from symkern.codegen.trig import REDUCTIONS, Reduction
from symkern.errors import BuildError

#: SymPy functions the loop computes, each by the C library's function of the same meaning
#: (C99's names; the float32 loop calls the `f` variants: sinf, expf, ...)
C_FUNCTIONS = (sp.exp, sp.log, sp.sin, sp.cos, sp.tan, sp.asin, sp.acos, sp.atan, sp.atan2,
               sp.sinh, sp.cosh, sp.tanh, sp.asinh, sp.acosh, sp.atanh, sp.Abs, sp.floor,
               sp.ceiling, sp.erf, sp.erfc, sp.gamma)
#: the other node types an entry may hold
_STRUCTURE = (sp.Add, sp.Mul, sp.Pow, sp.Symbol, sp.Number, sp.NumberSymbol, sp.Piecewise,
              sp.core.relational.Relational, sp.And, sp.Or, sp.Not, sp.logic.boolalg.BooleanAtom,
              sp.functions.elementary.piecewise.ExprCondPair)
#: integer powers up to this magnitude are multiplications (`sk_powi`, repeated squaring as
#: XLA's integer_pow computes them); larger ones call pow
INTEGER_POWER_UP_TO = 64
_C_TYPES = {"float32": "float", "float64": "double"}
#: samples a vectorized block computes together: one 512-bit vector of the dtype's numbers
BLOCK = {"float32": 16, "float64": 8}
_FFI_TYPES = {"float32": "F32", "float64": "F64"}


@dataclass(frozen=True)
class CLoopSource:
    """A printed loop: its C++ source, the FFI handler's symbol and a digest of the source
    (the registered target's name), and what the handler takes and returns."""

    source: str
    symbol: str
    digest: str
    #: values a sample reads from each data argument
    data_sizes: tuple[int, ...]
    #: values a sample writes to each equation's result
    leaf_sizes: tuple[int, ...]
    dtype: str


def _literal(value: float, dtype: str) -> str:
    """An exact C literal of `value` in `dtype` (hexadecimal, `f` suffix for float)."""
    text = float(value).hex()
    return f"{text}f" if dtype == "float32" else text


def _trig_source(reduction: Reduction, dtype: str) -> str:
    """`sk_sin` and `sk_cos`: symkern.codegen.trig's polynomial for |x| within its range,
    the C library's sin and cos for any other x (larger, infinite, NaN)."""
    c_type, suffix = _C_TYPES[dtype], "f" if dtype == "float32" else ""
    literal = lambda v: _literal(v, dtype)  # noqa: E731
    parts = "\n".join(f"  r = r - k * {literal(part)};" for part in reduction.pi_over_two_parts)

    def horner(coefficients: tuple) -> str:
        value = literal(coefficients[0])
        for c in coefficients[1:]:
            value = f"({value} * z + {literal(c)})"
        return value

    return f"""// sin(x + quarter_turns * pi/2) for |x| <= {float(reduction.fast_up_to):g}: Cody-Waite by pi/2
// in {len(reduction.pi_over_two_parts)} parts, Cephes' minimax polynomials (symkern.codegen.trig)
static inline {c_type} sk_turned({c_type} x, int quarter_turns) {{
  const {c_type} k = __builtin_rint(x * {literal(np.dtype(dtype).type(2 / np.pi))});
  {c_type} r = x;
{parts}
  r = (k == 0) ? x : r;
  const {c_type} z = r * r;
  {c_type} s = r + r * z * {horner(reduction.sine)};
  s = (r == 0) ? r : s;
  const {c_type} c = {literal(1)} - {literal(0.5)} * z + z * z * {horner(reduction.cosine)};
  const int quadrant = ((int)k + quarter_turns) & 3;
  const {c_type} v = (quadrant & 1) == 0 ? s : c;
  return quadrant >= 2 ? -v : v;
}}
static inline {c_type} sk_sin({c_type} x) {{
  return std::fabs(x) <= {literal(reduction.fast_up_to)} ? sk_turned(x, 0) : sin{suffix}(x);
}}
static inline {c_type} sk_cos({c_type} x) {{
  return std::fabs(x) <= {literal(reduction.fast_up_to)} ? sk_turned(x, 1) : cos{suffix}(x);
}}
"""


class _Printer(C99CodePrinter):
    """C99 with integer powers as multiplications, 1/sqrt as a division, sin and cos as
    symkern.codegen.trig's polynomials (`sk_sin`, `sk_cos`)."""

    #: sin and cos as the polynomial alone (`sk_turned`), in a block whose arguments were all
    #: found within its range
    polynomial_only = False

    def _print_sin(self, expr: sp.sin) -> str:
        if self.polynomial_only:
            return f"sk_turned({self._print(expr.args[0])}, 0)"
        return f"sk_sin({self._print(expr.args[0])})"

    def _print_cos(self, expr: sp.cos) -> str:
        if self.polynomial_only:
            return f"sk_turned({self._print(expr.args[0])}, 1)"
        return f"sk_cos({self._print(expr.args[0])})"

    def _print_Pow(self, expr: sp.Pow) -> str:
        base, exponent = expr.args
        if exponent.is_Integer and 2 <= abs(int(exponent)) <= INTEGER_POWER_UP_TO:
            power = f"sk_powi<{abs(int(exponent))}>({self._print(base)})"
            return power if exponent > 0 else f"({self._print(sp.S.One)}/{power})"
        if exponent == sp.Rational(-1, 2):
            root = sp.Pow(base, sp.S.Half, evaluate=False)
            return f"({self._print(sp.S.One)}/{self._print(root)})"
        return super()._print_Pow(expr)


def _refuse_unsupported(entries: Sequence[sp.Basic]) -> None:
    for entry in entries:
        for node in sp.preorder_traversal(entry):
            if isinstance(node, _STRUCTURE) or node.func in C_FUNCTIONS:
                if isinstance(node, sp.Number) and not node.is_extended_real:
                    raise BuildError(f"cpu_loop='c': the C loop computes real numbers; {node} "
                                     "is not; build with the default cpu_loop='xla'")
                continue
            name = getattr(node.func, "__name__", type(node).__name__)
            raise BuildError(
                f"cpu_loop='c': the C loop prints arithmetic, powers, Piecewise and "
                f"{', '.join(f.__name__ for f in C_FUNCTIONS)}; {name} is not among them "
                "(build with the default cpu_loop='xla')")


def _closed_piecewise(expr: sp.Basic) -> sp.Basic:
    """Every Piecewise with a last branch for any other case: NaN, as lambdify gives."""
    def close(node: sp.Piecewise) -> sp.Piecewise:
        if node.args[-1].cond == sp.true:
            return node
        return sp.Piecewise(*node.args, (sp.nan, True))
    return expr.replace(lambda n: isinstance(n, sp.Piecewise), close)


def c_loop_source(entries: Sequence[sp.Basic], data: Sequence[Sequence[sp.Symbol]],
                  parameters: Sequence[sp.Symbol], leaf_sizes: Sequence[int],
                  dtype: str) -> CLoopSource:
    """The C++ of a loop computing `entries` (every equation's scalar entries, row-major,
    equation after equation: `leaf_sizes` of them each) for every sample.

    `data`: each data argument's symbols in the order a sample's values lie; `parameters`:
    every parameter symbol in the order of the flat parameter buffer; `dtype`: "float32" or
    "float64".
    """
    if dtype not in _C_TYPES:
        raise BuildError(f"cpu_loop='c': the C loop computes float32 or float64, not {dtype}")
    _refuse_unsupported(entries)
    names: dict[sp.Basic, sp.Symbol] = {}
    for a, symbols in enumerate(data):
        names.update({s: sp.Symbol(f"x{a + 1}_{k}") for k, s in enumerate(symbols)})
    names.update({s: sp.Symbol(f"p_{k}") for k, s in enumerate(parameters)})
    number = sp.Float if dtype == "float64" else (lambda v: sp.Float(v, 9))
    constants = {c: number(c.evalf(17)) for entry in entries for c in entry.atoms(sp.NumberSymbol)}
    renamed = [_closed_piecewise(sp.sympify(e).xreplace(names).xreplace(constants))
               for e in entries]
    shared, reduced = sp.cse(renamed, symbols=sp.numbered_symbols("s_"))
    printer = _Printer({"type_aliases": {real: float32}} if dtype == "float32" else {})
    polynomial = _Printer({"type_aliases": {real: float32}} if dtype == "float32" else {})
    polynomial.polynomial_only = True
    c_type = _C_TYPES[dtype]
    reduction = REDUCTIONS[np.dtype(dtype)]
    width = BLOCK[dtype]
    limit = _literal(reduction.fast_up_to, dtype)

    def statements(printer: _Printer, sample: str, checked: bool) -> list[str]:
        """A sample's reads, shared values and writes (`sample`: its index in C), each value
        after the range checks of its sin and cos arguments where `checked`."""
        def checks(value: sp.Basic) -> list[str]:
            return [f"out_of_range |= !(std::fabs({printer.doprint(call.args[0])}) <= {limit});"
                    for call in sorted(value.atoms(sp.sin, sp.cos), key=sp.default_sort_key)
                    if checked]

        lines = [f"const {c_type} {names[s]} = X{a + 1}[{sample} * {len(symbols)} + {k}];"
                 for a, symbols in enumerate(data) for k, s in enumerate(symbols)]
        for symbol, value in shared:
            lines += checks(value) + [f"const {c_type} {symbol} = {printer.doprint(value)};"]
        start = 0
        for leaf, size in enumerate(leaf_sizes):
            for k, value in enumerate(reduced[start:start + size]):
                lines += checks(value) + [
                    f"O{leaf}[{sample} * {size} + {k}] = {printer.doprint(value)};"]
            start += size
        return lines

    parameter_reads = [f"const {c_type} {names[s]} = P[{k}];" for k, s in enumerate(parameters)]
    ffi_type = _FFI_TYPES[dtype]
    arguments = ", ".join([f"const {c_type}* X{a + 1}" for a in range(len(data))]
                          + [f"const {c_type}* P"]
                          + [f"{c_type}* O{leaf}" for leaf in range(len(leaf_sizes))])
    call_arguments = ", ".join([f"X{a + 1}" for a in range(len(data))] + ["P"]
                               + [f"O{leaf}" for leaf in range(len(leaf_sizes))])
    pointers = ", ".join([f"x{a + 1}.typed_data()" for a in range(len(data))] + ["p.typed_data()"]
                         + [f"o{leaf}->typed_data()" for leaf in range(len(leaf_sizes))])
    handler_arguments = ", ".join(
        [f"ffi::Buffer<ffi::{ffi_type}> x{a + 1}" for a in range(len(data))]
        + [f"ffi::Buffer<ffi::{ffi_type}> p"]
        + [f"ffi::ResultBuffer<ffi::{ffi_type}> o{leaf}" for leaf in range(len(leaf_sizes))]
        + ["int64_t threads", "int64_t grain"])
    binding = "".join([f".Arg<ffi::Buffer<ffi::{ffi_type}>>()"] * (len(data) + 1)
                      + [f".Ret<ffi::Buffer<ffi::{ffi_type}>>()"] * len(leaf_sizes)
                      + ['.Attr<int64_t>("threads")', '.Attr<int64_t>("grain")'])
    indent = "\n    "
    body = f"""// generated by symkern.codegen.c_loop: {len(entries)} entries, {len(shared)} shared values
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;

// x**N for an integer N >= 1, by repeated squaring (as XLA's integer_pow), unrolled when compiled
template <int N>
static inline {c_type} sk_powi({c_type} x) {{
  if constexpr (N == 1) {{
    return x;
  }} else if constexpr (N % 2 == 0) {{
    const {c_type} half = sk_powi<N / 2>(x);
    return half * half;
  }} else {{
    return x * sk_powi<N - 1>(x);
  }}
}}

{_trig_source(reduction, dtype)}
// sample by sample, sin and cos taking the C library's value outside the polynomial's range
static void each({arguments}, int64_t lo, int64_t hi) {{
  {(indent[:-2]).join(parameter_reads) if parameter_reads else ""}
  for (int64_t i = lo; i < hi; ++i) {{
    {indent.join(statements(printer, "i", checked=False))}
  }}
}}

// {width} samples at a time as one vectorized loop, sin and cos the polynomial alone; a block
// with an argument outside its range (or NaN) is computed again sample by sample (`each`,
// which writes over it and gives an in-range sample the same operations, so the same value)
static void loop({arguments}, int64_t lo, int64_t hi) {{
  {(indent[:-2]).join(parameter_reads) if parameter_reads else ""}
  int64_t i0 = lo;
  for (; i0 + {width} <= hi; i0 += {width}) {{
    int out_of_range = 0;
    #pragma omp simd reduction(|:out_of_range)
    for (int j = 0; j < {width}; ++j) {{
      {(indent + "  ").join(statements(polynomial, "(i0 + j)", checked=True))}
    }}
    if (out_of_range) each({call_arguments}, i0, i0 + {width});
  }}
  each({call_arguments}, i0, hi);
}}

// the batch in `threads` contiguous parts of at least `grain` samples, one a thread
static ffi::Error run_batch({handler_arguments}) {{
  const int64_t samples = o0->dimensions()[0];
  int64_t parts = samples / (grain > 0 ? grain : 1);
  if (parts > threads) parts = threads;
  if (parts < 2) {{
    loop({pointers}, 0, samples);
    return ffi::Error::Success();
  }}
  std::vector<std::thread> others;
  for (int64_t part = 1; part < parts; ++part)
    others.emplace_back([&, part] {{
      loop({pointers}, samples * part / parts, samples * (part + 1) / parts);
    }});
  loop({pointers}, 0, samples / parts);
  for (auto& other : others) other.join();
  return ffi::Error::Success();
}}
"""
    digest = hashlib.sha256(body.encode()).hexdigest()[:16]
    symbol = f"symkern_c_loop_{digest}"
    source = body + (f"\nXLA_FFI_DEFINE_HANDLER_SYMBOL({symbol}, run_batch, "
                     f"ffi::Ffi::Bind(){binding});\n")
    return CLoopSource(source, symbol, digest, tuple(len(s) for s in data), tuple(leaf_sizes),
                       dtype)


__all__ = ["C_FUNCTIONS", "INTEGER_POWER_UP_TO", "CLoopSource", "c_loop_source"]
