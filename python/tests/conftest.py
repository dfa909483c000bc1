import numpy as np
import pytest


@pytest.fixture
def rng(request):
    # A fixed seed per test: failures reproduce, and tests stay independent.
    return np.random.default_rng(abs(hash(request.node.name)) % (2**32))
