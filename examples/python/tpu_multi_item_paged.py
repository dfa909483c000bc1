"""Multi-item scoring (sglang-jax) on seqattn's Pallas TPU kernel, with paged K/V, prefill and extend.

  python examples/python/tpu_multi_item_paged.py

A ragged batch of three scoring requests, each packed as ``query ‖ d ‖ item_1 ‖ d ‖ … ‖ item_n ‖ d``
(docs/semantics/multi-item-topk-kascade.md §A.1; one item is empty), with the delimiter-reset positions of
§A.2 fed to RoPE. K and V sit in a page pool of 128-token pages (page size = the kernel's block_kv), handed out
to the requests in shuffled order; the kernel reads them through the page table, as a serving engine's paged
cache would be read. Two steps run in Pallas interpret mode on the CPU:

  prefill  every token of every request, mask ``seqattn.MultiItemMask`` (layout from ``static_layout``)
  extend   the last few tokens of each request (one request: a single token, a decode step), bottom-right:
           their rows of the same mask, against all keys, through the same pages

Checks (element by element, each able to fail):
  - prefill against the C++ engine (``seqattn.attention``, THD, MultiItemMask) on the contiguous K/V: output and
    LSE; rows past a request's end must come out 0 with LSE -inf;
  - extend against the engine's prefill rows of the same tokens (an extend step must reproduce them);
  - each non-empty item's rows against the engine on the serial request ``query ‖ d ‖ item`` with plain
    causal attention and positions 0, 1, ...: what the mask plus the position reset promise (§A.2).
Then the forward work (``seqattn.pallas.traffic``) against Splash on the same masks: Splash has no ragged batch
and no paged K/V, so it is counted request by request on each request padded to a multiple of the block, the
request's mask handed over as a dense mask (Splash's NumpyMask route; feasible at these sizes).
"""

import numpy as np

import jax.numpy as jnp

import seqattn
from seqattn import splash
from seqattn.pallas import dense_from_layout, page_table, static_layout
from seqattn.pallas.kernel import flash_attention
from seqattn.pallas.traffic import Work, layout_forward_work, splash_forward_work

BLOCK = 128  # block_q = block_kv = page size
DELIM = 1000  # the delimiter token; other tokens are drawn below it, so it occurs in no query or item
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
VOCAB = DELIM + 1
# (query length, item lengths) per request; 0 = an empty item (accepted upstream, §A.11).
REQUESTS = [(40, [30, 0, 75, 50, 20]), (100, [60, 90]), (25, [150, 120, 45, 10])]
NEW_TOKENS = [6, 1, 4]  # extend step: how many trailing tokens each request brings (1: a decode step)
TOL = 1e-4  # float32 in, float32 accumulation on both sides


def pack(rng, query_len, item_lens):
    """Tokens of one request, its item spans (start, end) in the packed sequence, and its A.2 positions."""
    query = rng.integers(0, DELIM, query_len)
    tokens, spans = [query, [DELIM]], []
    at = query_len + 1
    for n in item_lens:
        tokens += [rng.integers(0, DELIM, n), [DELIM]]
        spans.append((at, at + n))
        at += n + 1
    tokens = np.concatenate(tokens).astype(np.int32)
    # Positions: query 0..L-1; a token at i >= L sits at L + (i - last delimiter at or before i), so every
    # delimiter is at L and every item restarts at L + 1 (§A.2).
    i = np.arange(tokens.size)
    last_delim = np.maximum.accumulate(np.where(tokens == DELIM, i, -1))
    pos = np.where(i < query_len, i, query_len + i - last_delim).astype(np.int32)
    return tokens, spans, pos


def rope(x, pos):
    """Rotary embedding (half-split) of x [..., S, D] at positions pos [S]."""
    half = x.shape[-1] // 2
    angle = pos[:, None] * (10000.0 ** (-np.arange(half) / half))[None, :]
    cos, sin = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(np.float32)


def embed(tables, tokens, pos):
    """q [H, S, D], k and v [Hkv, S, D] of a token sequence: a fixed vector per token, RoPE on q and k.
    Deterministic in (token, position), so a token gets the same q, k, v wherever it is packed."""
    eq, ek, ev = tables
    return (rope(eq[tokens].transpose(1, 0, 2), pos), rope(ek[tokens].transpose(1, 0, 2), pos),
            ev[tokens].transpose(1, 0, 2))


