"""`python -m symkern inspect`: the four stages of a kernel, from text that is never run."""

import functools
import os
import re
import subprocess
import sys
import time

import pytest
import sympy as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from symkern import cli
from symkern.errors import BuildError
from symkern.symbolic import parse
from symkern.symbolic.parse import parse_expression, resolve_sympy_functions


def inspect(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(["inspect", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_inspect_prints_the_four_stages(capsys):
    code, out, _ = inspect(capsys, "sin(x0) * a + x1**2", "--data", "x0,x1", "--params", "a")
    assert code == 0
    assert "def _lambdifygenerated(_a0, _a1):" in out                           # stage 1
    assert "def kernel(x1, ps):" in out and "_d0 = x1[..., 0]" in out           # stage 2
    assert "{ lambda" in out and re.search(r"f(32|64)\[8,2\]", out)             # stage 3
    assert "func.func public @main" in out and "stablehlo.sine" in out          # stage 4


def test_inspect_follows_the_cse_flag(capsys):
    text = "sin(x0 * x1) + sin(x0 * x1)**2"
    assert "_c0 = " in inspect(capsys, text, "--data", "x0,x1", "--cse")[1]
    assert "_c0 = " not in inspect(capsys, text, "--data", "x0,x1", "--no-cse")[1]


def test_each_data_option_is_one_argument_and_a_single_name_is_a_scalar(capsys):
    code, out, _ = inspect(capsys, "Piecewise((sqrt(x0), x0 > 0), (t, True)) * a",
                           "--data", "x0,x1", "--data", "t", "--params", "a", "--batch", "3")
    assert code == 0
    assert "def kernel(x1, x2, ps):" in out
    assert re.search(r"f(32|64)\[3,2\] \w+:f(32|64)\[3\] \w+:f(32|64)\[\]\. let", out)


@pytest.mark.parametrize(("text", "message"), [
    ("__import__('os').system('echo hacked')", "not allowed: calling \"__import__('os').system\""),
    ("x0.__class__", "not allowed: attribute access"),
    ("().__class__", "not allowed: attribute access"),
    ("lambda: 1", "not allowed: lambdas"),
    ("x0[0]", "not allowed: subscripts"),
    ("sin('x0')", "not allowed: the constant 'x0'"),
    ("sin(x0, evaluate=False)", "not allowed: keyword arguments"),
    ("x0 == x1", "use Eq(a, b)"),
    ("0 < x0 < 1", "chained comparisons"),
    ("x0 if x1 else 0", "use Piecewise"),
    ("[x0, x1]", "not allowed: List"),
    ("(x0, x1)", "a tuple outside a function's arguments"),
    ("getattr(x0, 'real')", "unknown function 'getattr'"),
    ("eval('1')", "unknown function 'eval'"),
    ("__builtins__", "unknown name '__builtins__'"),
    ("x0 +", "not an expression"),
])
def test_inspect_rejects_anything_but_an_expression_before_evaluating_it(capsys, monkeypatch,
                                                                         text, message):
    def must_not_run(*args, **kwargs):
        raise AssertionError("the expression was evaluated")

    monkeypatch.setattr(parse, "_evaluate", must_not_run)
    code, out, err = inspect(capsys, text, "--data", "x0,x1")
    assert code == 2 and out == ""
    assert err.startswith("error: EXPR: ") and message in err


def test_a_shell_command_in_the_expression_never_runs(tmp_path):
    marker = tmp_path / "hacked"
    text = f"__import__('os').system('echo hacked > {marker}')"
    result = subprocess.run([sys.executable, "-m", "symkern", "inspect", text, "--data", "x0"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "not allowed: calling" in result.stderr
    assert not marker.exists() and "hacked" not in result.stdout


@pytest.mark.parametrize(("data", "message"), [
    ("x0,__class__", "'__class__': expected an identifier that does not start with an underscore"),
    ("x0,lambda", "'lambda': expected an identifier"),
    ("x0,x0", "declared more than once"),
    ("x0,sin", "these names are SymPy functions"),
])
def test_inspect_rejects_bad_symbol_names(capsys, data, message):
    code, _, err = inspect(capsys, "x0", "--data", data)
    assert code == 2 and message in err


def test_parse_expression_keeps_numbers_exact_and_reads_only_declared_names():
    x = sp.Symbol("x")
    functions = resolve_sympy_functions(["exp", "Piecewise"])
    assert parse_expression("exp(x) / 2 + 0.5", {"x": x}, functions) == sp.exp(x) / 2 + sp.Float(0.5)
    with pytest.raises(BuildError, match="unknown name 'y'"):
        parse_expression("x + y", {"x": x}, functions)
    with pytest.raises(BuildError, match="expected a numeric expression"):
        parse_expression("x > 0", {"x": x}, functions)


# ---- bounds: nothing hangs, recurses or prints a huge number ----------------------------------

TOWER = "**".join(["x0"] * 2400)


@pytest.mark.parametrize(("text", "message"), [
    ("(x0*0 + 2)**(10**1000)", "more than 308 digits"),
    ("(x0*0 + 2)**(x0*0 + 10**1000)", "more than 308 digits"),
    ("(x0*0 + 2)**(x0*0 + 10**90)", "a power with an exact result of more than 308 digits"),
    ("(2*x0)**(10**9)", "a power with an exact result"),
    ("sqrt(x0*0 + 2)**(10**9)", "a power with an exact result"),
    ("(x0*0 + 3)**(10**6)", "a power with an exact result"),
    ("9**9**9", "a power with an exact result"),
    ("Pow(x0*0 + 2, 10**90)", "a power with an exact result"),
    ("root(x0*0 + 2, Rational(1, 10**9))", "a power with an exact result"),
    ("exp2(x0*0 + 10**9)", "a power with an exact result"),
    ("exp(10**9*log(x0*0 + 2))", "a power with an exact result"),
    ("gamma(10**9)", "gamma of a number above 300"),
    ("gamma(10**5)*x0", "gamma of a number above 300"),
    ("loggamma(x0*0 + 10**6)", "loggamma of a number above 300"),
    ("polygamma(2, 10**6)", "polygamma of a number above 300"),
    ("polygamma(300, 300)*x0", "polygamma of numbers whose product is above 3,000"),
    ("chebyshevt(10**6, x0)", "chebyshevt of a number above 300"),
    ("zeta(10**6) + x0", "zeta of a number above 300"),
    ("factorial(10**9) + x0", "factorial of a number above 300"),
    ("binomial(x0*0 + 10**9, 7) + x0", "binomial of a number above 300"),
    ("harmonic(300, 300) + x0", "harmonic of numbers whose product is above 3,000"),
    ("gamma(300)*x0", "an exact number of more than 308 digits"),
    ("x0 * " + "1" * 400, "an integer of more than 308 digits"),
    ("x0 * 0x" + "f" * 300, "an integer of more than 308 digits"),
    ("x0 * (10**200 * 10**200)", "an exact number of more than 308 digits"),
    ("floor(exp(10**6))*x0", "a number of more than 308 digits"),
    ("Mod(exp(10**50), 7) + x0", "a number of more than 308 digits"),
    ("floor(exp(700)) + x0", "a number SymPy cannot evaluate"),
    ("Max(-x0, atan2(acos(2), 1))", "the complex number acos(2)"),
    ("(x0*0 + 10)**309 * x1", "a power with an exact result of more than 308 digits"),
    ("-" * 100 + "x0", "nesting deeper than 100 levels"),
    ("**".join(["x0"] * 18), "powers nested more than 16 high"),
    ("digamma(301) + x0", "digamma of a number above 300"),
    ("polygamma(11, 300) + x0", "polygamma of numbers whose product is above 3,000"),
    ("polygamma(10, 300) + x0", "an exact number of more than 308 digits"),
    ("sqrt(x0*0 - 1) * x1", "the complex number I"),
    # Python's parser refuses it, or the depth check after it where the process's recursion
    # limit is higher (PyTensor raises it to 3,000 on import): either way a refusal by depth
    ("-" * 4000 + "x0", "100 levels"),
    ("-" * 150 + "x0", "nesting deeper than 100 levels"),
    (TOWER, "powers nested more than 16 high"),
    ("sin + x0", "the function sin used as a value"),
])
def test_inspect_refuses_what_would_hang_or_recurse_within_seconds(capsys, text, message):
    # the processor time of this process: what a runaway parse or recursion spends, and not
    # what another process on a loaded machine takes from the wall clock
    start = time.process_time()
    code, out, err = inspect(capsys, "--data", "x0,x1", "--params", "a", "--", text)
    assert time.process_time() - start < 5
    assert code == 2 and out == "", err
    assert err.startswith("error: EXPR: ") and message in err, err
    assert "Traceback" not in err and len(err) < 1000


@pytest.mark.parametrize(("text", "expected"), [
    ("+".join(["x0"] * 2500), 2500 * sp.Symbol("x0")),
    ("*".join(["x0"] * 2500), sp.Symbol("x0") ** 2500),
    ("2.0**(10**9) * x0", sp.Float(2.0) ** (10**9) * sp.Symbol("x0")),
    ("-" * 40 + "x0", sp.Symbol("x0")),
    ("x0**2**3", sp.Symbol("x0") ** 8),
    ("(x0*0 + 2)**300 * x1", sp.Integer(2) ** 300 * sp.Symbol("x1")),
    ("gamma(60)*x0 + exp(100*log(x0*0 + 2))", sp.gamma(60) * sp.Symbol("x0") + 2**100),
    ("floor(10**90*pi)*x0", sp.floor(10**90 * sp.pi) * sp.Symbol("x0")),
    ("(x0*0 + 10)**300 * x1", sp.Integer(10) ** 300 * sp.Symbol("x1")),
    ("-" * 98 + "x0", sp.Symbol("x0")),
    ("**".join(["x0"] * 17), functools.reduce(lambda e, b: b**e, [sp.Symbol("x0")] * 17)),
    ("digamma(300) + x0", sp.digamma(300) + sp.Symbol("x0")),
    ("chebyshevt(300, x0)", sp.chebyshevt(300, sp.Symbol("x0"))),
    ("x0 - x1/2 - 3*x0*x1/x0", sp.Symbol("x0") - sp.Symbol("x1") / 2 - 3 * sp.Symbol("x1")),
    ("Piecewise((x0, x0 > 0), (-x0, True)) % 3",
     sp.Mod(sp.Piecewise((sp.Symbol("x0"), sp.Symbol("x0") > 0), (-sp.Symbol("x0"), True)), 3)),
])
def test_long_and_large_inputs_within_the_bounds_build_the_right_expression(text, expected):
    x0, x1 = sp.symbols("x0 x1")
    functions = resolve_sympy_functions(["gamma", "exp", "log", "Piecewise", "floor", "pi",
                                         "digamma", "chebyshevt"])
    start = time.process_time()
    assert parse_expression(text, {"x0": x0, "x1": x1}, functions) == expected
    assert time.process_time() - start < 5


def test_a_2500_term_sum_is_inspected(capsys):
    text = "+".join(["x0", "1", "x0*x0"] * 834)
    assert len(text) > 7_000
    code, out, err = inspect(capsys, "--data", "x0", "--batch", "2", "--", text)
    assert code == 0, err
    assert "expression: 834*x0**2 + 834*x0 + 834" in out and "func.func public @main" in out


def test_inspect_bounds_the_batch(capsys):
    with pytest.raises(SystemExit):
        cli.main(["inspect", "x0", "--data", "x0", "--batch", str(10**12)])
    assert "--batch: expected a number of samples from 1 to 1,048,576" in capsys.readouterr().err


TOKENS = ["x0", "x1", "a", "2", "3", "0", "10", "300", "1000", "0.5", "1e300", "**", "*", "+",
          "-", "/", "%", "(", ")", ",", "<", "gamma(", "exp(", "log(", "sqrt(", "polygamma(",
          "root(", "Pow(", "exp2(", "Piecewise((", "True", "sin(", "Max(", "Rational(", "pi"]


@settings(max_examples=200 if os.environ.get("SYMKERN_SLOW") else 60, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=30))
def test_random_text_is_an_expression_or_a_build_error_within_seconds(tokens):
    """Property: any text gives a SymPy expression or a BuildError, in under 5 s."""
    x0, x1, a = sp.symbols("x0 x1 a")
    functions = resolve_sympy_functions(
        ["gamma", "exp", "log", "sqrt", "polygamma", "root", "Pow", "exp2", "Piecewise", "sin",
         "Max", "Rational", "pi"])
    start = time.process_time()
    try:
        result = parse_expression("".join(tokens), {"x0": x0, "x1": x1, "a": a}, functions)
    except BuildError as error:
        assert str(error).startswith(("EXPR: ", "symbol")) and len(str(error)) < 1000
    else:
        assert isinstance(result, sp.Expr)
        str(result)  # printable: no integer beyond Python's digit limit
    assert time.process_time() - start < 5
