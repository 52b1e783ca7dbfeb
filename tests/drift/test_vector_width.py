"""What keeps 512-bit vectors from being the default CPU width (symkern.kernels.options):
jaxlib compiles `atan` wrongly at `xla_cpu_prefer_vector_width=512` on CPUs with AVX-512.

When this test fails, the installed jaxlib computes `atan` right at 512 bits: the width can
be measured again (docs/design/vector-width.md) and chosen where it pays.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest


def _has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.skipif(jax.default_backend() != "cpu" or not _has_avx512(),
                    reason="512-bit vectors need a CPU with AVX-512")
def test_atan_is_still_wrong_at_512_bit_vectors():
    x = np.random.default_rng(0).uniform(-3, 3, 64).astype(np.float32)
    wide = jax.jit(jnp.arctan, compiler_options={"xla_cpu_prefer_vector_width": 512})
    default = jax.jit(jnp.arctan)
    np.testing.assert_allclose(default(x), np.arctan(x), rtol=1e-6)
    error = float(np.max(np.abs(np.asarray(wide(x)) - np.arctan(x))))
    assert error > 1e-3, "atan is right at 512-bit vectors now: see this module's docstring"
