"""The examples run in the test suite, each checked against an independent JAX reference."""

import importlib.util
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hnn_trains_and_integrates_like_jax_autodiff():
    report = load("hnn").main(steps=200, train_steps=150)
    assert report["last_loss"] < 0.1 * report["first_loss"]
    assert report["max_difference"] < 1e-4


def test_parameter_gradient_of_a_jacobian_entry_matches_nested_autodiff():
    assert load("double_derivative").main() < 1e-10
