"""seqattn._cuda, the CUDA backend's Python module, checked on the host: no GPU needed, none used.

What runs here on any machine: the module is built and imports where nvcc was found (and is absent, with a
clear ValueError from every CUDA entry point, where it was not); its planning checks (shapes, head dims,
head ratios, the mask against the shape, through seqattn._core's CoreApi) raise ValueError naming the
argument and the shapes before any CUDA call; on a machine without a GPU the first CUDA call fails with a
RuntimeError naming it. seqattn.torch: the op's CUDA kernels are registered; devices, dtypes and row
layouts of CUDA tensors (fake tensors: no device) are refused before anything reaches the module; the
arguments the CUDA kernel hands the module (pointers, BSHD shapes and strides, the current stream, the
dtype, scale / softcap / sinks) are checked against a recording stand-in. seqattn.jax: the handlers are
registered for CUDA exactly when jax has a CUDA backend and seqattn its CUDA module, and jit / grad /
vmap lower for platforms=['cuda'] to our custom-call targets.

The GPU runs themselves (values against flex_attention / SDPA) are not here: they need a device.
"""

import math
import os
import shutil

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import jax
import jax.numpy as jnp

import seqattn
import seqattn.jax as sj
import seqattn.torch as st
from seqattn import _cuda_support


def _nvcc_found():
    return bool(shutil.which("nvcc") or os.environ.get("CUDACXX") or os.path.exists("/usr/local/cuda/bin/nvcc"))


# Whether this build should have seqattn._cuda: SEQATTN_PYTHON_CUDA=0/1 says so (a build configured with
# -DSEQATTN_PYTHON_CUDA=...); otherwise the default rule, on where nvcc is found (as the build decided).
_EXPECT = os.environ.get("SEQATTN_PYTHON_CUDA")
EXPECT_CUDA = _nvcc_found() if _EXPECT is None else _EXPECT not in ("0", "OFF", "off", "")
needs_module = pytest.mark.skipif(not EXPECT_CUDA, reason="seqattn was built without CUDA here (no nvcc)")


@pytest.fixture
def without_cuda_module(monkeypatch):
    """seqattn as a build without seqattn._cuda sees it."""
    monkeypatch.setattr(_cuda_support, "_module", None)
    monkeypatch.setattr(_cuda_support, "_reason", "this build of seqattn has no CUDA module (test)")


# ---- the module ----

def test_module_is_there_exactly_when_built_with_cuda():
    m = _cuda_support.module()
    if EXPECT_CUDA:
        assert m is not None, _cuda_support.reason()
        assert _cuda_support.reason() is None
    else:
        assert m is None
        assert "no CUDA module" in _cuda_support.reason()
        with pytest.raises(ValueError, match="no CUDA module"):
            _cuda_support.require("who")


def test_import_seqattn_loads_no_cuda_library():
    # The CPU package never loads seqattn._cuda nor a CUDA library: import seqattn and seqattn.jax (whose
    # CUDA registration waits for the first call).
    import subprocess
    import sys

    code = ("import seqattn, seqattn.jax, sys; maps = open('/proc/self/maps').read(); "
            "print('seqattn._cuda' in sys.modules, 'libcudart' in maps, 'libcuda.so' in maps)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"], out.stdout + out.stderr


@needs_module
def test_cuda_module_links_no_cuda_runtime_library():
    import subprocess

    path = _cuda_support.module().__file__
    needed = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    assert "libstdc++" in needed  # ldd did list the module's libraries
    assert "libcudart" not in needed and "libcuda." not in needed, needed


def test_core_api_capsule():
    capsule = seqattn._core._core_api
    assert type(capsule).__name__ == "PyCapsule"
    assert "seqattn._core.CoreApi" in repr(capsule)


@needs_module
def test_module_basics():
    cuda = _cuda_support.module()
    assert cuda.runtime_version >= 12000
    assert cuda.block_shape == (128, 64)
    n, why = cuda.device_count()
    assert n >= 0
    assert (why == "") == (n > 0), why


def _bshd(b, s, h, d):
    return [b, s, h, d]


