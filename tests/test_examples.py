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


def test_a_diffrax_ensemble_under_vmap_matches_lambdify_jax():
    assert load("diffrax_ensemble").main(trajectories=16, t1=0.5) < 1e-4


def test_an_optax_loop_trains_a_symbolic_network_with_jnp_gradients():
    report = load("optax_training").main(steps=150)
    assert report["gradient_difference"] < 1e-5
    assert report["last_loss"] < 0.5 * report["first_loss"]


def test_a_burgers_pinn_residual_and_gradient_match_forward_mode_jax():
    report = load("burgers_pinn").main(steps=30)
    assert report["residual_difference"] < 1e-5 and report["gradient_difference"] < 1e-5
    assert report["last_loss"] < report["first_loss"]


def test_a_kernel_inside_an_equinox_module_matches_jnp():
    assert load("equinox_module").main() < 1e-5


def test_a_batched_kalman_filter_of_matrix_symbols_matches_numpy():
    report = load("kalman_filter").main(filters=20, steps=10)
    assert report["max_difference"] < 1e-10
    assert report["final_position_error"] < report["measurement_noise"]
