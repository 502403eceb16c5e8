"""Fast profiling statistics (SPEC §3) on GPU with Triton: LA tile bits and CA page bits of a whole padded batch
of documents for one layer, without materialising probabilities.

Two kernels per layer, each one program per (document, head, block of 64 doc rows or keys):

1. **Row thresholds.** For every doc query row i it walks the keys the row sees (prefix and causal doc keys),
   keeping the running max ``m`` and the running sum ``l = Σ exp(s - m)`` of its fp32 scores
   ``s = (q·k) · scale``, and stores two per-row score thresholds ``t_α = m + ln(α·l)`` and
   ``t_β = m + ln(β·l)``.
   Since ``A[i, j] = exp(s_ij - m) / l``, ``A[i, j] ≥ α ⟺ s_ij ≥ t_α`` (up to rounding, see below).
2. **Statistics.** Key-major: a program holds one block of doc keys and walks the query blocks at or below it,
   recomputing the same scores; a tile's LA bit is set when any causal cell has ``s ≥ t_α``; per key, the number
   of rows with ``s ≥ t_β`` is summed in registers (no atomics; integer, so deterministic).

The second pass needs no exponential at all, so the statistics cost about one extra Q·Kᵀ over the doc×doc lower
triangle plus one online-softmax pass. The CA rule (count / visible > γ) and the tile/page folding are done with
the same fp32 torch arithmetic as :func:`sift_cli.profile.statistics.doc_attention_bits`, which stays the reference.

**Ties.** Scores are fp32 dot products of the model's (bf16 on GPU) q and k, accumulated in a different order
than the reference's fp32 matmul, and the threshold test is done in the log domain. A bit can therefore differ
from the reference only when the deciding probability lies within a few fp32 ulps (relative ~1e-6 on GPU) of α or
β, or a key's count lies exactly at the γ boundary and one such cell moves it. Exact ties of representable
values are kept: a row of equal scores gives ``s = m`` and ``t = m + ln(β·l)``, so ``1/l ≥ β`` decides exactly as
the reference's ``exp(0)/l ≥ β`` does when ``β·l`` is exactly 1 (tested).

Triton is imported lazily; the kernels are jitted on first use, honouring ``TRITON_INTERPRET=1`` (CPU tests).
"""

import functools
import math
import os

import torch
import torch.nn.functional as F

try:  # the kernels' globals; the module imports (and the torch helpers work) without Triton
    import triton.language as tl  # noqa: F401
except Exception:  # pragma: no cover - CPU installs without triton
    import types

    tl = types.SimpleNamespace(constexpr="constexpr")

BLOCK = 64  # rows and keys per program; LA tiles smaller than this are folded inside the block


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:
        return False
    return True


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0", "false", "False")


def usable_on(device: torch.device) -> bool:
    """Whether the Triton path can run on tensors of this device (CUDA, or CPU under TRITON_INTERPRET=1)."""
    return triton_available() and (device.type == "cuda" or interpreting())


# ------------------------------------------------------------------------------------------------------------
# Kernels (plain functions, jitted lazily so that importing this module never needs Triton)
# ------------------------------------------------------------------------------------------------------------

