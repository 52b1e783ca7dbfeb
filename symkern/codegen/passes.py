"""codegen: the build pipeline as data — the options of a build and its passes, in run order.

Imports the rest of symkern.codegen and symkern.errors. Open this module first: `PASSES` is
every transformation a kernel's body goes through after SymPy emitted it and the rules
rewrote it (stages 1 and 2, `symkern.codegen.pipeline.generate`), each with its gate and the
measured reason for the gate. `describe_passes()` prints the table; docs/codegen.md starts
from it; `symkern.codegen.passes.run_passes` is the only place they are applied.

A pass is a function `GeneratedCode -> GeneratedCode`. It reads the body's form from
`GeneratedCode.form` (never from generated names) and records the form it leaves; it changes
nothing when its gate is closed. Every choice a pass reads is a field of one frozen
`BuildOptions`, which `repr(kernel)` shows and the codegen cache key includes.
"""

from __future__ import annotations

import ast
import dataclasses
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from symkern.codegen import trig
from symkern.codegen.contract import contract_linear_forms, tile
from symkern.codegen.factors import scalar_factors_first
from symkern.codegen.interpret import TILE as INTERPRET_TILE
from symkern.codegen.interpret import interpret_body
from symkern.codegen.materialize import materialize_shared
from symkern.codegen.operations import exceeds_operations, operation_count
from symkern.codegen.packed_sums import sum_packed_parameters
from symkern.codegen.pipeline import GeneratedCode, print_source
from symkern.codegen.stopwatch import Stopwatch
from symkern.codegen.vectorize import parameter_shapes
from symkern.codegen.vectorize import vectorize as vectorize_body
from symkern.collector import collection_paused
from symkern.errors import BuildError

logger = logging.getLogger("symkern")

# ---- the forms a body takes -------------------------------------------------------------
#: straight-line scalar code, one statement per value (what the rules leave)
SCALAR = "scalar"
#: groups of linear forms evaluated as matrix products (`contract_linear_forms`)
CONTRACTED = "contracted"
#: a contracted body run a chunk of samples at a time (`tile`)
TILED = "tiled"
#: statements repeating one template evaluated as vectors (`vectorize`)
VECTORIZED = "vectorized"
#: a scalar body compiled as separate executables (symkern.kernels.split)
PIECES = "pieces"
#: a structured network's array program (symkern.codegen.structured)
STRUCTURED = "structured"
#: a scalar body as an instruction table run by one loop (symkern.codegen.interpret)
INTERPRETED = "interpreted"
FORMS = (SCALAR, CONTRACTED, TILED, VECTORIZED, PIECES, STRUCTURED, INTERPRETED)

#: how the scalar entries of matrix-shaped outputs become arrays
#: "fused": the entries and their stack in one executable
FUSED = "fused"
#: "separate": the entries' executable, then an assembly executable
SEPARATE = "separate"
ASSEMBLIES = (FUSED, SEPARATE)

#: sin and cos: "polynomial" where `trig.applies` (float32 and float64 on the CPU), "library" never
TRIG_CHOICES = ("polynomial", "library")
#: an output that reads no data: "broadcast" to the batch (the default), or returned
#: "unbatched", shaped like the equation alone (`jnp.broadcast_to` makes the default of it)
CONSTANT_OUTPUTS = ("broadcast", "unbatched")
#: how a kernel's calls run on the CPU: "xla", its XLA program (the default), or "c", one C++
#: loop over the batch (symkern.codegen.c_loop, symkern.batching.c_loop)
CPU_LOOPS = ("xla", "c")


def refuse_c_loop_option(options: BuildOptions, kernel: str) -> None:
    """A BuildError for `cpu_loop="c"` in a build whose program works on whole arrays
    (`kernel` names it) without a linear solve: the C loop prints scalar equations and the
    solves of matrix expressions only."""
    if options.cpu_loop != "xla":
        raise BuildError(f"cpu_loop: {options.cpu_loop!r} applies to scalar equations and to "
                         f"the linear solves of matrix expressions (build_function's); "
                         f"{kernel} computes whole arrays without one; leave it out")


def refuse_unbatched_outputs(options: BuildOptions, kernel: str) -> None:
    """A BuildError for `constant_outputs="unbatched"` in a build whose program returns
    whole arrays (`kernel` names it), where every output is shaped like the batch."""
    if options.constant_outputs != "broadcast":
        raise BuildError(f"constant_outputs: {options.constant_outputs!r} applies to scalar "
                         f"bodies; {kernel} returns every output shaped like the batch "
                         "(leave the option out, or write the constant outputs as explicit "
                         "scalar or Matrix equations in their own build_function)")
