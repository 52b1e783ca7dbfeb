"""Shared test set-up: float64 available, and a bounded hypothesis profile for CI."""

import os

import jax
import pytest
from hypothesis import HealthCheck, settings
from jax import monitoring

jax.config.update("jax_enable_x64", True)

#: "ci" draws the same examples in every run (derandomize): a suite that passes once passes
#: again, and a slow or failing draw is found by `SYMKERN_SLOW=1`, not by chance in CI
settings.register_profile(
    "ci", max_examples=25, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow]
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


@pytest.fixture
def compile_events():
    """The function name of every XLA compile from here to the test's end."""
    events = []

    def listener(name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            events.append(kwargs.get("fun_name"))

    monitoring.register_event_duration_secs_listener(listener)
    yield events
    monitoring.unregister_event_duration_listener(listener)
