"""A batched Kalman filter written with MatrixSymbols, checked against numpy in float64.

Many independent targets move at constant velocity in 3-D (state: position and velocity,
6 entries); each is observed by its position with noise (3 entries). One predict-and-update
step is written as SymPy matrix algebra,

    x⁻ = F x,  P⁻ = F P Fᵀ + Q,  K = P⁻ Hᵀ (H P⁻ Hᵀ + R)⁻¹,
    x⁺ = x⁻ + K (z − H x⁻),  P⁺ = (I − K H) P⁻,

and symkern compiles it into one kernel over all filters at once: matrix products and one
inverse per filter, no entry written out. The kernel is a JAX function, so `jax.lax.scan`
runs it over the time steps. Run: python examples/kalman_filter.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import sympy as sp

import symkern as sk

STATE, MEASURED = 6, 3


def kalman_step() -> sk.Kernel:
    """The step as a kernel `step(x, P, z, ps)` with F, Q, H, R as parameters."""
    F, Q = sp.MatrixSymbol("F", STATE, STATE), sp.MatrixSymbol("Q", STATE, STATE)
    H, R = sp.MatrixSymbol("H", MEASURED, STATE), sp.MatrixSymbol("R", MEASURED, MEASURED)
    x, P = sp.MatrixSymbol("x", STATE, 1), sp.MatrixSymbol("P", STATE, STATE)
    z = sp.MatrixSymbol("z", MEASURED, 1)
    predicted_x = F * x
    predicted_P = F * P * F.T + Q
    gain = predicted_P * H.T * (H * predicted_P * H.T + R).inv()
    updated = {"x": predicted_x + gain * (z - H * predicted_x),
               "P": (sp.Identity(STATE) - gain * H) * predicted_P}
    return sk.build_function(updated, x, P, z, params={"F": F, "Q": Q, "H": H, "R": R},
                             dtype="float64")


def model(dt: float = 0.1) -> dict[str, np.ndarray]:
    F = np.eye(STATE)
    F[:3, 3:] = dt * np.eye(3)
    H = np.hstack([np.eye(3), np.zeros((3, 3))])
    return {"F": F, "Q": 1e-3 * np.eye(STATE), "H": H, "R": 0.05 * np.eye(MEASURED)}


def numpy_step(x, P, z, ps):
    F, Q, H, R = ps["F"], ps["Q"], ps["H"], ps["R"]
    x = x @ F.T
    P = F @ P @ F.T + Q
    K = P @ H.T @ np.linalg.inv(H @ P @ H.T + R)
    x = x + ((z - x @ H.T)[..., None, :] @ np.swapaxes(K, -1, -2))[..., 0, :]
    return x, (np.eye(STATE) - K @ H) @ P


def main(filters: int = 1000, steps: int = 50, seed: int = 0) -> dict[str, float]:
    """Track `filters` targets for `steps` steps; the largest difference from numpy and the
    final position error against the true tracks."""
    jax.config.update("jax_enable_x64", True)
    step = kalman_step()
    ps = model()
    rng = np.random.default_rng(seed)
    truth = np.concatenate([rng.normal(size=(filters, 3)), rng.normal(size=(filters, 3))], -1)
    tracks, measurements = [], []
    for _ in range(steps):
        truth = truth @ ps["F"].T
        tracks.append(truth)
        measurements.append(truth[:, :3] + np.sqrt(0.05) * rng.normal(size=(filters, 3)))
    measurements = np.stack(measurements)
    x0, P0 = np.zeros((filters, STATE)), np.broadcast_to(np.eye(STATE), (filters, STATE, STATE))

    @jax.jit
    def run(x, P, zs):
        def body(carry, z):
            out = step(*carry, z, ps)
            return (out["x"], out["P"]), out["x"]

        return jax.lax.scan(body, (x, P), zs)[1]

    estimates = np.asarray(run(jnp.asarray(x0), jnp.asarray(P0), jnp.asarray(measurements)))

    x, P, expected = x0, P0, []
    for z in measurements:
        x, P = numpy_step(x, P, z, ps)
        expected.append(x)
    difference = float(np.abs(estimates - np.stack(expected)).max())
    error = float(np.abs(estimates[-1, :, :3] - tracks[-1][:, :3]).mean())
    return {"max_difference": difference, "final_position_error": error,
            "measurement_noise": float(np.sqrt(0.05))}


if __name__ == "__main__":
    report = main()
    print(f"largest difference from numpy: {report['max_difference']:.2e}")
    print(f"mean position error after filtering: {report['final_position_error']:.3f} "
          f"(measurement noise {report['measurement_noise']:.3f})")
