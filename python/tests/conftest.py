import resource
import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    # A fixed seed per test: failures reproduce, and tests stay independent. (Not hash(): Python salts string
    # hashes per process, so the seed would change from run to run.)
    return np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _address_space_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@pytest.fixture
def small_address_space():
    """Lets the process map only 2 GiB more while the test runs.

    Requests of terabytes that are within seqattn's limits then fail at once
    and deterministically, whatever the machine's overcommit policy (a policy
    that grants them would let the zero-fill run into the OOM killer).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space_bytes() + 2 * 2**30
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
