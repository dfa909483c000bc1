"""seqattn.torch.attention: the CPU engine as the torch custom ops seqattn::attention_forward / _backward.

torch.library.opcheck on both ops; values and gradients against the float64
oracle (oracles.py), flex_attention (eager, with the BlockMask that
seqattn.torch.block_mask exports; values only: torch 2.15 has no flex
backward on the CPU) and SDPA; causal, documents from segment-id
tensors, sliding window, GQA, sinks, fp32 and bf16, head dims 72 / 80, odd
lengths, padding rows; torch.compile(fullgraph=True) of a model step with no
recompilation for new ids; zero-copy views; the errors.
"""

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as fa
import torch.nn.functional as F

import oracles as O
import seqattn
import seqattn.torch as st


def bhsd_to_bshd64(t):
    return t.detach().transpose(1, 2).to(torch.float64).numpy()


def tolerance(dtype, ref):
    """An absolute tolerance from the storage dtype's epsilon and the reference's magnitude.

    bf16: the result is rounded to 8 significant bits (and q, k, v were stored in bf16); fp32: fp32 accumulation
    over at most a few hundred keys.
    """
    eps = torch.finfo(dtype).eps
    factor = 8.0 if dtype == torch.bfloat16 else 256.0
    return factor * eps * max(1.0, float(np.abs(ref).max()))


def inputs(b, hq, hkv, s, s_kv, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, s, d, generator=g)
    k = torch.randn(b, hkv, s_kv, d, generator=g)
    v = torch.randn(b, hkv, s_kv, d, generator=g)
    return [x.to(dtype).requires_grad_() for x in (q, k, v)]


def document_ids(rng, b, s, padding=0):
    """[B, S] int64 ids of consecutive documents, then `padding` tokens of id 0."""
    ids = np.zeros((b, s), np.int64)
    for r in range(b):
        ids[r, : s - padding] = O.document_pattern(rng, s - padding)
    return ids


def check_against_oracle(q, k, v, allowed, dtype, **kwargs):
    """Runs seqattn.torch.attention and its backward; compares out, lse, dq, dk, dv with the float64 oracle."""
    out, lse = st.attention(q, k, v, return_lse=True, **kwargs)
    assert out.dtype == dtype and out.shape == q.shape[:3] + v.shape[3:]
    assert not lse.requires_grad and lse.dtype == torch.float32
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    qn, kn, vn = (bhsd_to_bshd64(x) for x in (q, k, v))
    ref_out, ref_lse = O.attention(qn, kn, vn, allowed)
    ref_grads = O.attention_grads(qn, kn, vn, allowed, bhsd_to_bshd64(dout))
    got_out = bhsd_to_bshd64(out)
    np.testing.assert_allclose(got_out, ref_out, atol=tolerance(dtype, ref_out), rtol=0)
    finite = np.isfinite(ref_lse)
    assert np.array_equal(np.isfinite(lse.numpy()), finite)
    np.testing.assert_allclose(lse.numpy()[finite], ref_lse[finite], atol=tolerance(dtype, ref_lse[finite]), rtol=0)
    for name, got, want in zip(("dq", "dk", "dv"), grads, ref_grads):
        assert got.dtype == dtype and got.shape in (q.shape, k.shape, v.shape)
        np.testing.assert_allclose(bhsd_to_bshd64(got), want, atol=tolerance(dtype, want), rtol=0, err_msg=name)
    return out, grads


