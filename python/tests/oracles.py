"""Independent NumPy oracles for the bindings' tests (no seqattn code)."""

import numpy as np

NEG_INF = -np.inf


# ---- descriptors: TE's reference (mask-defined) semantics, O(T^2) per row ----

def run_length_fill(ids):
    out = np.zeros_like(ids)
    t = 0
    while t < len(ids):
        e = t
        while e < len(ids) and ids[e] == ids[t]:
            e += 1
        if ids[t] != 0:
            out[t:e] = e - t
        t = e
    return out


def _P(ids, m):
    """Per-slot lengths and first tokens of segments 1..m (first token -1 when absent)."""
    lens = np.array([np.sum(ids == k + 1) for k in range(m)], np.int32)
    offs = np.full(m + 1, -1, np.int32)
    for k in range(m):
        where = np.flatnonzero(ids == k + 1)
        if where.size:
            offs[k] = where[0]
    return lens, offs


def te_reference(q_ids, kv_ids, q_pos, kv_pos, mask_type, layout, m):
    """(q_seqlens, kv_seqlens, q_offsets, kv_offsets) for ids (*E, B, T), pos broadcast over leading dims."""
    q_ids, kv_ids = np.asarray(q_ids), np.asarray(kv_ids)
    lead = q_ids.shape[:-1]
    rows_q = q_ids.reshape(-1, q_ids.shape[-1])
    rows_kv = kv_ids.reshape(-1, kv_ids.shape[-1])
    pos_q = np.asarray(q_pos).reshape(-1, q_ids.shape[-1])
    pos_kv = np.asarray(kv_pos).reshape(-1, kv_ids.shape[-1])
    causal = mask_type in ("causal", "padding_causal")
    bottom_right = mask_type in ("causal_bottom_right", "padding_causal_bottom_right")
    padding = mask_type.startswith("padding")
    if layout == "bshd":
        s_q, s_kv = rows_q.shape[1], rows_kv.shape[1]
        if padding:
            ql = np.array([np.sum(r != 0) for r in rows_q], np.int32)
            kl = np.array([np.sum(r != 0) for r in rows_kv], np.int32)
        else:
            ql = np.full(len(rows_q), s_q, np.int32)
            kl = np.full(len(rows_kv), s_kv, np.int32)
        return ql.reshape(lead), kl.reshape(lead), np.zeros(0, np.int32), np.zeros(0, np.int32)
    out = [[], [], [], []]
    for r in range(len(rows_q)):
        qi, ki = rows_q[r], rows_kv[r]
        qp, kp = pos_q[r % len(pos_q)], pos_kv[r % len(pos_kv)]
        qk, kk = run_length_fill(qi) - qp, run_length_fill(ki) - kp
        allow = (qi[:, None] == ki[None, :]) & (qi[:, None] != 0)
        if causal:
            allow &= qp[:, None] >= kp[None, :]
        if bottom_right:
            allow &= qk[:, None] <= kk[None, :]
        row_ids = np.where(allow.any(1), qi, 0)
        col_ids = np.where(allow.any(0), ki, 0)
        ql, qo = _P(row_ids, m)
        kl, ko = _P(col_ids, m)
        for lst, v in zip(out, (ql, kl, qo, ko)):
            lst.append(v)
    return (np.stack(out[0]).reshape(lead + (m,)), np.stack(out[1]).reshape(lead + (m,)),
            np.stack(out[2]).reshape(lead + (m + 1,)), np.stack(out[3]).reshape(lead + (m + 1,)))