#: environment variable giving `BuildOptions.trig`'s default: "0" library, "1" or unset auto
VECTORIZED_TRIG_ENV = "SYMKERN_VECTORIZED_TRIG"

# ---- the gates, each with its measured reason ----------------------------------------------
#: bodies above this many operations are compiled as pieces of at most PIECE_OPERATIONS,
#: in two threads: at 10^4 operations that took the first result from 82 s to 19 s and ran
#: 3x faster (docs/design/pieces.md); below it one executable ran faster (4-16-16-4 network
#: Jacobian, 4,658 operations: 12.8 vs 7.0 M samples/s, first result 6.8 vs 3.9 s; 8-32-32-8
#: network: 11.4 vs 9.9 M/s, 4.3 vs 2.9 s)
SPLIT_ABOVE_OPERATIONS = 5000
PIECE_OPERATIONS = 1000
#: a body compiled whole above this many operations assembles its entries in a separate
#: executable at every batch size: the other form, the entries stacked inside the program,
#: took 10.7 s more to compile for the 4-16-16-4 Jacobian and ran no faster
SEPARATE_ABOVE_OPERATIONS = 2000
#: bodies above this many operations are vectorized by template (`vectorize=None`) when
#: that leaves at least VECTORIZE_MIN_SHRINK times fewer operations: at 10^5 operations the
#: first result fell from 42-52 s to ~7-10 s, at 10^4 from 7 s to 3.4 s at the same
#: throughput; networks below it run faster scalar (the 4-16-16-4 Jacobian's 4,658
#: operations 4.1 vectorized vs 12.3 M samples/s whole; docs/design/vectorize.md)
VECTORIZE_ABOVE_OPERATIONS = 5_000
VECTORIZE_MIN_SHRINK = 20.0
#: scalar bodies above this many operations that did not vectorize are interpreted
#: (`interpret=None`): XLA compiles their code (as pieces) at ~1.5-2 ms an operation, so
#: past ~2x10^4 the first result passes 30 s, where the interpreter's program compiles in
#: ~0.3 s whatever the body (10^4 operations: first result 17-22 s as pieces, 1.7-2.4 s
#: interpreted; 10^5: 16 s interpreted). Below it the compiled pieces run 1.0-5.9x faster
#: (the five generated shapes at 10^4, 100k samples; docs/design/interpreter.md).
INTERPRET_ABOVE_OPERATIONS = 20_000


