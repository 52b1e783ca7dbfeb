"""Shared test set-up: float64 available, and a bounded hypothesis profile for CI."""

import os

import jax
from hypothesis import HealthCheck, settings

jax.config.update("jax_enable_x64", True)

settings.register_profile(
    "ci", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "slow", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("slow" if os.environ.get("SYMKERN_SLOW") else "ci")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SYMKERN_SLOW"):
        return
    import pytest

    skip = pytest.mark.skip(reason="long run: set SYMKERN_SLOW=1 (make test-all)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
