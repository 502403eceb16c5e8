"""FlexAttention backend: a BlockMask built straight from the CSR lists, compiled once per shape.

Blocks entirely below the diagonal go to the "full" lists (no mask function is evaluated on them); the rest
carry the causal mask_mod.
"""

from __future__ import annotations

import functools

import torch

from .base import BlockLists


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    import torch._dynamo

    from torch.nn.attention.flex_attention import flex_attention

    # one compilation per prompt length: allow many lengths in one process before dynamo gives up
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def block_mask_from_lists(blocks: BlockLists, exact_mask_mod: bool = False):
    """BlockMask listing the same blocks. Compiled flex skips unlisted blocks itself, so the mask_mod only states
    causality; exact_mask_mod also looks each block up, so that eager (uncompiled) flex, which applies only the
    mask_mod, computes the same function (tests; the captured [H, M, N] tensor is too costly for long prompts)."""
    from torch.nn.attention.flex_attention import BlockMask

    dev = blocks.offsets.device
    H, M, N = blocks.n_heads, blocks.n_query_blocks, blocks.n_kv_blocks
    L, BM, BN = blocks.seq_len, blocks.block_m, blocks.block_n
    mask = blocks.dense_mask()  # [H, M, N]
    q_first = torch.arange(M, device=dev) * BM
    k_first = torch.arange(N, device=dev) * BN
    full_shape = ((k_first[None, :] + BN - 1 <= q_first[:, None])  # every pair causal
                  & (q_first[:, None] + BM <= L) & (k_first[None, :] + BN <= L))  # and in bounds
    full = mask & full_shape[None]
    partial = mask & ~full_shape[None]

    def lists(m):
        counts = m.sum(-1, dtype=torch.int32)
        # sort selected block ids first (stable, ascending) and keep them as the index list
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None].contiguous(), order[None].contiguous()

    kv_num, kv_idx = lists(partial)
    full_num, full_idx = lists(full)
    mask_mod = _causal
    if exact_mask_mod:
        def mask_mod(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & mask[h, q_idx // BM, kv_idx // BN]
    # compute_q_blocks builds the transposed lists only the backward pass reads: skip it (forward only)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(BM, BN), mask_mod=mask_mod,
                                    seq_lengths=(L, L), compute_q_blocks=False)


def _kernel_option_candidates(block_n: int):
    """Flex's own KV tile must divide the BlockMask's KV block: 64-wide blocks need BLOCK_N = 64."""
    return [None] if block_n >= 128 else [{"BLOCK_N": 64}, {"fwd_BLOCK_N": 64}, None]


class FlexBackend:
    name = "flex"

    def __init__(self):
        self._options: dict[int, dict | None] = {}  # block_n → kernel_options that compiled

    def prepare(self, blocks: BlockLists):
        return block_mask_from_lists(blocks)

    def forward(self, q, k, v, blocks: BlockLists, scale, return_lse=False, plan=None):
        from torch.nn.attention.flex_attention import AuxRequest

        bm = plan if plan is not None else block_mask_from_lists(blocks)
        group = q.shape[0] // k.shape[0]

        def call(options):
            return _compiled_flex()(q[None], k[None], v[None], block_mask=bm, scale=scale, enable_gqa=group > 1,
                                    return_aux=AuxRequest(lse=True) if return_lse else None, kernel_options=options)

        if blocks.block_n in self._options:
            out = call(self._options[blocks.block_n])
        else:
            error = None
            for options in _kernel_option_candidates(blocks.block_n):
                try:
                    out = call(options)
                    self._options[blocks.block_n] = options
                    break
                except Exception as exc:  # this torch spells the option differently: try the next
                    error = exc
            else:
                raise error
        if return_lse:
            o, aux = out
            return o[0], aux.lse[0].float()
        return out[0]
