import os
import sys

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))  # tests/strategies.py

settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile(
    "ci",
    max_examples=150,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(scope="session")
def bv():
    """benchmarks/bench_verdict.py as a module: the calibration tests run a subset of its cases."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
    try:
        import bench_verdict
    finally:
        sys.path.pop(0)
    return bench_verdict


@pytest.fixture(scope="module")
def client():
    """A local dask.distributed cluster of two one-thread worker processes, per test module (refkern[dask])."""
    from refkern.scale.cluster import local_client

    c = local_client(2)
    yield c
    c.close()
    c.cluster.close()