@needs_module
@pytest.mark.parametrize("q, k, v, message", [
    (_bshd(1, 128, 2, 264), _bshd(1, 128, 2, 264), _bshd(1, 128, 2, 264), r"head dims up to 256 \(dk 264"),
    (_bshd(1, 128, 2, 12), _bshd(1, 128, 2, 12), _bshd(1, 128, 2, 12), r"multiples of 8 .*dk 12"),
    (_bshd(1, 128, 3, 64), _bshd(1, 128, 2, 64), _bshd(1, 128, 2, 64), r"query heads \(3\) must be a multiple of key/value heads \(2\), got q \(1, 128, 3, 64\)"),
    (_bshd(1, 128, 2, 64), _bshd(2, 128, 2, 64), _bshd(2, 128, 2, 64), r"batch|\(1, 128, 2, 64\)"),
    ([256, 2, 64], [256, 2, 64], [256, 2, 64], r"BSHD \[B, S, H, D\].*ranks 3, 3, 3"),
])
def test_plan_checks_raise_before_any_cuda_call(q, k, v, message):
    cuda = _cuda_support.module()
    with pytest.raises(ValueError, match=message):
        cuda._check_plan(q, k, v, None)
    # _plan checks the same first: a ValueError, not the RuntimeError of a CUDA call on a machine without GPU.
    with pytest.raises(ValueError, match=message):
        cuda._plan(q, k, v, None, False, 0)


@needs_module
def test_backward_head_dims_are_checked_before_any_cuda_call():
    cuda = _cuda_support.module()
    shape = _bshd(1, 128, 2, 256)
    cuda._check_plan(shape, shape, shape, None)  # the forward pass takes 256
    for call in (lambda: cuda._check_plan(shape, shape, shape, None, True),
                 lambda: cuda._plan(shape, shape, shape, None, True, 0)):
        with pytest.raises(ValueError, match=r"backward pass supports head dims up to 128, got dk 256 and dv 256"):
            call()


@needs_module
def test_mask_checks_cross_into_core():
    cuda = _cuda_support.module()
    ids = np.repeat([[1, 2, 0]], [40, 60, 28], axis=1)  # one row of 128 tokens
    docs = seqattn.DocumentMask(ids, inner=seqattn.CausalMask())
    cuda._check_plan(_bshd(1, 128, 2, 64), _bshd(1, 128, 2, 64), _bshd(1, 128, 2, 64), docs)  # fits
    with pytest.raises(ValueError, match="1 sequence|batch|sequences"):
        cuda._check_plan(_bshd(3, 128, 2, 64), _bshd(3, 128, 2, 64), _bshd(3, 128, 2, 64), docs)
    per_head = seqattn.PerHeadMask([seqattn.CausalMask(), seqattn.FullMask(), seqattn.CausalMask()])
    with pytest.raises(ValueError, match="3"):
        cuda._check_plan(_bshd(1, 128, 2, 64), _bshd(1, 128, 2, 64), _bshd(1, 128, 2, 64), per_head)
    with pytest.raises(ValueError, match="expected a seqattn mask"):
        cuda._check_plan(_bshd(1, 128, 2, 64), _bshd(1, 128, 2, 64), _bshd(1, 128, 2, 64), object())


@needs_module
def test_plan_without_a_device_names_the_cuda_call():
    cuda = _cuda_support.module()
    shape = _bshd(1, 256, 2, 64)
    if cuda.device_count()[0] > 0:
        plan = cuda._plan(shape, shape, shape, seqattn.CausalMask(), True, 0)
        assert plan.backward and plan.device == 0 and "CudaPlan" in repr(plan)
        return
    with pytest.raises(RuntimeError, match=r"Cuda backend: cuda\w+ failed: cudaError"):
        cuda._plan(shape, shape, shape, seqattn.CausalMask(), True, 0)


@needs_module
def test_forward_refuses_other_dtypes_by_name():
    cuda = _cuda_support.module()
    t = (0, [1, 128, 2, 64], [16384, 128, 64, 1])
    with pytest.raises(ValueError, match="dtype must be 'bfloat16' or 'float16'.*got 'float32'"):
        cuda._forward("float32", object(), t, t, t, t, (0, [1, 2, 128], [256, 128, 1]), math.nan, 0.0, None, 0)
    with pytest.raises(ValueError, match="plan must be a seqattn._cuda._Plan, got object"):  # then the plan
        cuda._forward("bfloat16", object(), t, t, t, t, (0, [1, 2, 128], [256, 128, 1]), math.nan, 0.0, None, 0)


# ---- seqattn.torch on CUDA tensors (fake tensors: no device needed) ----