CASES = {
    # name: (Hq, Hkv, S, S_kv, D, mask, oracle mask [Sq, Skv] or None for documents)
    "full": (2, 2, 77, 77, 72, seqattn.FullMask(), lambda s, s_kv: np.ones((s, s_kv), bool)),
    "causal": (4, 4, 131, 131, 80, seqattn.CausalMask(), O.causal),
    "causal_cross": (2, 2, 45, 99, 72, seqattn.CausalMask("bottom_right"),
                     lambda s, s_kv: O.causal(s, s_kv, "bottom_right")),
    "window": (2, 2, 150, 150, 72, seqattn.SlidingWindowMask(33, 0), lambda s, s_kv: O.window(s, s_kv, 33, 0)),
    "gqa_causal": (6, 2, 97, 97, 80, seqattn.CausalMask(), O.causal),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_values_and_gradients_match_the_oracle(case, dtype):
    hq, hkv, s, s_kv, d, mask, allowed = CASES[case]
    q, k, v = inputs(2, hq, hkv, s, s_kv, d, dtype, seed=len(case))
    check_against_oracle(q, k, v, allowed(s, s_kv)[None, None], dtype, mask=mask, enable_gqa=hq != hkv)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_documents_from_segment_id_tensors_with_padding(rng, dtype):
    b, h, s, d = 2, 2, 143, 72
    ids = document_ids(rng, b, s, padding=11)
    q, k, v = inputs(b, h, h, s, s, d, dtype, seed=5)
    inner = seqattn.SlidingWindowMask(20, 0)
    allowed = np.stack([O.document(r, r, inner=lambda i, j, nq, nk: 0 <= i - j <= 20) for r in ids])[:, None]
    out, (dq, dk, dv) = check_against_oracle(q, k, v, allowed, dtype, mask=inner,
                                             segment_ids=torch.from_numpy(ids))
    # Padding rows (id 0) attend to nothing: out 0 and no gradient, where SDPA / flex give NaN or the mean of v.
    assert torch.all(out[:, :, -11:] == 0)
    assert torch.all(dq[:, :, -11:] == 0) and torch.all(dk[:, :, -11:] == 0) and torch.all(dv[:, :, -11:] == 0)
    # int32 ids give the same results.
    out32 = st.attention(q, k, v, inner, segment_ids=torch.from_numpy(ids.astype(np.int32)))
    assert torch.equal(out32, out)


def test_sinks_values_and_gradients():
    b, hq, hkv, s, d = 2, 4, 2, 61, 80
    q, k, v = inputs(b, hq, hkv, s, s, d, torch.float32, seed=9)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    out = st.attention(q, k, v, seqattn.CausalMask(), sinks=sinks, enable_gqa=True)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(4))
    got = torch.autograd.grad(out, (q, k, v, sinks), dout)
    # float64 reference: the sink is one more logit in every row's softmax, with no value.
    q64, k64, v64, sinks64 = (x.detach().double().requires_grad_() for x in (q, k, v, sinks))
    k_rep, v_rep = (x.repeat_interleave(hq // hkv, 1) for x in (k64, v64))
    scores = (q64 @ k_rep.transpose(-1, -2)) / d**0.5
    scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    scores = torch.cat([scores, sinks64[None, :, None, None].expand(b, hq, s, 1)], -1)
    ref = torch.softmax(scores, -1)[..., :s] @ v_rep
    want = torch.autograd.grad(ref, (q64, k64, v64, sinks64), dout.double())
    torch.testing.assert_close(out.double(), ref, atol=3e-5, rtol=0)
    for name, a, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        torch.testing.assert_close(a.double(), w, atol=1e-4, rtol=1e-5, msg=name)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("kind", ["causal", "documents", "window_gqa"])
def test_matches_flex_attention(rng, kind):
    b, s, d = 2, 200, 72
    hq, hkv = (4, 2) if kind == "window_gqa" else (2, 2)
    q, k, v = (x.detach() for x in inputs(b, hq, hkv, s, s, d, torch.float32, seed=11))
    kwargs = {"enable_gqa": hq != hkv}
    if kind == "causal":
        mask = export = seqattn.CausalMask()
    elif kind == "documents":
        ids = document_ids(rng, b, s)
        mask, kwargs["segment_ids"] = seqattn.CausalMask(), torch.from_numpy(ids)
        export = seqattn.DocumentMask(ids.astype(np.int32), inner=seqattn.CausalMask())
    else:
        mask = export = seqattn.SlidingWindowMask(50, 0)
    with torch.no_grad():  # torch 2.15's flex_attention has no backward on the CPU (NotImplementedError)
        ours = st.attention(q, k, v, mask, **kwargs)
        theirs = fa.flex_attention(q, k, v, block_mask=st.block_mask(export, b, hq, s, s), enable_gqa=hq != hkv)
    torch.testing.assert_close(ours, theirs, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_matches_sdpa(dtype, causal):
    b, hq, hkv, s, d = 2, 4, 1, 173, 80
    q, k, v = inputs(b, hq, hkv, s, s, d, dtype, seed=13)
    mask = seqattn.CausalMask() if causal else None
    ours = st.attention(q, k, v, mask, enable_gqa=True)
    qf, kf, vf = (x.detach().double().requires_grad_() for x in (q, k, v))
    theirs = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal, enable_gqa=True)
    torch.testing.assert_close(ours.double(), theirs, atol=tolerance(dtype, theirs.detach().numpy()), rtol=0)
    dout = torch.randn(ours.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    for name, a, w in zip("qkv", torch.autograd.grad(ours, (q, k, v), dout),
                          torch.autograd.grad(theirs, (qf, kf, vf), dout.double())):
        torch.testing.assert_close(a.double(), w, atol=tolerance(dtype, w.numpy()), rtol=0, msg=f"d{name}")


def test_opcheck_both_ops():
    b, h, s, d = 1, 2, 40, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, generator=g) for _ in range(3))
    ids = torch.tensor([[1] * 25 + [2] * 10 + [0] * 5])
    sinks = torch.tensor([0.5, -0.5])
    handle = st._handle(seqattn.CausalMask())
    fwd_args = (q, k, v, ids, None, None, None, sinks, handle, None, None, -1)
    torch.library.opcheck(torch.ops.seqattn.attention_forward.default, fwd_args)
    out, lse = torch.ops.seqattn.attention_forward(*fwd_args)
    dout = torch.randn(out.shape, generator=g)
    torch.library.opcheck(torch.ops.seqattn.attention_backward.default,
                          (q, k, v, out, lse, dout, ids, None, None, None, sinks, handle, None, None, -1))
    # Through autograd (the registration of attention_backward as attention_forward's gradient).
    qg, kg, vg, sg = (x.clone().requires_grad_() for x in (q, k, v, sinks))
    torch.library.opcheck(torch.ops.seqattn.attention_forward.default,
                          (qg, kg, vg, ids, None, None, None, sg, handle, None, None, -1))


def test_compiled_model_step_runs_without_graph_breaks_or_recompiles(rng):
    b, h, s, d = 2, 2, 96, 16
    torch.manual_seed(0)
    proj = torch.nn.Linear(d, 3 * d)
    mask = seqattn.CausalMask()

    def loss_fn(x, ids):
        q, k, v = proj(x).chunk(3, -1)
        return st.attention(q, k, v, mask, segment_ids=ids).square().mean()

    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    step = torch.compile(loss_fn, fullgraph=True, backend=counting_backend)
    x = torch.randn(b, h, s, d)
    for padding in (0, 7):  # new ids of the same shape: the same graph
        ids = torch.from_numpy(document_ids(rng, b, s, padding))
        loss = step(x, ids)
        loss.backward()
        compiled_grad = proj.weight.grad.clone()
        proj.zero_grad()
        eager = loss_fn(x, ids)
        eager.backward()
        torch.testing.assert_close(loss, eager, atol=0, rtol=0)
        torch.testing.assert_close(compiled_grad, proj.weight.grad, atol=1e-6, rtol=1e-6)
        proj.zero_grad()
    assert len(graphs) == 1
    assert any(n.target is torch.ops.seqattn.attention_forward.default for n in graphs[0].graph.nodes)


def test_inputs_and_outputs_are_views_not_copies():
    b, h, s, d = 2, 3, 50, 16
    base = torch.randn(b, s, h, d)  # BSHD storage, handed over as [B, H, S, D] by strides
    q = base.transpose(1, 2)
    view = st._bshd(q)
    assert np.shares_memory(view, base.numpy()) and view.flags.c_contiguous
    out = st.attention(q, q, q, seqattn.CausalMask())
    assert out.stride() == (s * h * d, d, h * d, 1)  # the engine's BSHD result, viewed as [B, H, S, D]
    bf = q.bfloat16()
    assert np.shares_memory(st._bshd(bf), bf.view(torch.int16).numpy())
    # A contiguous [B, H, S, D] input is read in place too (strided rows) and gives the same result.
    torch.testing.assert_close(st.attention(q.contiguous(), q.contiguous(), q.contiguous(), seqattn.CausalMask()),
                               out, atol=0, rtol=0)


def test_plans_and_threads():
    b, h, s, d = 1, 2, 130, 72
    q, k, v = inputs(b, h, h, s, s, d, torch.float32, seed=17)
    p = st.plan(q, k, v, seqattn.CausalMask(), threads=2)
    assert p.backward
    check_against_oracle(q, k, v, O.causal(s, s), torch.float32, plan=p)
    planned = st.attention(q, k, v, plan=p)
    serial = st.attention(q, k, v, seqattn.CausalMask(), threads=1)
    g_planned = torch.autograd.grad(planned.sum(), (q, k, v))
    g_serial = torch.autograd.grad(serial.sum(), (q, k, v))
    for a, w in zip(g_planned, g_serial):  # the backward is deterministic for any thread count
        assert torch.equal(a, w)
    with pytest.raises(ValueError, match="plan already holds the mask"):
        st.attention(q, k, v, seqattn.CausalMask(), plan=p)
    other = inputs(b, h, h, s + 1, s + 1, d, torch.float32, seed=1)
    with pytest.raises(ValueError):
        st.attention(*other, plan=p)


def test_masks_without_data_share_one_handle():
    q, k, v = (x.detach() for x in inputs(1, 2, 2, 20, 20, 16, torch.float32, seed=0))
    st.attention(q, k, v, seqattn.CausalMask() & seqattn.SlidingWindowMask(5, 0))
    before = len(st._objects)
    for _ in range(3):  # a new, equal mask object per call: no new registration, the cached plan
        st.attention(q, k, v, seqattn.CausalMask() & seqattn.SlidingWindowMask(5, 0))
    assert len(st._objects) == before
    assert st._handle(seqattn.SlidingWindowMask(5, 0)) != st._handle(seqattn.SlidingWindowMask(6, 0))
    docs = [seqattn.DocumentMask([[1] * 10 + [2] * 10]) for _ in range(2)]  # data: one handle per object
    assert st._handle(docs[0]) != st._handle(docs[1])


def test_errors_name_the_arguments_and_shapes():
    q, k, v = inputs(1, 4, 2, 10, 10, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"enable_gqa=True.*q \(1, 4, 10, 16\), k \(1, 2, 10, 16\)"):
        st.attention(q, k, v)
    q3, k3, v3 = inputs(1, 3, 2, 10, 10, 16, torch.float32, seed=0)
    with pytest.raises(ValueError, match=r"query heads \(3\) must be a multiple of the key/value heads \(2\)"):
        st.attention(q3, k3, v3, enable_gqa=True)
    with pytest.raises(ValueError, match=r"float32 or all bfloat16.*torch.float16"):
        st.attention(*(x.half() for x in (q, k, v)), enable_gqa=True)
    with pytest.raises(ValueError, match=r"torch.float32, torch.bfloat16"):
        st.attention(q, k.bfloat16(), v, enable_gqa=True)
    with pytest.raises(ValueError, match=r"q must be a 4-D torch.Tensor \[B, H, S, D\], got \(4, 10, 16\)"):
        st.attention(q[0], k, v)
    with pytest.raises(ValueError, match=r"same head dim D.*k \(1, 2, 10, 8\)"):
        st.attention(q, k[..., :8], v, enable_gqa=True)
    with pytest.raises(ValueError, match=r"segment_ids must be an integer tensor of shape \(1, 10\), got "
                                         r"torch.int64 of shape \(1, 9\)"):
        st.attention(q, k, v, enable_gqa=True, segment_ids=torch.ones(1, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"segment_ids must be an integer tensor.*torch.float32"):
        st.attention(q, k, v, enable_gqa=True, segment_ids=torch.ones(1, 10))
    with pytest.raises(ValueError, match=r"sinks must be a float tensor of one logit per query head, shape \(4,\)"):
        st.attention(q, k, v, enable_gqa=True, sinks=torch.zeros(2))
    with pytest.raises(ValueError, match="mask must be a seqattn.Mask"):
        st.attention(q, k, v, "causal", enable_gqa=True)
    with pytest.raises(ValueError, match="threads must be >= 0"):
        st.attention(q, k, v, enable_gqa=True, threads=-2)
