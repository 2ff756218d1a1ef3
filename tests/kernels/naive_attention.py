"""A naive paged attention in float64, written from the formulas (the Triton tests here and the C++
ones in cpu/ check every attention path against it), and a pool poisoned outside the sliding
windows."""

import math

import torch

# The options the tests combine (keywords of their check functions): softcap at 5 over scores of a
# few units (q_gain), so the tanh bends them.
OPTION_CASES = {
    "softcap": dict(softcap=5.0, q_gain=3.0),
    "sinks": dict(with_sinks=True),
    "window_softcap": dict(window=12, softcap=5.0, q_gain=3.0),
    "window_sinks": dict(window=12, with_sinks=True),
    "all": dict(window=17, softcap=5.0, with_sinks=True, q_gain=3.0),
}


def naive_attention(q, k_cache, v_cache, md, scale, window=None, softcap=None, sinks=None):
    """The attention of every query in float64, one sequence at a time: its keys and values
    gathered position by position through its block table, every score written out, a dense
    masked softmax (the sink one more logit in it, dropped before the values)."""
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    out = torch.zeros(q.shape, dtype=torch.float64, device="cpu")
    for i in range(md.num_seqs):
        length = md.seq_lens_cpu[i]
        q0, q1 = md.query_start_loc_cpu[i], md.query_start_loc_cpu[i + 1]
        table = md.block_tables[i].tolist()
        rows = [(table[p // block_size], p % block_size) for p in range(length)]
        keys = torch.stack([k_cache[b, o] for b, o in rows]).double().cpu()  # [L, Hkv, D]
        values = torch.stack([v_cache[b, o] for b, o in rows]).double().cpu()
        keys = keys.transpose(0, 1).repeat_interleave(group, 0)  # [Hq, L, D]
        values = values.transpose(0, 1).repeat_interleave(group, 0)
        queries = q[q0:q1].double().cpu().transpose(0, 1)  # [Hq, n, D]
        q_pos = torch.arange(length - (q1 - q0), length, device="cpu").unsqueeze(1)
        k_pos = torch.arange(length, device="cpu").unsqueeze(0)
        visible = k_pos <= q_pos
        if window is not None:
            visible &= k_pos > q_pos - window
        scores = queries @ keys.transpose(1, 2) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        scores = scores.masked_fill(~visible, -math.inf)
        if sinks is not None:
            sink = sinks.double().cpu()[:, None, None].expand(-1, q1 - q0, 1)
            scores = torch.cat([scores, sink], dim=-1)
        weights = torch.softmax(scores, dim=-1)[..., :length]
        out[q0:q1] = (weights @ values).transpose(0, 1)
    return out


def poison_outside_windows(cache, md, window):
    """A copy of `cache` with NaN at the keys before the window of each sequence's first query."""
    poisoned = cache.clone()
    if window is None:
        return poisoned
    block_size = cache.shape[1]
    for i in range(md.num_seqs):
        q_len = md.query_start_loc_cpu[i + 1] - md.query_start_loc_cpu[i]
        for p in range(max(0, md.seq_lens_cpu[i] - q_len - window + 1)):
            poisoned[int(md.block_tables[i, p // block_size]), p % block_size] = float("nan")
    return poisoned