def test_torch_ops_have_cuda_kernels():
    for op in ("seqattn::attention_forward", "seqattn::attention_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"), op
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU"), op


def fake_qkv(dtype=torch.bfloat16, b=1, hq=2, hkv=2, s=128, d=64, device="cuda"):
    return (torch.empty(b, hq, s, d, dtype=dtype, device=device), torch.empty(b, hkv, s, d, dtype=dtype, device=device),
            torch.empty(b, hkv, s, d, dtype=dtype, device=device))


def test_torch_cuda_without_module_is_a_value_error(without_cuda_module):
    with FakeTensorMode():
        q, k, v = fake_qkv()
        with pytest.raises(ValueError, match=r"seqattn.torch.attention: CUDA tensors need seqattn's CUDA backend.*"
                                             r"no CUDA module"):
            st.attention(q, k, v, seqattn.CausalMask())
        with pytest.raises(ValueError, match="seqattn.torch.plan: CUDA tensors need"):
            st.plan(q, k, v, seqattn.CausalMask())
    # The op's CUDA kernel says the same when called directly.
    with pytest.raises(ValueError, match="no CUDA module"):
        st._forward_cuda(*fake_qkv(device="cpu"), None, None, None, None, None, 0, None, None, -1)


@needs_module
def test_torch_cuda_devices_must_agree():
    with FakeTensorMode():
        q, k, v = fake_qkv()
        k_cpu = torch.empty(k.shape, dtype=k.dtype)
        with pytest.raises(ValueError, match=r"q, k and v must be on one device, got q on cuda:0 and k on cpu "
                                             r"\(shapes q \(1, 2, 128, 64\), k \(1, 2, 128, 64\)\)"):
            st.attention(q, k_cpu, v)
        v1 = torch.empty(v.shape, dtype=v.dtype, device="cuda:1")
        with pytest.raises(ValueError, match="v on cuda:1"):
            st.attention(q, k, v1)
        ids = torch.ones(1, 128, dtype=torch.int32, device="cuda:1")
        with pytest.raises(ValueError, match=r"segment_ids must be on the CPU or on q's device cuda:0, got device "
                                             r"cuda:1"):
            st.attention(q, k, v, segment_ids=ids)
        sinks = torch.zeros(2, device="cuda:1")
        with pytest.raises(ValueError, match="sinks must be on the CPU or on q's device cuda:0"):
            st.attention(q, k, v, sinks=sinks)


@needs_module
def test_torch_cuda_dtypes():
    with FakeTensorMode():
        q, k, v = fake_qkv(torch.float32)
        with pytest.raises(ValueError, match=r"on CUDA, q, k and v must all be bfloat16 or all float16.*got "
                                             r"torch.float32"):
            st.attention(q, k, v)
        q, k, v = fake_qkv(torch.float16)
        k = k.to(torch.bfloat16)
        with pytest.raises(ValueError, match="torch.float16, torch.bfloat16"):
            st.attention(q, k, v)


@needs_module
def test_torch_cuda_strides_are_checked_never_copied():
    with FakeTensorMode():
        q, k, v = fake_qkv()
        qt = torch.empty(1, 2, 64, 128, dtype=torch.bfloat16, device="cuda").transpose(2, 3)  # head dim strided
        with pytest.raises(ValueError, match=r"q must be contiguous in the head dim \(stride 1\) on CUDA, got shape "
                                             r"\(1, 2, 128, 64\) with strides \(16384, 8192, 1, 128\)"):
            st.attention(qt, k, v)
        flat = torch.empty(1 + k.numel(), dtype=torch.bfloat16, device="cuda")
        with pytest.raises(ValueError, match=r"k rows must be 16-byte aligned.*storage offset 1"):
            st.attention(q, flat[1:].view(k.shape), v)
        odd = torch.empty(1, 2, 128, 68, dtype=torch.bfloat16, device="cuda")[..., :64]  # row stride 68
        with pytest.raises(ValueError, match=r"v rows must be 16-byte aligned.*strides \(17408, 8704, 68, 1\)"):
            st.attention(q, k, odd)