@dataclass(frozen=True)
class BuildOptions:
    """Every choice of a build, in one value: shown by `repr(kernel)`, kept on the kernel as
    `kernel.options`, and part of the codegen cache key.

    - `cse`: common subexpressions of the equations computed once (SymPy's cse).
    - `split`: a scalar body above SPLIT_ABOVE_OPERATIONS compiles as pieces; False: whole.
    - `vectorize`: statements repeating one template as vectors: None where it pays
      (VECTORIZE_ABOVE_OPERATIONS, VECTORIZE_MIN_SHRINK), True always, False never.
    - `interpret`: a scalar body as an instruction table run by one loop (symkern.codegen.
      interpret): None above INTERPRET_ABOVE_OPERATIONS, True always, False never.
    - `contract`: groups of linear forms over the same inputs as matrix products.
    - `materialize`: costly values that several outputs read computed once.
    - `trig`: "polynomial" sin and cos where they apply (float32 and float64 on the CPU, at most
      trig.POLYNOMIAL_UP_TO_CALLS calls), "library" `jnp.sin` / `jnp.cos` always; None
      reads SYMKERN_VECTORIZED_TRIG ("0": library) at build time.
    - `assembly`: "fused" or "separate" for every batch; None decided from the body
      (`decide_assembly`). `kernel.tune(X, ps)` measures both and keeps the faster.
    - `embed_max_bytes`: array constants up to this size stay embedded in the program.
    - `dtype`: the kernel's floating dtype, by name (None: JAX's default float).
    - `tile_chunk`: a structured kernel's samples per tile (None: decided from its arrays),
      an interpreted one's (None: interpret.TILE).
    - `cpu_loop`: "xla" (the kernel's XLA program) or "c": on the CPU, calls run one C++
      loop over the batch, compiled at build time (symkern.codegen.c_loop; needs a C++
      compiler); in a kernel of matrix expressions, each batch of linear systems is solved
      by a C loop, a system at a time (symkern.codegen.c_solve); derivatives, export and
      shard run the XLA program (CPU_LOOPS).
    - `constant_outputs`: "broadcast" (every output shaped `batch + its shape`) or
      "unbatched": an output none of whose entries reads a data argument comes back with its
      own shape only, as lambdify returns it (CONSTANT_OUTPUTS; docs/guide.md).
    """

    cse: bool = True
    split: bool = True
    vectorize: bool | None = None
    interpret: bool | None = None
    contract: bool = True
    materialize: bool = True
    trig: str | None = None
    assembly: str | None = None
    embed_max_bytes: int = 32
    dtype: str | None = None
    tile_chunk: int | None = None
    constant_outputs: str = "broadcast"
    cpu_loop: str = "xla"

    def __post_init__(self) -> None:
        for name in ("cse", "split", "contract", "materialize"):
            if not isinstance(getattr(self, name), bool):
                raise BuildError(f"{name}: expected True or False, got {getattr(self, name)!r}")
        for name in ("vectorize", "interpret"):
            if getattr(self, name) not in (None, True, False):
                raise BuildError(f"{name}: expected None, True or False, got "
                                 f"{getattr(self, name)!r}")
        if self.trig is not None and self.trig not in TRIG_CHOICES:
            raise BuildError(f"trig: expected one of {TRIG_CHOICES} or None, got {self.trig!r}")
        if self.assembly is not None and self.assembly not in ASSEMBLIES:
            raise BuildError(f"assembly: expected one of {ASSEMBLIES} or None, "
                             f"got {self.assembly!r}")
        if (not isinstance(self.embed_max_bytes, int) or isinstance(self.embed_max_bytes, bool)
                or self.embed_max_bytes < 0):
            raise BuildError("embed_max_bytes: expected a non-negative int, "
                             f"got {self.embed_max_bytes!r}")
        if self.cpu_loop not in CPU_LOOPS:
            raise BuildError(f"cpu_loop: expected one of {CPU_LOOPS}, got {self.cpu_loop!r}")
        if self.constant_outputs not in CONSTANT_OUTPUTS:
            raise BuildError(f"constant_outputs: expected one of {CONSTANT_OUTPUTS}, "
                             f"got {self.constant_outputs!r}")
        if self.tile_chunk is not None and (not isinstance(self.tile_chunk, int)
                                            or isinstance(self.tile_chunk, bool)
                                            or self.tile_chunk < 1):
            raise BuildError(f"tile_chunk: expected a positive int or None, got {self.tile_chunk!r}")

    def resolved(self, dtype: np.dtype) -> BuildOptions:
        """These options with every default that is read at build time filled in."""
        trig_choice = self.trig
        if trig_choice is None:
            setting = os.environ.get(VECTORIZED_TRIG_ENV, "").strip()
            if setting not in ("", "0", "1"):
                raise BuildError(f"{VECTORIZED_TRIG_ENV}: expected 1 (polynomial sin and cos "
                                 "where they apply) or 0 (jnp.sin and jnp.cos everywhere), "
                                 f"got {setting!r}")
            trig_choice = "library" if setting == "0" else "polynomial"
        return dataclasses.replace(self, trig=trig_choice, dtype=np.dtype(dtype).name)

    def key(self) -> dict[str, Any]:
        """The options as the cache key reads them."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PassContext:
    """What a pass may read besides the program: the options, the number of data arguments
    (and their ranks), the parameters' paths and shapes, whether the kernel takes them packed into one buffer
    (symkern.batching.packing), the backend the kernel is built for, and the stopwatch
    timing the stages."""

    options: BuildOptions
    data_count: int = 0
    parameter_paths: Sequence[tuple] = ()
    parameter_shapes: Sequence[tuple[int, ...]] = ()
    backend: str = "cpu"
    stopwatch: Stopwatch | None = None
    packed_parameters: bool = False
    #: each data argument's per-sample rank (0: one number a sample)
    data_ranks: Sequence[int] = ()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.options.dtype)


@dataclass(frozen=True)
class Pass:
    """One step of the pipeline: its name; `opens`, its gate (whether it applies to a program
    under the options); `apply`, what it does then; and, as text for the table, the gate,
    the measured reason for it, and what it changes in `kernel.source`."""

    name: str
    opens: Callable[[GeneratedCode, PassContext], bool]
    apply: Callable[[GeneratedCode, PassContext], GeneratedCode]
    gate: str
    reason: str
    changes: str

    def __call__(self, generated: GeneratedCode, context: PassContext) -> GeneratedCode:
        """The pass applied where its gate opens (its time in the build's timings)."""
        if not self.opens(generated, context):
            return generated
        if context.stopwatch is None:
            return self.apply(generated, context)
        with context.stopwatch.stage(self.name):
            return self.apply(generated, context)


def _replaced(generated: GeneratedCode, module: ast.Module, **fields: Any) -> GeneratedCode:
    return dataclasses.replace(generated, module=module, source=print_source(module), **fields)


def _contract_opens(generated: GeneratedCode, context: PassContext) -> bool:
    return context.options.contract and generated.form == SCALAR


def contract(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """Groups of linear forms over the same per-sample values as matrix products; a body
    too big to compile whole contracts its chain-rule sums too and runs tiled."""
    module = generated.module  # changed in place only when contracted
    literals = list(generated.literals)
    # a body too big to compile whole (vectorized or in pieces, its values would go
    # through memory anyway): chain-rule sums too, run a chunk of samples at a time
    chain_rule = exceeds_operations(module, SPLIT_ABOVE_OPERATIONS)
    found = contract_linear_forms(module, context.dtype, literals, chain_rule=chain_rule)
    if found is None:
        return generated
    form = TILED if chain_rule and tile(module) else CONTRACTED
    logger.info("contracted: %d sums over shared inputs as %d matrix products (%d weights)",
                found.forms, found.groups, found.weights)
    return _replaced(generated, module, literals=tuple(literals), form=form)


def _vectorize_opens(generated: GeneratedCode, context: PassContext) -> bool:
    requested = context.options.vectorize
    if generated.form != SCALAR:
        if requested:
            raise BuildError(f"vectorize=True: the kernel body is {generated.form} "
                             "(its sums were contracted into matrix products, which vectorize "
                             "does not take); pass vectorize=None")
        return False
    return requested is True or (requested is None and exceeds_operations(
        generated.module, VECTORIZE_ABOVE_OPERATIONS))


def vectorize(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """Statements that repeat one template as vectors: one gather and one expression each."""
    requested = context.options.vectorize
    module = generated.module  # changed in place only when vectorized
    literals = list(generated.literals)
    shapes = parameter_shapes(list(context.parameter_paths), list(context.parameter_shapes))
    operations = operation_count(module)
    body = vectorize_body(module, context.dtype, literals, operations,
                          VECTORIZE_MIN_SHRINK if requested is None else 0.0, shapes)
    if body is None:
        if requested:
            raise BuildError("vectorize=True: the kernel body holds a form that cannot be "
                             "vectorized (see symkern.codegen.vectorize.ELEMENTWISE); pass "
                             "vectorize=None to fall back to the scalar body")
        return generated
    logger.info("vectorized: %d operations as %d groups (%d template operations) over "
                "%d levels, %d rows", operations, body.groups, body.template_nodes,
                body.levels, body.rows)
    return _replaced(generated, module, literals=tuple(literals), form=VECTORIZED)


def _packed_sums_opens(generated: GeneratedCode, context: PassContext) -> bool:
    return context.packed_parameters and generated.form == SCALAR


def _scalar_offsets(context: PassContext) -> dict[tuple, int]:
    """Each scalar parameter's path → its entry of the packed parameter buffer."""
    offsets, offset = {}, 0
    for path, shape in zip(context.parameter_paths, context.parameter_shapes, strict=True):
        if not shape:
            offsets[tuple(path)] = offset
        offset += math.prod(shape)
    return offsets


def packed_sums(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """Long sums of scalar parameters as sums over runs of the packed parameter buffer."""
    offsets = _scalar_offsets(context)
    module = generated.module  # changed in place only where a chain is rewritten
    if not sum_packed_parameters(module, offsets):
        return generated
    return _replaced(generated, module)


def _interpret_opens(generated: GeneratedCode, context: PassContext) -> bool:
    requested = context.options.interpret
    if generated.form != SCALAR or context.dtype.kind != "f":
        if requested:
            raise BuildError(f"interpret=True: the kernel body is {generated.form} in "
                             f"{context.dtype.name}; the interpreter takes a real scalar body "
                             "(pass interpret=None)")
        return False
    return requested is True or (requested is None and exceeds_operations(
        generated.module, INTERPRET_ABOVE_OPERATIONS))


def interpret(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """A scalar body as an instruction table run by one loop (symkern.codegen.interpret)."""
    module = generated.module  # changed in place only when interpreted
    literals = list(generated.literals)
    data_names = [f"x{k + 1}" for k in range(context.data_count)]
    whole = {name for name, rank in zip(data_names, context.data_ranks, strict=True)
             if rank == 0}
    body = interpret_body(module, data_names, whole, context.dtype, literals,
                          _scalar_offsets(context) if context.packed_parameters else None,
                          context.options.tile_chunk or INTERPRET_TILE)
    if isinstance(body, str):
        if context.options.interpret:
            raise BuildError(f"interpret=True: the kernel body holds {body}, which the "
                             "interpreter does not run (its operations: symkern.codegen."
                             "interpret.FUNCTIONS); pass interpret=None")
        return generated
    logger.info("interpreted: %d operations on %d registers, %d data columns, %d scalars, "
                "%d numbers", body.operations, body.registers, body.columns, body.scalars,
                body.numbers)
    return _replaced(generated, module, literals=tuple(literals), form=INTERPRETED)


def _split_opens(generated: GeneratedCode, context: PassContext) -> bool:
    return (context.options.split and generated.form == SCALAR
            and exceeds_operations(generated.module, SPLIT_ABOVE_OPERATIONS))


def split(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """Marks a scalar body too big to compile whole as pieces (compiled by
    symkern.kernels.split; traced calls still see the whole body)."""
    return dataclasses.replace(generated, form=PIECES)


def _always(generated: GeneratedCode, context: PassContext) -> bool:
    return True


def decide_assembly(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """How matrix-shaped outputs are assembled, the same at every batch size (a sample's
    value never depends on which executable ran: the two forms round differently)."""
    chosen = context.options.assembly
    if chosen is None:
        # a vectorized or tiled body's entries are rows of one array: stacking them inside
        # the program is a transpose, as fast as two executables (10^5 ops: 1.84 vs 1.76 s
        # at 100k, 13.0 vs 13.2 ms at 1,024), and one dispatch; a big scalar body's stack
        # costs more to compile than a second dispatch costs to run
        big = (generated.form in (SCALAR, PIECES) and
               exceeds_operations(generated.module, SEPARATE_ABOVE_OPERATIONS))
        chosen = SEPARATE if big else FUSED
    return dataclasses.replace(generated, assembly=chosen)


def _materialize_opens(generated: GeneratedCode, context: PassContext) -> bool:
    # pieces pass values through memory anyway; a contracted body's shared values are
    # arrays already (and materializing would copy the matrix products into the conditional)
    return context.options.materialize and generated.form == SCALAR


def materialize(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """Costly values that two or more outputs read, computed once inside `lax.cond`, so
    that XLA cannot copy them into each output's fusion."""
    data_names = [f"x{k + 1}" for k in range(context.data_count)]
    materialized = materialize_shared(generated.module, data_names)
    if materialized is None:
        return generated
    return _replaced(generated, materialized)


def _scalar_factors_opens(generated: GeneratedCode, context: PassContext) -> bool:
    return generated.form in (SCALAR, PIECES)


def scalar_factors(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """In every product, the factors that read no per-sample value multiplied first."""
    module = generated.module  # changed in place only where a chain is reordered
    data_names = [f"x{k + 1}" for k in range(context.data_count)]
    if not scalar_factors_first(module, data_names):
        return generated
    return _replaced(generated, module)


def _polynomial_trig_opens(generated: GeneratedCode, context: PassContext) -> bool:
    return context.options.trig == "polynomial" and trig.applies(
        generated.module, context.dtype, context.backend)


def polynomial_trig(generated: GeneratedCode, context: PassContext) -> GeneratedCode:
    """`jnp.sin` / `jnp.cos` → `trig.sin` / `trig.cos` (symkern.codegen.trig)."""
    return _replaced(generated, trig.use_polynomial(generated.module), polynomial_trig=True)


#: the passes a body goes through after stages 1 and 2, in run order. The codegen cache
#: stores the program after the first CACHED_PASSES of them.
PASSES: tuple[Pass, ...] = (
    Pass("contract", _contract_opens, contract,
         "options.contract; a scalar body (applied where it finds a group of >= 4 linear "
         "forms of >= 4 inputs and >= 64 terms: symkern.codegen.contract)",
         "a 4-16-16-4 network's layer sums as one tensordot: XLA does not find matrix "
         "products in scalar code",
         "groups of sums become `jnp.tensordot` over hoisted weight tables; above "
         "SPLIT_ABOVE_OPERATIONS the body runs tiled (`vec.chunked`)"),
    Pass("vectorize", _vectorize_opens, vectorize,
         "options.vectorize (None: a scalar body > VECTORIZE_ABOVE_OPERATIONS, applied when "
         "VECTORIZE_MIN_SHRINK-fold smaller)",
         "10^5 operations: first result 42-52 s -> 7-10 s at the same throughput",
         "repeated templates become one gather and one expression over stacked rows (`vec.`)"),
    Pass("packed_sums", _packed_sums_opens, packed_sums,
         "parameters packed into one buffer (>= PACK_FROM_LEAVES leaves); a scalar body "
         "(applied to chains of >= PACKED_SUM_MIN_TERMS scalar parameters: "
         "symkern.codegen.packed_sums)",
         "10^4 scalar parameters summed (`x * Add(*p)`): first call 27 s -> 0.25 s, the "
         "leaves' slices and additions no longer traced and compiled one by one",
         "`ps['p0'] + ps['p1'] + ...` becomes `ps.sum_slices((0, n))`"),
    Pass("interpret", _interpret_opens, interpret,
         "options.interpret (None: a real scalar body > INTERPRET_ABOVE_OPERATIONS); applied "
         "when every data-dependent operation is in interpret.FUNCTIONS",
         "10^4 operations: first result 17-22 s as compiled pieces, 1.7-2.4 s interpreted "
         "(the program compiles in under a second at any size)",
         "the body becomes `interp.run(_i0, _i1, columns, scalars, ops=...)` over an "
         "instruction table"),
    Pass("split", _split_opens, split,
         "options.split; a scalar body > SPLIT_ABOVE_OPERATIONS",
         "10^4 operations: first result 82 s -> 19 s, 3x faster run",
         "nothing: the body compiles as pieces of PIECE_OPERATIONS (form `pieces`)"),
    Pass("materialize", _materialize_opens, materialize,
         "options.materialize; a scalar body whose outputs share a costly data-dependent value",
         "XLA copies shared producers into each output's fusion",
         "shared values computed in `lax.cond` levels (`_m0`, ...)"),
    Pass("scalar_factors", _scalar_factors_opens, scalar_factors,
         "a scalar body, or one compiled as pieces",
         "SymPy orders a product's factors by name, a parameter after the per-sample values: "
         "the double pendulum multiplied its batch 8 times more (0.93x its throughput)",
         "`2 * _c1 * _d2 * ps['l1']` becomes `2 * ps['l1'] * _c1 * _d2`"),
    Pass("decide_assembly", _always, decide_assembly,
         "always; options.assembly, else separate for a scalar body > "
         "SEPARATE_ABOVE_OPERATIONS, fused otherwise",
         "the 4-16-16-4 Jacobian's in-program stack compiled 10.7 s longer and ran no faster",
         "nothing: `kernel.assembly`"),
    Pass("polynomial_trig", _polynomial_trig_opens, polynomial_trig,
         "options.trig == 'polynomial'; float32 or float64 on the CPU; at most "
         "trig.POLYNOMIAL_UP_TO_CALLS sin/cos calls",
         "XLA's CPU sin/cos is a library call per element: the pendulum 4.1x (float32), "
         "2.9x (float64) at 100k samples",
         "`jnp.sin` / `jnp.cos` become `trig.sin` / `trig.cos`"),
)
#: how many of PASSES run before the codegen cache stores the program
CACHED_PASSES = 2


def run_passes(generated: GeneratedCode, context: PassContext,
               passes: Sequence[Pass] = PASSES) -> GeneratedCode:
    """`generated` through each of `passes` in order."""
    with collection_paused():
        for step in passes:
            generated = step(generated, context)
            if generated.form not in FORMS:
                raise BuildError(f"pass {step.name}: left the unknown body form "
                                 f"{generated.form!r}")
    return generated


def describe_passes(passes: Sequence[Pass] = PASSES) -> str:
    """The pass table as Markdown: name, gate, reason, what it changes in `kernel.source`."""
    lines = ["| pass | gate | measured reason | in `kernel.source` |", "|---|---|---|---|"]
    lines += [f"| `{p.name}` | {p.gate} | {p.reason} | {p.changes} |" for p in passes]
    return "\n".join(lines)
