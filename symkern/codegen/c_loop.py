"""codegen: a kernel's entries as one C++ loop over the batch (`BuildOptions(cpu_loop="c")`).

Imports sympy, symkern.codegen.c_math and symkern.codegen.linearize. XLA's CPU program makes
one pass over the batch per loop fusion and writes each entry as its own array before
copying it into the result; a loop per sample computes a sample's entries in registers and
writes each once, where it belongs in the result (docs/design/cpu-throughput.md, "A C loop
per sample"). This module prints that loop: the entries as assignments of bounded depth
with their repeated subexpressions shared (symkern.codegen.linearize, as the XLA program's
body; no SymPy walk, substitution or printer call then recurses on an entry's depth),
printed by SymPy's C99 printer as the body of a loop over a block of `BLOCK` samples (one
512-bit vector of the dtype's numbers) under `#pragma omp simd`, which the compiler
vectorizes across the block, reading sample i's data and writing its entries straight into
row i of each equation's `(samples, *shape)` result, with row lengths the compiler may not
assume (`sk_opaque`: knowing them, g++ vectorizes only rows of 2^k or 3 numbers). What no
data reaches (a mass matrix's 0s and 1s, a parameter's function, and the same inside an
entry that data reaches: `h_K`) is computed once a call, and a block copies those entries
into its rows run by run before writing the others; a block of more than
`SECTIONS_ABOVE_OPERATIONS` operations is computed by several functions in turn (sections),
which the compiler optimizes one by one, the values a later section reads passing through a
row of `V`; where
the call's outputs are as large as the last-level cache (the handler's `stream`), a block
writes what varies into a stage of its rows that holds the others from the start, and
streams the stage into the result past the caches (non-temporal stores). The
samples after the last whole block, and a block in which an argument of an inline function
lies outside its condition, run sample by sample (`each`), with the same operations. All of
it is inside a handler of XLA's FFI (`xla/ffi/api/ffi.h`, shipped in jaxlib) that advises
the kernel to back the outputs with huge pages and splits the batch between threads.
symkern.kernels.c_loop compiles and registers it; the kernel's program calls it through
`jax.ffi.ffi_call`.

The printer names symbols with generated names (`x1_0`, `p_3`, `s_7`), so no name of a
user's reaches the source; it substitutes nothing in the expressions (a rebuilt SymPy node
is evaluated again, and evaluating exp or log of a large polynomial factors it). What it
may meet is a closed list: arithmetic, integer and rational powers, `Piecewise` over
comparisons, and the functions of `C_FUNCTIONS`, each the C library's function of the same
meaning, but exp, log, tanh, atan, sin and cos, which are symkern.codegen.c_math's inline
forms (the C library's outside their conditions); anything else is refused with a
BuildError naming it. A power whose exponent is neither an integer nor half an odd integer
is pow, computed inline as exp(y log x) within a condition too (symkern.codegen.c_math). The
other functions are calls the compiler does not vectorize: a body of them runs its blocks one
sample at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy as sp
from sympy.codegen.ast import float32, real
from sympy.printing.c import C99CodePrinter

from symkern.codegen.c_math import ATTRIBUTES, C_TYPES, INLINE_FUNCTIONS, inline_source
from symkern.codegen.linearize import linearize
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
#: XLA's integer_pow computes them); larger ones are pow (`sk_pow`)
INTEGER_POWER_UP_TO = 64
#: a block of more operations than this (`_Walk.cost`) is computed in sections of at most
#: SECTION_OPERATIONS: a function each, which g++ optimizes alone. Its time on one function
#: grows faster than the function's length (its RTL combiner and register allocator walk one
#: basic block of the whole body: 173 and 16 of the 229 s it took on the random wide-sum of
#: 10^4 operations in float64, printed without `h_K`). Below this, a body compiles whole in
#: seconds (the network's Jacobian, 4,632, in 9.7 s) and sections would only cost time: its
#: hidden values pass between them, 1.12-1.29x the time in sections of 1,500
#: (benchmarks/experiments/c_loop_sections.py)
SECTIONS_ABOVE_OPERATIONS = 6000
#: the most operations a section holds: the random wide-sum of 10^4 operations (27,089 here)
#: built in 64.8 / 107 s (float32 / float64) whole, 55.1 / 70.8 s in sections of 8,000, 37.2 /
#: 45.8 of 4,000 and 25.8 / 30.9 of 1,500, and ran 1.02 / 1.02, 1.02 / 1.04 and 1.05 / 1.06x
#: the whole block's time (benchmarks/experiments/c_loop_sections.py)
SECTION_OPERATIONS = 1500
#: the operations an inline function or pow counts for in a section's operations (its inline
#: form is 20-60 vector instructions)
INLINE_OPERATIONS = 30
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


def calls_pow(power: sp.Pow) -> bool:
    """Whether the loop computes `power` as pow: an exponent that is neither an integer nor
    half an odd integer of the magnitudes `_Printer` writes as products and square roots."""
    exponent = power.exp
    if exponent.is_Integer:
        return abs(int(exponent)) > INTEGER_POWER_UP_TO
    return not (exponent.is_Rational and exponent.q == 2
                and abs(exponent.p) <= 2 * INTEGER_POWER_UP_TO + 1)


class _Printer(C99CodePrinter):
    """C99 with the loop's names for symbols, constants as the dtype's nearest numbers, a
    Piecewise without a last branch given NaN's, its conditions' And and Or as `&` and `|`
    (a branch keeps a block from being vectorized), integer powers as multiplications, powers
    of half an odd integer as a square root times an integer power, other powers as
    `sk_pow`, and symkern.codegen.c_math's inline functions (`sk_exp`, ...). Nothing is substituted in the
    expressions themselves: a rebuilt SymPy node is evaluated again, and evaluating an exp or
    a log of a large polynomial factors it (minutes)."""

    def __init__(self, dtype: str, names: dict[sp.Basic, str], inline_only: bool,
                 parts: dict[sp.Basic, str] | None = None) -> None:
        super().__init__({"type_aliases": {real: float32}} if dtype == "float32" else {})
        self._names = names
        #: subexpressions computed once a call, printed as their names
        self._parts = parts or {}
        self._digits = 9 if dtype == "float32" else 17
        #: the inline functions as their inline form alone (`sk_exp_core`), in a block whose
        #: arguments were all found within their conditions
        self.inline_only = inline_only

    def _print(self, expr: Any, **kwargs: Any) -> str:
        if isinstance(expr, sp.Symbol):  # a Dummy or any other subclass too
            return self._print_Symbol(expr)
        if self._parts and isinstance(expr, sp.Expr) and expr in self._parts:
            return self._parts[expr]
        return super()._print(expr, **kwargs)

    def _print_Symbol(self, expr: sp.Symbol) -> str:
        if expr not in self._names:
            raise BuildError(f"cpu_loop='c': {expr} is neither a data nor a parameter symbol")
        return self._names[expr]

    def _print_constant(self, expr: sp.NumberSymbol) -> str:
        return self._print(sp.Float(expr.evalf(17), self._digits))

    def _print_Piecewise(self, expr: sp.Piecewise) -> str:
        if expr.args[-1].cond != sp.true:  # NaN for any other case, as lambdify gives
            expr = sp.Piecewise(*expr.args, (sp.nan, True), evaluate=False)
        return super()._print_Piecewise(expr)

    def _print_And(self, expr: sp.And) -> str:
        # `&` and `|` of the comparisons, not `&&` and `||`: a branch in a block keeps g++
        # from vectorizing it
        return "(" + " & ".join(f"({self._print(a)})"
                                for a in sorted(expr.args, key=sp.default_sort_key)) + ")"

    def _print_Or(self, expr: sp.Or) -> str:
        return "(" + " | ".join(f"({self._print(a)})"
                                for a in sorted(expr.args, key=sp.default_sort_key)) + ")"

    def _print_inline(self, expr: sp.Function) -> str:
        form = "_core" if self.inline_only else ""
        return f"sk_{expr.func.__name__}{form}({self._print(expr.args[0])})"

    def _print_Pow(self, expr: sp.Pow) -> str:
        base, exponent = expr.args
        if calls_pow(expr):  # symkern.codegen.c_math's inline pow
            form = "_core" if self.inline_only else ""
            return f"sk_pow{form}({self._print(base)}, {self._print(exponent)})"
        if exponent.is_Integer:  # within INTEGER_POWER_UP_TO (calls_pow)
            if abs(int(exponent)) == 1:
                return super()._print_Pow(expr)
            power = f"sk_powi<{abs(int(exponent))}>({self._print(base)})"
            return power if exponent > 0 else f"({self._print(sp.S.One)}/{power})"
        if exponent != sp.S.Half:  # half an odd integer (calls_pow)
            # x**(n/2) as sqrt(x) times x**(n // 2): a call of pow keeps the whole block
            # from being vectorized, sqrt does not (pow's value within the squarings' error of
            # an integer power); + 0 makes either zero's power +0, as pow's
            root = self._print(sp.Pow(base, sp.S.Half, evaluate=False))
            whole = abs(exponent.p) // 2
            power = f"({root} + 0)" if whole == 0 else f"(sk_powi<{whole}>({self._print(base)})*{root} + 0)"
            return power if exponent > 0 else f"({self._print(sp.S.One)}/{power})"
        return super()._print_Pow(expr)


for _function in INLINE_FUNCTIONS:
    setattr(_Printer, f"_print_{_function.__name__}", _Printer._print_inline)
for _constant in (sp.NumberSymbol, *sp.NumberSymbol.__subclasses__()):
    setattr(_Printer, f"_print_{_constant.__name__}", _Printer._print_constant)


def _copies(leaf: int, size: int, invariant: Sequence[int], row: str) -> list[str]:
    """The copies of equation `leaf`'s invariant entries (`invariant`: their places, in
    order), run by run, from its row of them (`t{leaf}`) into the row starting at `row`."""
    runs: list[list[int]] = []
    for k in invariant:
        if runs and runs[-1][1] == k:
            runs[-1][1] = k + 1
        else:
            runs.append([k, k + 1])
    return [f"std::memcpy({row} + {start}, t{leaf}.data() + {start}, "
            f"{end - start} * sizeof(O{leaf}[0]));" for start, end in runs]


@dataclass(frozen=True)
class _Walk:
    """What a varying statement reads: its largest subexpressions no data reaches (`parts`),
    its symbols, and the inline functions and pows it calls outside the parts (in a block,
    each a check), with its operations outside them (`cost`)."""

    parts: tuple[sp.Basic, ...]
    symbols: frozenset[sp.Symbol]
    calls: tuple[sp.Basic, ...]
    cost: int


def _walk(value: sp.Basic, varying: set[sp.Basic]) -> _Walk:
    parts: dict[sp.Basic, None] = {}
    symbols: set[sp.Symbol] = set()
    calls: set[sp.Basic] = set()
    operations = 0
    stack = [value]
    while stack:  # values are of bounded depth (linearize), but a walk needs no recursion
        node = stack.pop()
        if isinstance(node, sp.Symbol):
            symbols.add(node)
            continue
        if node.is_Atom:
            continue
        if isinstance(node, sp.Expr) and not node.free_symbols & varying:
            parts.setdefault(node)
            # the printer may print a part's pieces instead of its name (x/c for x*c**-1):
            # a section reads them too
            symbols |= node.free_symbols
            continue
        if isinstance(node, INLINE_FUNCTIONS) or isinstance(node, sp.Pow) and calls_pow(node):
            calls.add(node)
            operations += INLINE_OPERATIONS
        operations += len(node.args) - 1 if isinstance(node, (sp.Add, sp.Mul)) else 1
        stack.extend(reversed(node.args))
    return _Walk(tuple(parts), frozenset(symbols), tuple(sorted(calls, key=sp.default_sort_key)),
                 operations)


@dataclass(frozen=True)
class _Statement:
    """A statement of a block: its lines (checks, then the assignment), what it reads, and
    the shared symbol it defines (None for an entry)."""

    lines: list[str]
    walk: _Walk
    symbol: sp.Symbol | None


def _sections(items: Sequence[_Statement]) -> list[list[_Statement]]:
    """`items` in one group, or where they hold more than SECTIONS_ABOVE_OPERATIONS operations
    (`_Walk.cost`), in consecutive groups of at most SECTION_OPERATIONS (a statement of more
    is a group alone)."""
    if sum(item.walk.cost for item in items) <= SECTIONS_ABOVE_OPERATIONS:
        return [list(items)]
    groups: list[list[_Statement]] = [[]]
    spent = 0
    for item in items:
        if groups[-1] and spent + item.walk.cost > SECTION_OPERATIONS:
            groups.append([])
            spent = 0
        groups[-1].append(item)
        spent += item.walk.cost
    return groups


@dataclass(frozen=True)
class _Sectioned:
    source: str  # the section functions
    block: str  # a block's body in `loop`: the sections called in turn
    prologue: list[str]  # `loop`'s lines before its blocks: the invariants and the values' rows


def _number(name: str) -> tuple[str, int]:
    """A generated name's order: `p_3` -> ("p", 3)."""
    kind, number = name.split("_")
    return kind, int(number)