@needs_module
def test_torch_cuda_fake_op_traces_with_cuda_outputs():
    # The checks pass; under fake tensors the op's fake kernel gives outputs on the inputs' device, so
    # torch.compile can trace a CUDA model step without a GPU.
    with FakeTensorMode():
        q, k, v = fake_qkv(torch.float16, hq=4, hkv=2, d=128)
        out, lse = st.attention(q, k, v, seqattn.CausalMask(), enable_gqa=True, return_lse=True)
        assert out.device == q.device and out.shape == (1, 4, 128, 128) and out.dtype == torch.float16
        assert lse.device == q.device and lse.shape == (1, 4, 128) and lse.dtype == torch.float32


@needs_module
def test_seqattn_torch_loads_the_cuda_module_at_import():
    # Dynamo cannot trace an import (importlib.import_module is skipped): seqattn.torch loads seqattn._cuda
    # when it is imported, where torch has CUDA, so that the first traced CUDA call finds it loaded.
    import subprocess
    import sys

    code = "import seqattn.torch, sys, torch; print(torch.version.cuda is not None, 'seqattn._cuda' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    torch_has_cuda, loaded = out.stdout.split()[-2:]
    assert loaded == torch_has_cuda, out.stdout


@needs_module
def test_torch_cuda_step_traces_in_one_graph():
    # Dynamo (torch.export strict: the tracer of torch.compile(fullgraph=True)) traces the CUDA path's
    # checks and the op without a graph break, segment ids as graph inputs.
    causal = seqattn.CausalMask()

    class Step(torch.nn.Module):
        def forward(self, q, k, v, ids):
            return st.attention(q, k, v, causal, segment_ids=ids, softcap=20.0)

    with FakeTensorMode():
        q, k, v = fake_qkv()
        ids = torch.ones(1, 128, dtype=torch.int32, device="cuda")
    program = torch.export.export(Step(), (q, k, v, ids), strict=True)
    calls = [n for n in program.graph.nodes if n.op == "call_function" and "seqattn" in str(n.target)]
    assert [str(n.target) for n in calls] == ["seqattn.attention_forward.default"]
    assert [a.name if hasattr(a, "name") else a for a in calls[0].args[:4]] == ["q", "k", "v", "ids"]
    out = [n for n in program.graph.nodes if n.op == "output"][0].args[0][0]
    assert out.meta["val"].device.type == "cuda"


class RecordingCuda:
    """Stands in for seqattn._cuda: records the calls the op's CUDA kernels make."""

    def __init__(self):
        self.calls = []

    def _plan(self, q, k, v, mask, backward, device):
        self.calls.append(("plan", q, k, v, mask, backward, device))
        return ("plan", backward)

    def _forward(self, *args):
        self.calls.append(("forward",) + args)

    def _backward(self, *args):
        self.calls.append(("backward",) + args)


@pytest.fixture
def recording(monkeypatch):
    rec = RecordingCuda()
    monkeypatch.setattr(_cuda_support, "_module", rec)
    monkeypatch.setattr(_cuda_support, "_reason", None)
    monkeypatch.setattr(st, "_cuda_stream", lambda device: 0xABC0)
    monkeypatch.setattr(st, "_device_index", lambda t: 3)
    monkeypatch.setattr(st, "_cuda_plans", {})
    return rec


def test_torch_cuda_kernel_hands_pointers_strides_and_stream(recording):
    # CPU tensors stand in for device memory: the kernel only reads their pointers and strides.
    q = torch.zeros(2, 4, 128, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 128, 2, 64, dtype=torch.bfloat16).transpose(1, 2)  # BSHD storage
    v = torch.zeros(2, 2, 128, 64, dtype=torch.bfloat16)
    sinks = torch.tensor([0.5, 1.0, 1.5, 2.0])
    mask = seqattn.CausalMask()
    out, lse = st._forward_cuda(q, k, v, None, None, None, None, sinks, st._handle(mask), 0.25, 30.0, -1)
    plan_call, fwd = recording.calls
    assert plan_call[:4] == ("plan", [2, 128, 4, 64], [2, 128, 2, 64], [2, 128, 2, 64])
    assert repr(plan_call[4]) == repr(mask) and plan_call[5:] == (False, 3)  # the registered causal mask
    (_, dtype, plan, qd, kd, vd, od, ld, scale, softcap, sinks_list, stream) = fwd
    assert dtype == "bfloat16" and plan == ("plan", False)
    assert qd == (q.data_ptr(), [2, 128, 4, 64], [4 * 128 * 64, 64, 128 * 64, 1])
    assert kd == (k.data_ptr(), [2, 128, 2, 64], [128 * 2 * 64, 2 * 64, 64, 1])  # BSHD strides as stored
    assert vd[0] == v.data_ptr()
    assert od == (out.data_ptr(), [2, 128, 4, 64], [128 * 4 * 64, 4 * 64, 64, 1])
    assert ld == (lse.data_ptr(), [2, 4, 128], [4 * 128, 128, 1])
    assert (scale, softcap, sinks_list, stream) == (0.25, 30.0, [0.5, 1.0, 1.5, 2.0], 0xABC0)
    # A second call of the same shape reuses the plan; defaults become NaN scale and softcap 0.
    st._forward_cuda(q, k, v, None, None, None, None, None, st._handle(mask), None, None, -1)
    assert [c[0] for c in recording.calls] == ["plan", "forward", "forward"]
    assert math.isnan(recording.calls[-1][8]) and recording.calls[-1][9] == 0.0 and recording.calls[-1][10] is None


