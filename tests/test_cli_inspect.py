"""`python -m symkern inspect`: the four stages of a kernel, from text that is never run."""

import re
import subprocess
import sys

import pytest
import sympy as sp

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
    ("9**9**9", "a numeric power"),
    ("getattr(x0, 'real')", "unknown function 'getattr'"),
    ("eval('1')", "unknown function 'eval'"),
    ("__builtins__", "unknown name '__builtins__'"),
    ("x0 +", "not an expression"),
])
def test_inspect_rejects_anything_but_an_expression_before_evaluating_it(capsys, monkeypatch,
                                                                         text, message):
    def must_not_run(*args, **kwargs):
        raise AssertionError("parse_expr was reached")

    monkeypatch.setattr(parse, "parse_expr", must_not_run)
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