def _sectioned_block(groups: Sequence[Sequence[_Statement]], data: Sequence[Sequence[sp.Symbol]],
                     names: dict[sp.Basic, str], n_leaves: int, c_type: str,
                     width: int) -> _Sectioned:
    """A block computed by one noinline function a group of statements (`sk_section_K`), each
    its own vectorized loop over the block's samples. A value a later section reads goes
    through a row of `width` numbers of `V`; a section reads what `loop` computes once a call
    (parameters, invariant values, parts) from `H`, and the data as a whole block does.
    `names`: every symbol's and part's name."""
    data_symbols = {s: (a, k) for a, symbols in enumerate(data) for k, s in enumerate(symbols)}
    reads = [set().union(*(item.walk.symbols | set(item.walk.parts) for item in group))
             for group in groups]
    defined = [{item.symbol for item in group if item.symbol is not None} for group in groups]
    slots: dict[sp.Basic, int] = {}
    for g, own in enumerate(defined):
        for symbol in sorted(own, key=lambda s: _number(names[s])):
            if any(symbol in later for later in reads[g + 1:]):
                slots[symbol] = len(slots)
    every_defined = set().union(*defined)
    invariants = sorted({s for r in reads for s in r
                         if s not in data_symbols and s not in every_defined},
                        key=lambda s: _number(names[s]))
    held = {s: k for k, s in enumerate(invariants)}
    arguments = ", ".join([f"const {c_type}* X{a + 1}" for a in range(len(data))]
                          + [f"const {c_type}* H", f"{c_type}* V"]
                          + [f"{c_type}* D{leaf}" for leaf in range(n_leaves)]
                          + ["int64_t i0"] + [f"int64_t wx{a + 1}" for a in range(len(data))]
                          + [f"int64_t wo{leaf}" for leaf in range(n_leaves)])
    passed = ", ".join([f"X{a + 1}" for a in range(len(data))] + ["H", "V"]
                       + [f"D{leaf}" for leaf in range(n_leaves)] + ["i0"]
                       + [f"wx{a + 1}" for a in range(len(data))]
                       + [f"wo{leaf}" for leaf in range(n_leaves)])
    functions = []
    for g, group in enumerate(groups):
        before = [f"const {c_type} {names[s]} = H[{held[s]}];"
                  for s in sorted(reads[g] & held.keys(), key=held.get)]
        inputs = [f"const {c_type} {names[s]} = X{a + 1}[(i0 + j) * wx{a + 1} + {k}];"
                  for s, (a, k) in sorted(((s, data_symbols[s]) for s in reads[g] if s in data_symbols),
                                          key=lambda pair: pair[1])]
        earlier = [f"const {c_type} {names[s]} = V[{slots[s]} * {width} + j];"
                   for s in sorted((reads[g] - defined[g]) & slots.keys(), key=slots.get)]
        kept = [f"V[{slots[s]} * {width} + j] = {names[s]};"
                for s in sorted(defined[g] & slots.keys(), key=slots.get)]
        body = inputs + earlier + [line for item in group for line in item.lines] + kept
        functions.append(
            f"SK_SECTION int sk_section_{g}({arguments}) {{\n"
            f"  V = static_cast<{c_type}*>(__builtin_assume_aligned(V, 64));\n"
            + "".join(f"  {line}\n" for line in before)
            + "  int out_of_range = 0;\n"
            "  #pragma omp simd reduction(|:out_of_range)\n"
            f"  for (int j = 0; j < {width}; ++j) {{\n"
            + "".join(f"    {line}\n" for line in body)
            + "  }\n  return out_of_range;\n}\n")
    held_values = ", ".join(names[s] for s in invariants) or "0"
    prologue = [f"const {c_type} H[] = {{{held_values}}};",
                f"std::vector<{c_type}> V_rows({max(1, len(slots)) * width} + 64 / sizeof({c_type}));",
                f"{c_type}* const V = sk_aligned(V_rows.data());"]
    block = "int out_of_range = 0;" + "".join(
        f"\n    out_of_range |= sk_section_{g}({passed});" for g in range(len(groups)))
    source = (f"// a block in {len(groups)} sections (SECTION_OPERATIONS); {len(slots)} values pass "
              "between them through V\n" + "\n".join(functions))
    return _Sectioned(source, block, prologue)


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