def test_torch_cuda_kernel_plans_documents_per_call(recording):
    q, k, v = (torch.zeros(1, 2, 128, 64, dtype=torch.float16) for _ in range(3))
    ids = torch.tensor([[1] * 100 + [2] * 28], dtype=torch.int64)
    inner = seqattn.CausalMask()
    out, lse = st._forward_cuda(q, k, v, ids, None, None, None, None, st._handle(inner), None, None, -1)
    st._forward_cuda(q, k, v, ids, None, None, None, None, st._handle(inner), None, None, -1)
    plans = [c for c in recording.calls if c[0] == "plan"]
    assert len(plans) == 2  # per call: the ids may change
    mask = plans[0][4]
    assert isinstance(mask, seqattn.Mask) and "Document" in repr(mask)
    assert recording.calls[1][1] == "float16"
    dout = torch.zeros_like(out)
    dq, dk, dv, dsinks = st._backward_cuda(q, k, v, out, lse, dout, ids, None, None, None, None,
                                           st._handle(inner), None, None, -1)
    bwd = recording.calls[-1]
    assert bwd[0] == "backward" and recording.calls[-2][5] is True  # planned with backward
    assert bwd[8][0] == dout.data_ptr()  # read in place
    assert [d[0] for d in bwd[9:12]] == [dq.data_ptr(), dk.data_ptr(), dv.data_ptr()]
    assert dq.shape == q.shape and dsinks.shape == (0,)
    # autograd's dout of out.sum() is an expanded tensor (strides 0): copied into BSHD rows, the only copy.
    ones = torch.ones((), dtype=out.dtype).expand(out.shape)
    st._backward_cuda(q, k, v, out, lse, ones, ids, None, None, None, None, st._handle(inner), None, None, -1)
    _, shape, strides = recording.calls[-1][8]
    assert shape == [1, 128, 2, 64] and strides == [128 * 2 * 64, 2 * 64, 64, 1]
    assert recording.calls[-1][3][0] == q.data_ptr()


def test_torch_cuda_kernel_range_checks_wide_ids(recording):
    q, k, v = (torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16) for _ in range(3))
    ids = torch.ones(1, 128, dtype=torch.int64)
    ids[0, -1] = 2**40  # would wrap to 0 (padding) in int32
    with pytest.raises(ValueError, match="segment_ids"):
        st._forward_cuda(q, k, v, ids, None, None, None, None, st._handle(seqattn.CausalMask()), None, None, -1)
    assert recording.calls == []


def test_torch_cuda_kernel_refuses_cpu_plans(recording):
    q, k, v = (torch.zeros(1, 2, 128, 64, dtype=torch.bfloat16) for _ in range(3))
    cpu_plan = st.plan(q, k, v, seqattn.CausalMask(), device="cpu")
    with pytest.raises(ValueError, match="is a CPU plan; q, k, v are CUDA tensors"):
        st._forward_cuda(q, k, v, None, None, None, None, None, st._handle(cpu_plan), None, None, -1)


# ---- seqattn.jax: registration for CUDA and lowering for platforms=['cuda'] ----

