"""The engine's runtime SIMD dispatch: the target chosen, every compiled target's
kernels against the float64 oracle, and the CPU check before the module loads."""

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import oracles as O
import seqattn
from seqattn import _core

TARGETS = _core._available_simd_targets()
X86 = platform.machine().lower() in ("x86_64", "amd64")


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def randn(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_the_best_target_runs_and_says_so():
    assert TARGETS, "no compiled target runs on this CPU"
    assert seqattn.simd_target == TARGETS[0]
    if X86:
        # The module is built for x86-64-v3: AVX2 is the floor, AVX-512 targets above it.
        assert set(TARGETS) <= {"AVX2", "AVX3", "AVX3_DL"} and "AVX2" in TARGETS
        flags = cpu_flags()
        if flags is not None:
            assert ("AVX3" in TARGETS) == ("avx512f" in flags and "avx512bw" in flags and "avx512dq" in flags)
            has_bf16 = "avx512_bf16" in flags
            assert seqattn.bf16_dot_instruction == (seqattn.simd_target == "AVX3_DL" and has_bf16)


@pytest.fixture
def target(request):
    chosen = _core._use_simd_target_for_test(request.param)
    assert chosen == request.param
    yield chosen
    assert _core._use_simd_target_for_test("") == TARGETS[0]


@pytest.mark.parametrize("target", TARGETS, indirect=True)
def test_every_target_forward_and_backward_against_the_oracle(rng, target):
    ids = np.array([[1] * 50 + [2] * 60 + [0] * 7 + [3] * 86], np.int32)  # 203 tokens, padding inside
    sq = ids.shape[1]
    q, k, v = randn(rng, 1, sq, 6, 72), randn(rng, 1, sq, 2, 72), randn(rng, 1, sq, 2, 72)
    mask = seqattn.CausalMask()
    out, lse = seqattn.attention(q, k, v, mask, segment_ids=ids, threads=2)
    allowed = O.document(ids[0], ids[0], None, None, lambda i, j, n, m: j <= i)[None, None]
    want_out, want_lse = O.attention(q, k, v, allowed)
    np.testing.assert_allclose(out, want_out, atol=2e-5, rtol=1e-4)
    finite = np.isfinite(want_lse)
    np.testing.assert_array_equal(np.isfinite(lse), finite)
    np.testing.assert_allclose(lse[finite], want_lse[finite], atol=2e-4)

    dout = randn(rng, *out.shape)
    dq, dk, dv = seqattn.attention_backward(q, k, v, out, lse, dout, mask, segment_ids=ids, threads=2)
    for got, want in zip((dq, dk, dv), O.attention_grads(q, k, v, allowed, dout)):
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=2e-3)


@pytest.mark.parametrize("target", TARGETS, indirect=True)
def test_every_target_bf16_prefill(rng, target):
    # 256 queries: enough rows per task for the pair-dot path where the target has it.
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (randn(rng, 1, 256, h, 128).astype(ml_dtypes.bfloat16) for h in (4, 2, 2))
    out, lse = seqattn.attention(q, k, v, seqattn.CausalMask(), threads=2)
    want_out, want_lse = O.attention(*(x.astype(np.float32) for x in (q, k, v)), O.causal(256, 256))
    # bf16 output (2^-8 relative) plus, on the pair-dot path, P rounded to bf16
    # (2^-8 of max |v| per element: backends/highway_bf16-inl.h).
    vmax = float(np.abs(v.astype(np.float32)).max())
    np.testing.assert_allclose(out.astype(np.float32), want_out, atol=2**-8 * vmax + 1e-5, rtol=2**-8)
    np.testing.assert_allclose(lse, want_lse, atol=1e-4)


def test_unknown_target_is_a_value_error():
    with pytest.raises(ValueError, match="'SVE2' is not one of the targets compiled in"):
        _core._use_simd_target_for_test("SVE2")
    assert _core._use_simd_target_for_test("") == TARGETS[0]


def test_a_cpu_below_the_minimum_gets_an_import_error_naming_the_features():
    # seqattn._cpu answers before seqattn._core is loaded; a stand-in for it
    # reports what an older CPU lacks.
    code = (
        "import sys, types\n"
        "sys.modules['seqattn._cpu'] = types.SimpleNamespace(missing_features=lambda: ['AVX2', 'FMA'])\n"
        "try:\n"
        "    import seqattn\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
        "    sys.exit(0)\n"
        "sys.exit('no ImportError')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "this CPU lacks AVX2, FMA" in r.stdout and "x86-64-v3" in r.stdout
    assert "seqattn._core" not in r.stdout


def test_this_cpu_lacks_nothing_the_module_needs():
    from seqattn import _cpu

    assert _cpu.missing_features() == []
