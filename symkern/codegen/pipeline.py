"""codegen, stages 1 and 2 together: equations and arguments in, rewritten kernel source out.

Imports the rest of symkern.codegen, symkern.symbolic and symkern.errors.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import astor
import numpy as np

from symkern.codegen import rules
from symkern.codegen.emit import EmittedCode, emit
from symkern.codegen.stopwatch import Stopwatch
from symkern.collector import collection_paused
from symkern.symbolic.arguments import ArgumentSpec, EquationSet, matrices_of_conditions


@dataclass(frozen=True)
class GeneratedCode:
    """The product of stages 1 and 2: SymPy's source, the rewritten tree and its source.

    The passes of symkern.codegen.passes carry it on: `form` is the body's form (one of
    `passes.FORMS`: "scalar" as the rules leave it), `assembly` how its matrix-shaped outputs
    are assembled (None until `decide_assembly`), `polynomial_trig` whether its sin and cos
    are symkern.codegen.trig's.
    """

    upstream: EmittedCode
    module: ast.Module
    source: str
    timings: Mapping[str, float] = field(default_factory=dict)
    literals: tuple[rules.HoistedLiteral, ...] = ()
    form: str = "scalar"
    assembly: str | None = None
    polynomial_trig: bool = False
    #: per equation, whether its entries come back without batch axes
    #: (`constant_outputs="unbatched"`, rules.broadcast_constant_outputs); () for none
    unbatched: tuple[bool, ...] = ()

    def __str__(self) -> str:
        return self.source


FLOAT32 = np.dtype("float32")


def print_source(module: ast.Module) -> str:
    """The tree as readable source, one statement a line (astor, without its line wrapping)."""
    return astor.to_source(module, pretty_source="".join)


def _printed_shape(shape: Sequence[int]) -> tuple[int, ...]:
    # A column Matrix is printed as array([[a], [b]]): nesting (m, 1) for result shape (m,).
    return (shape[0], 1) if len(shape) == 1 else tuple(shape)


def _rule_facts(equations: EquationSet, arguments: Sequence[ArgumentSpec],
                data_count: int) -> dict:
    """What the rules read of the equations and arguments."""
    return {
        "data_ranks": {f"x{k + 1}": len(spec.shape)
                       for k, spec in enumerate(arguments[:data_count])},
        "printed_shapes": [_printed_shape(shape) if hasattr(leaf, "rows") else shape
                           for leaf, shape in zip(equations.leaves, equations.shapes, strict=True)],
        "parameter_paths": [spec.path for spec in arguments[data_count:]],
    }


def rule_sequence(
    emitted: EmittedCode,
    equations: EquationSet,
    arguments: Sequence[ArgumentSpec],
    data_count: int,
    *,
    embed_max_bytes: int = 32,
    dtype: np.dtype = FLOAT32,
    hoisted: list[rules.HoistedLiteral] | None = None,
    unbatched: list[bool] | None = None,
) -> list[tuple[str, Callable[[ast.Module], ast.Module]]]:
    """The rules in their fixed order, each bound to what it needs to know.

    `hoisted` receives the array literals `hoist_array_literals` takes out of the code;
    `unbatched`, where given, the equations `broadcast_constant_outputs` left unbatched.
    """
    hoisted = [] if hoisted is None else hoisted
    facts = _rule_facts(equations, arguments, data_count)
    data_ranks, paths = facts["data_ranks"], facts["parameter_paths"]
    printed_shapes = facts["printed_shapes"]
    return [
        ("substitute_arguments", lambda m: rules.substitute_arguments(
            m, emitted.argument_names, data_count, paths)),
        ("unfold_reductions", rules.unfold_reductions),
        ("resolve_callees", lambda m: rules.resolve_callees(m, emitted.user_functions)),
        ("use_integer_pow", rules.use_integer_pow),
        ("index_by_batch", lambda m: rules.index_by_batch(m, data_ranks)),
        ("hoist_data_reads", rules.hoist_data_reads),
        ("guard_piecewise_gradients", rules.guard_piecewise_gradients),
        ("stack_outputs", lambda m: rules.stack_outputs(m, printed_shapes)),
        ("broadcast_constant_outputs", lambda m: rules.broadcast_constant_outputs(
            m, list(data_ranks.values()), [math.prod(s) for s in printed_shapes], unbatched)),
        ("hoist_array_literals", lambda m: rules.hoist_array_literals(
            m, embed_max_bytes, dtype, hoisted)),
    ]


def apply_rules(
    module: ast.Module,
    emitted: EmittedCode,
    equations: EquationSet,
    arguments: Sequence[ArgumentSpec],
    data_count: int,
    *,
    embed_max_bytes: int = 32,
    dtype: np.dtype = FLOAT32,
    hoisted: list[rules.HoistedLiteral] | None = None,
    unbatched: list[bool] | None = None,
) -> ast.Module:
    """`module` through every rule of `rule_sequence`, in one walk (`rules.apply_rules`)."""
    return rules.apply_rules(module, argument_names=emitted.argument_names,
                             data_count=data_count, user_functions=emitted.user_functions,
                             embed_max_bytes=embed_max_bytes, dtype=dtype,
                             hoisted=[] if hoisted is None else hoisted, unbatched=unbatched,
                             **_rule_facts(equations, arguments, data_count))


def generate(
    equations: EquationSet,
    arguments: Sequence[ArgumentSpec],
    data_count: int,
    *,
    cse: bool = True,
    functions: Mapping[str, object] | None = None,
    embed_max_bytes: int = 32,
    dtype: np.dtype = FLOAT32,
    stopwatch: Stopwatch | None = None,
    share_pairs: bool = True,
    unbatched_constants: bool = False,
) -> GeneratedCode:
    """Emit the per-sample code for `equations`, then apply every rule in order (the
    garbage collector paused: symkern.collector). `unbatched_constants`: an equation that
    reads no data keeps its own shape (`constant_outputs="unbatched"`)."""
    stopwatch = stopwatch or Stopwatch(progress=False)
    with collection_paused(), matrices_of_conditions():
        emitted = emit(equations, arguments, cse=cse, functions=functions, stopwatch=stopwatch,
                       share_pairs=share_pairs, complex_values=np.dtype(dtype).kind == "c")
    hoisted: list[rules.HoistedLiteral] = []
    unbatched: list[bool] | None = [] if unbatched_constants else None
    with collection_paused(), stopwatch.stage("rewrite"):
        module = apply_rules(ast.parse(emitted.source), emitted, equations, arguments,
                             data_count, embed_max_bytes=embed_max_bytes, dtype=dtype,
                             hoisted=hoisted, unbatched=unbatched)  # the rules rewrite their own copy
        source = print_source(module)
    return GeneratedCode(emitted, module, source, dict(stopwatch.timings), tuple(hoisted),
                         unbatched=tuple(unbatched or ()))