def c_loop_source(entries: Sequence[sp.Basic], data: Sequence[Sequence[sp.Symbol]],
                  parameters: Sequence[sp.Symbol], leaf_sizes: Sequence[int],
                  dtype: str) -> CLoopSource:
    """The C++ of a loop computing `entries` (every equation's scalar entries, row-major,
    equation after equation: `leaf_sizes` of them each) for every sample.

    `data`: each data argument's symbols in the order a sample's values lie; `parameters`:
    every parameter symbol in the order of the flat parameter buffer; `dtype`: "float32" or
    "float64".
    """
    if dtype not in C_TYPES:
        raise BuildError(f"cpu_loop='c': the C loop computes float32 or float64, not {dtype}")
    # shared values and assignments of bounded depth (symkern.codegen.linearize), so that
    # nothing below -- SymPy's own walks, its printer -- recurses on an entry's depth
    shared, reduced = linearize([sp.sympify(e) for e in entries], cse=True,
                                symbols=sp.numbered_symbols("s_"))
    _refuse_unsupported([value for _, value in shared] + reduced)
    names: dict[sp.Basic, str] = {}
    for a, symbols in enumerate(data):
        names.update({s: f"x{a + 1}_{k}" for k, s in enumerate(symbols)})
    names.update({s: f"p_{k}" for k, s in enumerate(parameters)})
    names.update({symbol: f"s_{k}" for k, (symbol, _) in enumerate(shared)})
    # the inline functions the values call, and sp.Pow where one of them is pow
    used = {sp.Pow if isinstance(node, sp.Pow) else node.func
            for value in [v for _, v in shared] + list(reduced)
            for node in value.atoms(*INLINE_FUNCTIONS, sp.Pow)
            if not isinstance(node, sp.Pow) or calls_pow(node)}
    c_type = C_TYPES[dtype]
    width = BLOCK[dtype]

    # a shared value or an entry varies from sample to sample where it reads a data symbol or
    # a shared value that does; the others are computed once a call, as `each` computes them
    # (`hoisted`), and a block copies its invariant entries into its rows from a row of them
    varying: set[sp.Basic] = {s for symbols in data for s in symbols}
    for symbol, value in shared:
        if value.free_symbols & varying:
            varying.add(symbol)
    varies = [bool(value.free_symbols & varying) for value in reduced]
    places = [(leaf, size, k) for leaf, size in enumerate(leaf_sizes) for k in range(size)]
    # the entries that vary: (their index among the entries, their place, their value)
    varying_entries = [(n, place, value) for n, (place, value, v)
                       in enumerate(zip(places, reduced, varies, strict=True)) if v]

    # what a varying statement holds that no data reaches (a parameter's function, a product
    # of parameters) is computed once a call too, under a name of its own (`h_K`), as `each`
    # computes it: a block then computes none of it, whole or in sections
    walks = {symbol: _walk(value, varying) for symbol, value in shared if symbol in varying}
    walks.update({n: _walk(value, varying) for n, _, value in varying_entries})
    parts: dict[sp.Basic, str] = {}
    for walk in walks.values():
        for part in walk.parts:
            parts.setdefault(part, f"h_{len(parts)}")
    printer = _Printer(dtype, names, inline_only=False)
    # the varying statements, by name where they hold a part: checked (`each`) and inline
    checked = _Printer(dtype, names, inline_only=False, parts=parts)
    inline = _Printer(dtype, names, inline_only=True, parts=parts)

    def checks(calls: Sequence[sp.Basic]) -> list[str]:
        return [f"out_of_range |= !sk_pow_within({inline.doprint(call.base)}, "
                f"{inline.doprint(call.exp)});" if isinstance(call, sp.Pow) else
                f"out_of_range |= !sk_{call.func.__name__}_within({inline.doprint(call.args[0])});"
                for call in calls]

    def row(kind: str, index: int, size: int, opaque: bool) -> str:
        """The length of a row of data (`kind` "x") or of an equation's entries ("o"): a
        number, or in a block the name `sk_opaque` gave it."""
        return f"w{kind}{index}" if opaque else str(size)

    def reads(sample: str, opaque: bool) -> list[str]:
        return [f"const {c_type} {names[s]} = "
                f"X{a + 1}[{sample} * {row('x', a + 1, len(symbols), opaque)} + {k}];"
                for a, symbols in enumerate(data) for k, s in enumerate(symbols)]

    # once a call: the invariant shared values, the parts, and each equation's invariant
    # entries in a row of its own (`t{leaf}`, on the heap: an equation may have any number of
    # entries), all with the inline functions checked (`sk_F`)
    hoisted = [f"const {c_type} {names[symbol]} = {printer.doprint(value)};"
               for symbol, value in shared if symbol not in varying]
    hoisted += [f"const {c_type} {name} = {printer.doprint(part)};" for part, name in parts.items()]
    invariant: dict[int, list[tuple[int, str]]] = {}
    for (leaf, _, k), value, v in zip(places, reduced, varies, strict=True):
        if not v:
            invariant.setdefault(leaf, []).append((k, printer.doprint(value)))
    # sample by sample (`each`): what `hoisted` computes once, then every varying value and
    # every entry
    each_prologue = list(hoisted)
    each_body = reads("i", opaque=False) + [
        f"const {c_type} {names[symbol]} = {checked.doprint(value)};"
        for symbol, value in shared if symbol in varying] + [
        f"O{leaf}[i * {size} + {k}] = {checked.doprint(value)};"
        for _, (leaf, size, k), value in varying_entries] + [
        f"O{leaf}[i * {leaf_sizes[leaf]} + {k}] = t{leaf}[{k}];"
        for leaf, cells in invariant.items() for k, _ in cells]
    row_copies, stage_copies = [], []
    for leaf, cells in invariant.items():
        held_row = [f"std::vector<{c_type}> t{leaf}({leaf_sizes[leaf]});"]
        held_row += [f"t{leaf}[{k}] = {result};" for k, result in cells]
        hoisted += held_row
        each_prologue += held_row
        places_of = [k for k, _ in cells]
        row_copies += _copies(leaf, leaf_sizes[leaf], places_of, f"D{leaf} + j * {leaf_sizes[leaf]}")
        stage_copies += _copies(leaf, leaf_sizes[leaf], places_of,
                                f"S{leaf}.data() + j * {leaf_sizes[leaf]}")
    # a block: the varying values, vectorized, each inline function's argument checked; in
    # sections where it holds more than SECTIONS_ABOVE_OPERATIONS operations
    items = [_Statement(checks(walks[symbol].calls)
                        + [f"const {c_type} {names[symbol]} = {inline.doprint(value)};"],
                        walks[symbol], symbol)
             for symbol, value in shared if symbol in varying]
    items += [_Statement(checks(walks[n].calls)
                         + [f"D{leaf}[j * wo{leaf} + {k}] = {inline.doprint(value)};"],
                         walks[n], None)
              for n, (leaf, _, k), value in varying_entries]
    rows = ([f"const int64_t wx{a + 1} = sk_opaque({len(symbols)});" for a, symbols in enumerate(data)]
            + [f"const int64_t wo{leaf} = sk_opaque({size});" for leaf, size in enumerate(leaf_sizes)])
    groups = _sections(items)
    section_source = ""
    if len(groups) < 2:
        block_body = reads("(i0 + j)", opaque=True) + [line for item in items for line in item.lines]
        block = (f"int out_of_range = 0;\n    #pragma omp simd reduction(|:out_of_range)\n"
                 f"    for (int j = 0; j < {width}; ++j) {{\n      "
                 + "\n      ".join(block_body) + "\n    }")
    else:
        sectioned = _sectioned_block(groups, data, {**names, **parts}, len(leaf_sizes), c_type,
                                     width)
        section_source, block = sectioned.source, sectioned.block
        rows += sectioned.prologue
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
        + ["int64_t threads", "int64_t grain", "int64_t huge_page", "int64_t stream"])
    binding = "".join([f".Arg<ffi::Buffer<ffi::{ffi_type}>>()"] * (len(data) + 1)
                      + [f".Ret<ffi::Buffer<ffi::{ffi_type}>>()"] * len(leaf_sizes)
                      + ['.Attr<int64_t>("threads")', '.Attr<int64_t>("grain")',
                         '.Attr<int64_t>("huge_page")', '.Attr<int64_t>("stream")'])
    indent = "\n    "
    advice = [f"sk_huge_pages(o{leaf}->typed_data(), o{leaf}->size_bytes(), huge_page);"
              for leaf in range(len(leaf_sizes))]
    # a block's rows: streamed out of a stage (`S{leaf}`, its invariant entries written once a
    # call), or the result's own rows, into which a block first copies the invariant entries
    stages = [f"std::vector<{c_type}> S{leaf}(stream ? {width * size} : 0);"
              for leaf, size in enumerate(leaf_sizes)]
    if stage_copies:
        stages.append(f"if (stream) for (int j = 0; j < {width}; ++j) {{{indent}  "
                      + (indent + "  ").join(stage_copies) + f"{indent}}}")
    destinations = "".join(
        f"\n    {c_type}* const D{leaf} = stream ? S{leaf}.data() : O{leaf} + i0 * {size};"
        for leaf, size in enumerate(leaf_sizes))
    copy_loop = destinations + ("" if not row_copies else (
        f"\n    if (!stream) for (int j = 0; j < {width}; ++j) {{{indent}  "
        + (indent + "  ").join(row_copies) + f"{indent}}}"))
    puts = " ".join(f"sk_stream(O{leaf} + i0 * {size}, S{leaf}.data(), {width * size});"
                    for leaf, size in enumerate(leaf_sizes))
    finish = (f"if (out_of_range) each({call_arguments}, i0, i0 + {width});\n"
              f"    else if (stream) {{ {puts} }}")
    body = f"""// generated by symkern.codegen.c_loop: {len(entries)} entries, {len(shared)} shared values
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <immintrin.h>
#include "xla/ffi/api/ffi.h"
namespace ffi = xla::ffi;
{ATTRIBUTES}// a section of a long block: a function of its own, which the compiler optimizes alone
#define SK_SECTION static __attribute__((noinline))

// x**N for an integer N >= 1, by repeated squaring (as XLA's integer_pow), unrolled when compiled
template <int N>
SK_INLINE {c_type} sk_powi({c_type} x) {{
  if constexpr (N == 1) {{
    return x;
  }} else if constexpr (N % 2 == 0) {{
    const {c_type} half = sk_powi<N / 2>(x);
    return half * half;
  }} else {{
    return x * sk_powi<N - 1>(x);
  }}
}}

{inline_source(used, dtype)}
// a block's rows, `n` numbers from `stage`, written to `out` with non-temporal stores (past
// the caches, without reading the lines first) where `out` is aligned to the vector (a
// block's rows are 64 bytes times the row length, and the threads' parts begin at whole
// blocks), else copied
SK_INLINE void sk_stream({c_type}* out, const {c_type}* stage, int64_t n) {{
#if defined(__AVX512F__)
  if ((reinterpret_cast<uintptr_t>(out) & 63) == 0) {{
    for (int64_t b = 0; b < n * int64_t(sizeof({c_type})); b += 64)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(reinterpret_cast<char*>(out) + b),
                          _mm512_loadu_si512(reinterpret_cast<const char*>(stage) + b));
    return;
  }}
#elif defined(__AVX__)
  if ((reinterpret_cast<uintptr_t>(out) & 31) == 0) {{
    for (int64_t b = 0; b < n * int64_t(sizeof({c_type})); b += 32)
      _mm256_stream_si256(reinterpret_cast<__m256i*>(reinterpret_cast<char*>(out) + b),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                              reinterpret_cast<const char*>(stage) + b)));
    return;
  }}
#endif
  std::memcpy(out, stage, n * sizeof({c_type}));
}}

// the non-temporal stores of a thread made visible before it finishes
SK_INLINE void sk_fence() {{
#if defined(__SSE2__)
  _mm_sfence();
#endif
}}

// `p` rounded up to a multiple of 64 bytes
template <typename T>
SK_INLINE T* sk_aligned(T* p) {{
  return reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}}

// a row length the compiler may not assume. Knowing it, g++ vectorizes the block's reads of
// a sample's data and writes of its entries only where a row holds 2^k or 3 numbers (the
// groups it can permute), and otherwise leaves the whole block one sample at a time; not
// knowing it, it reads and writes them number by number and vectorizes the arithmetic
SK_INLINE int64_t sk_opaque(int64_t n) {{
  asm("" : "+r"(n));
  return n;
}}

// sample by sample, each inline function taking the C library's value outside its condition
static void each({arguments}, int64_t lo, int64_t hi) {{
  {(indent[:-2]).join(parameter_reads + each_prologue)}
  for (int64_t i = lo; i < hi; ++i) {{
    {indent.join(each_body)}
  }}
}}

{section_source}
// {width} samples at a time as one vectorized loop, the inline functions their inline forms
// alone; a block with an argument outside a condition (or NaN) is computed again sample by
// sample (`each`, which writes over it and gives a sample within the conditions the same
// operations, so the same value). What no data reaches is computed once, as `each` computes
// it, and a block copies those entries into its rows before its vectorized loop writes the rest;
// with `stream`, the block writes into a stage of its rows that holds those entries from the
// start, and streams the stage into the result past the caches
static void loop({arguments}, int64_t lo, int64_t hi, int64_t stream) {{
  {(indent[:-2]).join(parameter_reads + hoisted + rows + stages)}
  int64_t i0 = lo;
  for (; i0 + {width} <= hi; i0 += {width}) {{{copy_loop}
    {block}
    {finish}
  }}
  each({call_arguments}, i0, hi);
  if (stream) sk_fence();
}}

// the part of an output buffer made of whole huge pages of `huge_page` bytes (0: none),
// advised to be backed by them: the loop writes every byte of it, and a fresh mapping is
// faulted in once a huge page instead of once a 4 KiB page
static void sk_huge_pages(void* data, size_t bytes, int64_t huge_page) {{
#if defined(MADV_HUGEPAGE)
  if (huge_page <= 0) return;
  const uintptr_t mask = uintptr_t(huge_page) - 1;
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(data) + mask) & ~mask;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(data) + bytes) & ~mask;
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE);
#endif
}}

// the batch in `threads` contiguous parts of at least `grain` samples, one a thread
static ffi::Error run_batch({handler_arguments}) {{
  const int64_t samples = o0->dimensions()[0];
  {" ".join(advice)}
  int64_t parts = samples / (grain > 0 ? grain : 1);
  if (parts > threads) parts = threads;
  if (parts < 2) {{
    loop({pointers}, 0, samples, stream);
    return ffi::Error::Success();
  }}
  // parts begin at whole blocks, so that a block's rows start where the first part's do
  const auto bound = [&](int64_t part) {{
    return part == parts ? samples : samples * part / parts / {width} * {width};
  }};
  std::vector<std::thread> others;
  for (int64_t part = 1; part < parts; ++part)
    others.emplace_back([&, part] {{
      loop({pointers}, bound(part), bound(part + 1), stream);
    }});
  loop({pointers}, 0, bound(1), stream);
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


__all__ = ["C_FUNCTIONS", "INTEGER_POWER_UP_TO", "CLoopSource", "c_loop_source", "calls_pow"]