def _thresholds_kernel(Q, K, TA, TB, LENS,
                       sqb, sqh, sqs, skb, skh, sks, stb, sth,
                       prefix_len, scale, ln_alpha, ln_beta, H, GROUP, D,
                       KEYS_MAX: tl.constexpr, DYNAMIC_LOOPS: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(0)  # (doc, head) on axis 0: up to 2^31 programs; blocks on axis 1 (≤ 65535)
    pid_m = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    n = tl.load(LENS + b)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < n
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    qpos = prefix_len + rows
    q = tl.load(Q + b * sqb + h * sqh + qpos[:, None] * sqs + dd[None, :], mask=rmask[:, None] & dmask[None, :],
                other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    # Compiled: walk only the keys this block of rows sees. Interpreter (loop bounds must be host ints there, and
    # it turns assigned names into tensors, hence the inline expression): every key; the masks do the rest.
    for start in range(0, (prefix_len + tl.minimum(pid_m * BLOCK_M + BLOCK_M, n))
                       * (pid_m * BLOCK_M < n).to(tl.int32) if DYNAMIC_LOOPS else KEYS_MAX, BLOCK_N):
        kpos = start + tl.arange(0, BLOCK_N)
        k = tl.load(K + b * skb + hk * skh + kpos[:, None] * sks + dd[None, :],
                    mask=(kpos < prefix_len + n)[:, None] & dmask[None, :], other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        s = tl.where(kpos[None, :] <= qpos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        l_i = l_i * tl.exp(m_i - m_new) + tl.sum(tl.exp(s - m_new[:, None]), axis=1)
        m_i = m_new
    ln_l = tl.log(l_i)
    tl.store(TA + b * stb + h * sth + rows, m_i + (ln_alpha + ln_l), mask=rmask)
    tl.store(TB + b * stb + h * sth + rows, m_i + (ln_beta + ln_l), mask=rmask)


def _stats_kernel(Q, K, TA, TB, LENS, LA, CNT,
                  sqb, sqh, sqs, skb, skh, sks, stb, sth, slb, slh, slr, scb, sch,
                  prefix_len, scale, H, GROUP, D,
                  ROWS_MAX: tl.constexpr, DYNAMIC_LOOPS: tl.constexpr, T: tl.constexpr, TSUB: tl.constexpr,
                  BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    bh = tl.program_id(0)
    pid_n = tl.program_id(1)
    b = bh // H
    h = bh % H
    hk = h // GROUP
    n = tl.load(LENS + b)
    n0 = pid_n * BLOCK_B
    cols = n0 + tl.arange(0, BLOCK_B)
    cmask = cols < n
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    k = tl.load(K + b * skb + hk * skh + (prefix_len + cols)[:, None] * sks + dd[None, :],
                mask=cmask[:, None] & dmask[None, :], other=0.0)
    acc = tl.zeros([BLOCK_B, BLOCK_B], tl.int32)  # per-cell hits, summed over rows once at the end
    sub = tl.arange(0, BLOCK_B // TSUB) * TSUB
    tile_c = (n0 + sub) // T
    # Compiled: only the query blocks at or below this key block; interpreter: all (the causal mask drops them).
    for m0 in range(n0 if DYNAMIC_LOOPS else 0, n if DYNAMIC_LOOPS else ROWS_MAX, BLOCK_B):
        rows = m0 + tl.arange(0, BLOCK_B)
        rmask = rows < n
        q = tl.load(Q + b * sqb + h * sqh + (prefix_len + rows)[:, None] * sqs + dd[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0)
        ta = tl.load(TA + b * stb + h * sth + rows, mask=rmask, other=float("inf"))
        tb = tl.load(TB + b * stb + h * sth + rows, mask=rmask, other=float("inf"))
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        valid = rmask[:, None] & cmask[None, :] & (cols[None, :] <= rows[:, None])
        acc += ((s >= tb[:, None]) & valid).to(tl.int32)
        hit = ((s >= ta[:, None]) & valid).to(tl.int32)
        if TSUB == BLOCK_B:  # the block lies inside one LA tile
            any_hit = tl.max(tl.max(hit, axis=1), axis=0)
            tl.store(LA + b * slb + h * slh + (m0 // T) * slr + n0 // T, any_hit.to(tl.int8), mask=any_hit > 0)
        else:  # fold TSUB×TSUB tiles inside the block
            tiles = tl.reshape(hit, (BLOCK_B // TSUB, TSUB, BLOCK_B // TSUB, TSUB))
            folded = tl.max(tl.max(tiles, axis=3), axis=1)
            tile_r = (m0 + sub) // T
            tl.store(LA + b * slb + h * slh + tile_r[:, None] * slr + tile_c[None, :], folded.to(tl.int8),
                     mask=folded > 0)
    tl.store(CNT + b * scb + h * sch + cols, tl.sum(acc, axis=0), mask=cmask)


@functools.lru_cache(maxsize=4)
def _jitted(interpret: bool):
    import triton
    import triton.language.standard as std

    if interpret != (type(std.zeros).__name__ == "InterpretedFunction"):
        raise RuntimeError("TRITON_INTERPRET changed after triton was imported; set it before the first import")
    return triton.jit(_thresholds_kernel), triton.jit(_stats_kernel)


def _next_pow2(x: int) -> int:
    return 1 << (max(1, x) - 1).bit_length()


def _precision(q: torch.Tensor) -> str:
    return "ieee" if q.dtype == torch.float32 else "tf32"  # fp32: no TF32 rounding; bf16/fp16: ignored


def _prepare(x: torch.Tensor) -> torch.Tensor:
    """Unit stride in the last dim; under the interpreter bf16/fp16 are widened (exactly) to fp32, since its numpy
    emulation does not handle bf16."""
    if interpreting() and x.dtype in (torch.bfloat16, torch.float16):
        x = x.float()
    return x if x.stride(-1) == 1 else x.contiguous()


# ------------------------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------------------------

def row_thresholds(q: torch.Tensor, k: torch.Tensor, prefix_len: int, lengths: torch.Tensor, n_max: int,
                   scale: float, alpha: float, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per doc row, the score thresholds (t_α, t_β) fp32 [B, H, n_max], with the Triton kernel."""
    B, H, _, D = q.shape
    q, k = _prepare(q), _prepare(k)
    ta = torch.empty(B, H, max(1, n_max), dtype=torch.float32, device=q.device)
    tb = torch.empty_like(ta)
    lens = lengths.to(device=q.device, dtype=torch.int32)
    ln_a = math.log(alpha) if alpha > 0 else float("-inf")
    ln_b = math.log(beta) if beta > 0 else float("-inf")
    interp = interpreting()
    thresholds, _ = _jitted(interp)
    grid = (B * H, -(-n_max // BLOCK))
    thresholds[grid](q, k, ta, tb, lens,
                     q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                     ta.stride(0), ta.stride(1),
                     prefix_len, float(scale), ln_a, ln_b, H, H // k.shape[1], D,
                     KEYS_MAX=prefix_len + n_max if interp else 0, DYNAMIC_LOOPS=not interp, BLOCK_M=BLOCK,
                     BLOCK_N=BLOCK, BLOCK_D=max(16, _next_pow2(D)), PRECISION=_precision(q))
    return ta, tb


def torch_row_thresholds(q: torch.Tensor, k: torch.Tensor, prefix_len: int, lengths: list[int], scale: float,
                         alpha: float, beta: float, rows_per_chunk: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """The same thresholds as :func:`row_thresholds` in plain fp32 torch, in row chunks (CPU-checkable)."""
    B, H, S, _ = q.shape
    group = H // k.shape[1]
    ln_a = math.log(alpha) if alpha > 0 else float("-inf")
    ln_b = math.log(beta) if beta > 0 else float("-inf")
    ta = torch.full((B, H, max(1, max(lengths))), float("inf"), dtype=torch.float32, device=q.device)
    tb = ta.clone()
    pos = torch.arange(S, device=q.device)
    for b, n in enumerate(lengths):
        kb = k[b].float().repeat_interleave(group, dim=0)
        for r0 in range(0, n, rows_per_chunk):
            r1 = min(n, r0 + rows_per_chunk)
            s = torch.matmul(q[b, :, prefix_len + r0: prefix_len + r1].float(),
                             kb[:, : prefix_len + r1].transpose(1, 2)) * scale
            qpos = prefix_len + r0 + torch.arange(r1 - r0, device=q.device)
            s = s.masked_fill(pos[None, : prefix_len + r1] > qpos[:, None], float("-inf"))
            m = s.amax(-1)
            ln_l = torch.log(torch.exp(s - m[..., None]).sum(-1))
            ta[b, :, r0:r1] = m + (ln_a + ln_l)
            tb[b, :, r0:r1] = m + (ln_b + ln_l)
    return ta, tb


def batch_attention_bits(q: torch.Tensor, k: torch.Tensor, prefix_len: int, lengths: list[int], scale: float,
                         cfg, thresholds: tuple[torch.Tensor, torch.Tensor] | None = None,
                         lengths_dev: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """LA tiles bool [B, H, P, P] and CA pages bool [B, H, P] (P = pages of the longest document) of a batch.

    q [B, H, S, D], k [B, H_kv, S, D]: one layer's post-RoPE queries and keys of right-padded `prefix ‖ doc_b`
    rows; lengths: doc tokens of each row. Document b's bits are the [:P_b, :P_b] / [:P_b] corner. Equal to
    :func:`sift_cli.profile.statistics.doc_attention_bits` per document up to the ties described in the module
    docstring.
    thresholds: precomputed (t_α, t_β) (tests); by default the Triton threshold kernel computes them.
    """
    B, H = q.shape[:2]
    n_max = max(lengths)
    P = -(-n_max // cfg.tile)
    lens = lengths_dev if lengths_dev is not None else torch.tensor(lengths, dtype=torch.int32, device=q.device)
    la = torch.zeros(B, H, P, P, dtype=torch.int8, device=q.device)
    cnt = torch.zeros(B, H, n_max, dtype=torch.int32, device=q.device)
    batch_attention_stats(q, k, prefix_len, lens, n_max, scale, cfg, la, cnt, thresholds)
    return fold_bits(la, cnt, lens, n_max, cfg)


def batch_attention_stats(q: torch.Tensor, k: torch.Tensor, prefix_len: int, lens: torch.Tensor, n_max: int,
                          scale: float, cfg, la_out: torch.Tensor, cnt_out: torch.Tensor,
                          thresholds: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """The raw statistics of one layer, unfolded: LA tile hits into `la_out` int8 [B, H, P, P] (zeroed by the
    caller: only hits are written) and per-key β counts into `cnt_out` int32 [B, H, n_max]. Both may be strided
    views (e.g. one layer of a [B, layers, H, …] buffer), so a whole forward can be folded at once."""
    B, H, _, D = q.shape
    if la_out.stride(-1) != 1 or cnt_out.stride(-1) != 1:
        raise ValueError("la_out and cnt_out need unit stride in their last dimension")
    q, k = _prepare(q), _prepare(k)
    ta, tb = thresholds if thresholds is not None else row_thresholds(q, k, prefix_len, lens, n_max, scale,
                                                                       cfg.alpha, cfg.beta)
    interp = interpreting()
    _, stats = _jitted(interp)
    grid = (B * H, -(-n_max // BLOCK))
    T = cfg.tile
    stats[grid](q, k, ta, tb, lens, la_out, cnt_out,
                q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                ta.stride(0), ta.stride(1), la_out.stride(0), la_out.stride(1), la_out.stride(2),
                cnt_out.stride(0), cnt_out.stride(1),
                prefix_len, float(scale), H, H // k.shape[1], D,
                ROWS_MAX=n_max if interp else 0, DYNAMIC_LOOPS=not interp, T=T, TSUB=min(T, BLOCK), BLOCK_B=BLOCK,
                BLOCK_D=max(16, _next_pow2(D)), PRECISION=_precision(q))


def fold_bits(la: torch.Tensor, counts: torch.Tensor, lens: torch.Tensor, n_max: int, cfg):
    """Raw kernel output → (LA bool [B, H, P, P], CA bool [B, H, P]) with the reference's fp32 CA arithmetic."""
    B, H, P, _ = la.shape
    T = cfg.tile
    dev = la.device
    tiles = la.bool() & torch.ones(P, P, dtype=torch.bool, device=dev).tril()
    tiles.diagonal(0, -2, -1).fill_(True)  # a view: no indexed write (which costs a host sync per call on CUDA)
    j = torch.arange(n_max, device=dev)
    lens = lens.to(device=dev, dtype=torch.int64)
    visible = (lens[:, None] - j[None, :]).clamp(min=1).float()  # queries i >= j that see key j
    hot = ((counts.float() / visible[:, None, :]) > cfg.gamma) & (j[None, :] < lens[:, None])[:, None, :]
    hot = F.pad(hot, (0, P * T - n_max), value=False)
    return tiles, hot.view(B, H, P, T).any(-1)