def paged(x, table, num_pages):
    """[B, Hkv, pages_per_seq * BLOCK, D] -> the pool [num_pages, Hkv, BLOCK, D] through the block table.
    Unused pages hold NaN: a read of a page the table does not name would show up in the output."""
    b, hkv, s, d = x.shape
    pool = np.full((num_pages, hkv, BLOCK, d), np.nan, np.float32)
    per_page = x.reshape(b, hkv, s // BLOCK, BLOCK, d).transpose(0, 2, 1, 3, 4)
    for i in range(b):
        for p in range(s // BLOCK):
            if table[i, p] >= 0:
                pool[table[i, p]] = per_page[i, p]
    return pool


def max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def forward_work_vs_splash(layout, requests_dense, itemsize):
    """Our kernel's forward work on ``layout`` and Splash's, request by request, on each request's dense mask
    padded to a multiple of BLOCK."""
    ours = layout_forward_work(layout, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, itemsize=itemsize)
    theirs = Work(0, 0, 0, 0, 0, 0)
    for dense in requests_dense:
        n = -(-dense.shape[0] // BLOCK) * BLOCK
        padded = np.zeros((n, n), bool)
        padded[: dense.shape[0], : dense.shape[1]] = dense
        info = splash.mask_info(seqattn.DenseMask(padded), BLOCK, BLOCK, heads=HEADS)
        theirs += splash_forward_work(info, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM, block_q=BLOCK,
                                      block_kv=BLOCK, itemsize=itemsize)
    return ours, theirs


def run(seed=0, verbose=True):
    """Runs both steps and every check; returns the max errors and the work counts (the tests call this)."""
    rng = np.random.default_rng(seed)
    say = print if verbose else (lambda *a, **k: None)
    scale = 0.5 / np.sqrt(HEAD_DIM)  # random embeddings: a gentler scale keeps many keys' weights in the check
    tables = (rng.standard_normal((VOCAB, HEADS, HEAD_DIM)), rng.standard_normal((VOCAB, KV_HEADS, HEAD_DIM)),
              rng.standard_normal((VOCAB, KV_HEADS, HEAD_DIM)).astype(np.float32))
    packed = [pack(rng, ql, items) for ql, items in REQUESTS]
    lens = np.array([t.size for t, _, _ in packed], np.int32)
    b = len(packed)
    pages_per_seq = int(-(-lens.max() // BLOCK))
    s = pages_per_seq * BLOCK  # the padded length of both q and kv in the prefill

    # Contiguous (padded) q, k, v in the kernel's [B, H, S, D]; zeros past each request's end.
    q = np.zeros((b, HEADS, s, HEAD_DIM), np.float32)
    k = np.zeros((b, KV_HEADS, s, HEAD_DIM), np.float32)
    v = np.zeros_like(k)
    for i, (tokens, _, pos) in enumerate(packed):
        q[i, :, : tokens.size], k[i, :, : tokens.size], v[i, :, : tokens.size] = embed(tables, tokens, pos)

    # The page pool: each request's pages handed out in shuffled order, two spare pages left unused.
    need = -(-lens // BLOCK)
    num_pages = int(need.sum()) + 2
    order = rng.permutation(num_pages)
    block_table = np.full((b, pages_per_seq), -1, np.int32)
    at = 0
    for i in range(b):
        block_table[i, : need[i]] = order[at: at + need[i]]
        at += need[i]
    table = page_table(block_table, lens, num_pages=num_pages, block_kv=BLOCK)
    k_pages, v_pages = (jnp.asarray(paged(x, block_table, num_pages)) for x in (k, v))

    # --- prefill --------------------------------------------------------------------------------------------------
    mask = seqattn.MultiItemMask([t for t, _, _ in packed], DELIM)
    layout = static_layout(mask, s, s, q_lens=lens, block_q=BLOCK, block_kv=BLOCK)
    out, lse = flash_attention(jnp.asarray(q), k_pages, v_pages, layout, scale=scale, page_table=table,
                               return_lse=True, interpret=True)
    out, lse = np.asarray(out), np.asarray(lse)

    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    thd = lambda x: np.concatenate([x[i, :, : lens[i]].transpose(1, 0, 2) for i in range(b)])  # noqa: E731
    e_out, e_lse = seqattn.attention(thd(q), thd(k), thd(v), mask, cu_seqlens=cu, scale=scale)
    err_out = max(max_err(out[i, :, : lens[i]].transpose(1, 0, 2), e_out[cu[i]: cu[i + 1]]) for i in range(b))
    err_lse = max(max_err(lse[i, :, : lens[i]], e_lse[:, cu[i]: cu[i + 1]]) for i in range(b))
    for i in range(b):  # rows past the request: 0 and -inf (no key to attend to)
        assert np.all(out[i, :, lens[i]:] == 0) and np.all(np.isneginf(lse[i, :, lens[i]:])), f"padding rows of {i}"
    assert err_out < TOL and err_lse < TOL, (err_out, err_lse)
    say(f"prefill: {b} requests of {lens.tolist()} tokens, {num_pages} pages of {BLOCK} (table {block_table.tolist()})")
    say(f"  vs seqattn.attention (THD, MultiItemMask, contiguous K/V): max |out| err {err_out:.2e}, "
        f"max |lse| err {err_lse:.2e}")

    # Each non-empty item's rows: equal to the serial request query ‖ d ‖ item under plain causal attention.
    err_serial = 0.0
    for i, ((ql, _), (tokens, spans, _)) in enumerate(zip(REQUESTS, packed)):
        for lo, hi in spans:
            if hi == lo:
                continue
            serial = np.concatenate([tokens[: ql + 1], tokens[lo:hi]])
            sq, sk, sv = embed(tables, serial, np.arange(serial.size))
            bshd = lambda x: x.transpose(1, 0, 2)[None]  # noqa: E731
            s_out, _ = seqattn.attention(bshd(sq), bshd(sk), bshd(sv), seqattn.CausalMask(), scale=scale)
            err_serial = max(err_serial, max_err(out[i, :, lo:hi].transpose(1, 0, 2), s_out[0, ql + 1:]))
    assert err_serial < TOL, err_serial
    say(f"  each item's rows vs the serial request query ‖ d ‖ item (causal, positions 0..): max err "
        f"{err_serial:.2e}")

    # --- extend / decode ------------------------------------------------------------------------------------------
    # The new tokens' rows of the request's mask, against all of its keys (bottom-right). MultiItemMask refuses
    # kv_len != q_len (request-local coordinates, §A.7), so the rows go to the layout builder as a dense mask.
    new = np.array(NEW_TOKENS, np.int32)
    full = seqattn.to_dense(mask)[:, 0]  # [B, max len, max len]
    rows = np.zeros((b, int(new.max()), s), bool)
    q_ext = np.zeros((b, HEADS, BLOCK, HEAD_DIM), np.float32)
    for i in range(b):
        rows[i, : new[i], : lens[i]] = full[i, lens[i] - new[i]: lens[i], : lens[i]]
        q_ext[i, :, : new[i]] = q[i, :, lens[i] - new[i]: lens[i]]
    ext_layout = static_layout(seqattn.DenseMask(rows), BLOCK, s, q_lens=new, kv_lens=lens, block_q=BLOCK,
                               block_kv=BLOCK)
    assert np.array_equal(dense_from_layout(ext_layout)[:, 0, : rows.shape[1]], rows)
    ext_out, ext_lse = flash_attention(jnp.asarray(q_ext), k_pages, v_pages, ext_layout, scale=scale,
                                       page_table=table, return_lse=True, interpret=True)
    ext_out, ext_lse = np.asarray(ext_out), np.asarray(ext_lse)
    err_ext = max(max_err(ext_out[i, :, : new[i]].transpose(1, 0, 2), e_out[cu[i + 1] - new[i]: cu[i + 1]])
                  for i in range(b))
    err_ext_lse = max(max_err(ext_lse[i, :, : new[i]], e_lse[:, cu[i + 1] - new[i]: cu[i + 1]]) for i in range(b))
    assert err_ext < TOL and err_ext_lse < TOL, (err_ext, err_ext_lse)
    say(f"extend: {new.tolist()} new tokens per request (bottom-right), kv through the same pages")
    say(f"  vs the engine's prefill rows of those tokens: max |out| err {err_ext:.2e}, max |lse| err "
        f"{err_ext_lse:.2e}")

    # --- work counts ----------------------------------------------------------------------------------------------
    ours, theirs = forward_work_vs_splash(layout, [full[i, : lens[i], : lens[i]] for i in range(b)], 4)
    say("forward work, prefill (counts from the metadata, not TPU time; float32 bytes):")
    say(f"  {'':28s}{'grid steps':>12s}{'computed':>10s}{'K/V DMAs':>10s}{'HBM bytes':>12s}")
    for name, w in (("seqattn.pallas (paged)", ours), ("Splash (per request, dense)", theirs)):
        say(f"  {name:28s}{w.grid_steps:12d}{w.computed:10d}{w.kv_fetches:10d}{w.hbm_bytes:12d}")
    return dict(prefill=err_out, prefill_lse=err_lse, serial=err_serial, extend=err_ext, extend_lse=err_ext_lse,
                ours=ours, splash=theirs)


def main():
    run()


if __name__ == "__main__":
    main()