def test_jax_registration_follows_the_cuda_backend(monkeypatch):
    calls = []
    monkeypatch.setattr(jax.ffi, "register_ffi_target", lambda name, capsule, platform: calls.append(
        (name, platform, capsule)))
    monkeypatch.setattr(sj, "_registered", False)
    monkeypatch.setattr(sj, "_platforms", [])
    # This jax has no CUDA backend here: CPU only, cleanly.
    has_cuda = sj._jax_has_cuda()
    sj._register_targets()
    assert [p for _, p, _ in calls].count("cpu") == 2
    cuda_module = _cuda_support.module()
    expect_cuda = has_cuda and cuda_module is not None and cuda_module.has_xla_ffi
    assert sj._platforms == (["cpu", "cuda"] if expect_cuda else ["cpu"])
    # With a CUDA backend, the CUDA module's handlers (not the CPU ones) are registered for "CUDA".
    calls.clear()
    monkeypatch.setattr(sj, "_registered", False)
    monkeypatch.setattr(sj, "_platforms", [])
    monkeypatch.setattr(sj, "_jax_has_cuda", lambda: True)
    sj._register_targets()
    cuda_calls = {name: capsule for name, platform, capsule in calls if platform == "CUDA"}
    if cuda_module is None or not cuda_module.has_xla_ffi:
        assert cuda_calls == {} and sj._platforms == ["cpu"]
    else:
        assert set(cuda_calls) == {"seqattn_attention_forward", "seqattn_attention_backward"}
        assert sj._platforms == ["cpu", "cuda"]
        cpu_calls = {name: capsule for name, platform, capsule in calls if platform == "cpu"}
        for name in cuda_calls:
            assert type(cuda_calls[name]).__name__ == "PyCapsule" and repr(cuda_calls[name]) != repr(cpu_calls[name])
    # Without the CUDA module: skipped, the CPU still registered.
    calls.clear()
    monkeypatch.setattr(sj, "_registered", False)
    monkeypatch.setattr(sj, "_platforms", [])
    monkeypatch.setattr(_cuda_support, "_module", None)
    sj._register_targets()
    assert [p for _, p, _ in calls] == ["cpu", "cpu"] and sj._platforms == ["cpu"]


def test_jax_has_no_cuda_backend_here_is_not_an_error():
    assert sj._jax_has_cuda() in (True, False)
    assert "cpu" in sj.registered_platforms()


def _export_cuda(fn, *args):
    checks = [jax.export.DisabledSafetyCheck.custom_call(n)
              for n in ("seqattn_attention_forward", "seqattn_attention_backward")]
    return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=checks)(*args)


def test_jax_lowers_for_cuda_forward_backward_vmap():
    q = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, 256, 2, 64), jnp.bfloat16)
    ids = np.repeat([[1, 2, 0]], [100, 120, 36], axis=1).repeat(2, 0).astype(np.int32)
    mask = seqattn.CausalMask()

    def loss(q, k, v, ids):
        out = sj.attention(q, k, v, mask, segment_ids=ids, softcap=30.0)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    fwd = _export_cuda(lambda q, k, v, ids: sj.attention(q, k, v, mask, segment_ids=ids), q, kv, kv, ids)
    text = fwd.mlir_module()
    assert fwd.platforms == ("cuda",)
    assert "stablehlo.custom_call @seqattn_attention_forward" in text
    # The typed XLA FFI (attributes as a dictionary, what the CUDA handlers decode) and row-major operands
    # (the handlers fold the leading dims of row-major buffers).
    assert "mhlo.backend_config = {mask_id = " in text
    assert "operand_layouts = [dense<[3, 2, 1, 0]> : tensor<4xindex>" in text
    assert "seqattn_attention_backward" not in text

    grad = _export_cuda(jax.grad(loss, argnums=(0, 1, 2)), q, kv, kv, ids)
    text = grad.mlir_module()
    assert "@seqattn_attention_forward" in text and "@seqattn_attention_backward" in text
    assert "softcap = 3.000000e+01" in text

    vq = jax.ShapeDtypeStruct((3,) + q.shape, q.dtype)
    vkv = jax.ShapeDtypeStruct((3,) + kv.shape, kv.dtype)
    vm = _export_cuda(jax.vmap(lambda q, k, v: sj.attention(q, k, v, mask)), vq, vkv, vkv)
    assert "@seqattn_attention_forward" in vm.mlir_module()
    assert vm.out_avals[0].shape == (3, 2, 256, 4, 64)


def test_jax_cuda_lowering_keeps_trace_time_checks():
    q = jax.ShapeDtypeStruct((1, 128, 3, 64), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    with pytest.raises(ValueError, match="multiple"):
        _export_cuda(lambda q, k, v: sj.attention(q, k, v), q, kv, kv)