def random_segments(rng, batch, t, max_segments, gaps=True, shift_pos=True):
    """Valid ids (numbered 1, 2, ... in order, contiguous runs, 0 = padding) and positions."""
    ids = np.zeros((batch, t), np.int32)
    pos = np.zeros((batch, t), np.int32)
    for b in range(batch):
        n = rng.integers(0, max_segments + 1)
        cursor = 0
        for s in range(1, n + 1):
            if gaps and rng.random() < 0.3:
                cursor += rng.integers(0, 3)
            length = rng.integers(1, max(2, t // max(1, n)) + 1)
            if cursor >= t:
                break
            end = min(t, cursor + length)
            ids[b, cursor:end] = s
            start = rng.integers(0, 3) if shift_pos else 0
            pos[b, cursor:end] = start + np.arange(end - cursor)
            cursor = end
    return ids, pos


# ---- masks: predicates evaluated on index grids ----

def document_pattern(rng, n):
    """[n] ids 1, 2, ... of consecutive documents of random lengths (1 to n / 3 + 1 tokens), no padding."""
    ids = np.zeros(n, np.int32)
    t, doc = 0, 1
    while t < n:
        length = int(rng.integers(1, n // 3 + 2))
        ids[t : t + length] = doc
        t += length
        doc += 1
    return ids


def grid(q_len, kv_len):
    return np.arange(q_len)[:, None], np.arange(kv_len)[None, :]


def shift(alignment, q_len, kv_len):
    return kv_len - q_len if alignment == "bottom_right" else 0


def causal(q_len, kv_len, alignment="top_left"):
    q, kv = grid(q_len, kv_len)
    return kv <= q + shift(alignment, q_len, kv_len)


def window(q_len, kv_len, left, right, alignment="top_left"):
    q, kv = grid(q_len, kv_len)
    d = kv - q - shift(alignment, q_len, kv_len)
    ok = np.ones((q_len, kv_len), bool)
    if left >= 0:
        ok &= d >= -left
    if right >= 0:
        ok &= d <= right
    return ok


def chunked(q_len, kv_len, chunk, alignment="top_left"):
    q, kv = grid(q_len, kv_len)
    p = q + shift(alignment, q_len, kv_len)
    return (p >= 0) & (kv <= p) & (kv >= (p // chunk) * chunk)


def prefix_lm(q_len, kv_len, prefix, alignment="top_left"):
    q, kv = grid(q_len, kv_len)
    return (kv < prefix) | (kv <= q + shift(alignment, q_len, kv_len))


def document(q_ids, kv_ids, q_pos=None, kv_pos=None, inner=None):
    """One row: same nonzero id, and inner(local q, local kv, q_len, kv_len) at the positions."""
    q_ids, kv_ids = np.asarray(q_ids), np.asarray(kv_ids)
    ok = (q_ids[:, None] == kv_ids[None, :]) & (q_ids[:, None] != 0)
    if inner is None:
        return ok

    def local(ids, pos):
        loc = np.zeros(len(ids), np.int64)
        run_len = np.zeros(len(ids), np.int64)  # pos of the run's first token + its length
        t = 0
        while t < len(ids):
            e = t
            while e < len(ids) and ids[e] == ids[t]:
                e += 1
            first = pos[t] if pos is not None else 0
            loc[t:e] = first + np.arange(e - t)
            run_len[t:e] = first + (e - t)
            t = e
        return loc, run_len

    lq, nq = local(q_ids, q_pos)
    lk, nk = local(kv_ids, kv_pos)
    out = np.zeros_like(ok)
    for i in range(len(q_ids)):
        for j in range(len(kv_ids)):
            if ok[i, j]:
                out[i, j] = inner(lq[i], lk[j], nq[i], nk[j])
    return out


def multi_item(tokens, delimiter):
    """sglang-jax: q < prefix_end ? kv <= q : kv < prefix_end or seg_start(q) <= kv <= q."""
    tokens = np.asarray(tokens)
    n = len(tokens)
    delims = np.flatnonzero(tokens == delimiter)
    prefix_end = delims[0] + 1
    seg_start = np.zeros(n, np.int64)
    for a, b in zip(delims[:-1], delims[1:]):
        seg_start[a + 1 : b + 1] = a + 1
    q, kv = grid(n, n)
    return np.where(q < prefix_end, kv <= q, (kv < prefix_end) | ((seg_start[:, None] <= kv) & (kv <= q)))


# ---- attention: materialized softmax in float64 ----

def _heads_expanded(q, k, v, scale):
    """float64 q, and k / v repeated to q's heads (GQA); the default scale 1/sqrt(dk)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[2]
    scale = 1.0 / np.sqrt(q.shape[3]) if scale is None else scale
    return q, np.repeat(k, group, axis=2), np.repeat(v, group, axis=2), scale


def attention(q, k, v, allowed, scale=None, softcap=0.0):
    """BSHD; allowed [B, Hq or 1, Sq, Skv] bool. Returns (out [B,Sq,Hq,Dv], lse [B,Hq,Sq])."""
    q, kk, vv, scale = _heads_expanded(q, k, v, scale)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    allowed = np.broadcast_to(allowed, s.shape)
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe)
    denom = p.sum(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(denom[..., 0] > 0, np.log(denom[..., 0]) + m_safe[..., 0], -np.inf)
        p = np.where(denom > 0, p / np.where(denom > 0, denom, 1), 0.0)
    out = np.einsum("bhqk,bkhd->bqhd", p, vv)
    return out, lse


def attention_grads(q, k, v, allowed, dout, scale=None):
    """Gradients (dq, dk, dv) of sum(out * dout) for attention(...) in float64, GQA heads summed into dk/dv."""
    dout = np.asarray(dout, np.float64)
    b, hkv = q.shape[0], k.shape[2]
    group = q.shape[2] // hkv
    out, lse = attention(q, k, v, allowed, scale=scale)
    q, kk, vv, scale = _heads_expanded(q, k, v, scale)
    s = np.einsum("bqhd,bkhd->bhqk", q, kk) * scale
    allowed = np.broadcast_to(allowed, s.shape)
    finite = np.isfinite(lse)[..., None]
    p = np.where(allowed & finite, np.exp(s - np.where(finite, lse[..., None], 0.0)), 0.0)
    dvv = np.einsum("bhqk,bqhd->bkhd", p, dout)
    dp = np.einsum("bqhd,bkhd->bhqk", dout, vv)
    delta = np.einsum("bqhd,bqhd->bhq", dout, out)[..., None]
    ds = p * (dp - delta) * scale
    dq = np.einsum("bhqk,bkhd->bqhd", ds, kk)
    dkk = np.einsum("bhqk,bqhd->bkhd", ds, q)
    fold = lambda x: x.reshape(b, x.shape[1], hkv, group, x.shape[-1]).sum(3)  # noqa: E731
    return dq, fold(dkk), fold(dvv)
