"""FlexAttention backend: a BlockMask on FlexAttention's own uniform grid covering the CSR lists, compiled once
per shape.

Our blocks follow the prompt's segments (block_table.py), FlexAttention's are a global grid, so a flex block is
listed when it overlaps a listed block; the mask_mod then keeps exactly the pairs of listed blocks (a lookup of
the [H, M, N] block mask through each token's query and KV block) and causality. Flex blocks that lie wholly
below the diagonal and wholly inside listed blocks go to the "full" lists, where no mask_mod is evaluated.

A layer with attention features (`features.LayerFeatures`): its window intersects the block mask and joins the
mask_mod (no flex block is "full" then), soft-capping is a score_mod, and the sinks rescale the output through
its log-sum-exp (`features.apply_sinks`).
"""

from __future__ import annotations

import functools

import torch

from .base import BlockLists
from .features import PLAIN, LayerFeatures, apply_sinks, window_blocks


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    import torch._dynamo

    from torch.nn.attention.flex_attention import flex_attention

    # one compilation per prompt length: allow many lengths in one process before dynamo gives up
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def _overlap(starts: torch.Tensor, lengths: torch.Tensor, block: int, n_flex: int) -> torch.Tensor:
    """float [n_ours, n_flex]: 1 where our block [start, start + length) overlaps flex block [f * block, ...)."""
    first = starts.long() // block
    last = (starts.long() + lengths.long() - 1) // block
    f = torch.arange(n_flex, device=starts.device)
    return ((f[None, :] >= first[:, None]) & (f[None, :] <= last[:, None])).float()


def block_mask_from_lists(blocks: BlockLists, block_size: tuple[int, int] | None = None, window: int | None = None):
    """BlockMask computing exactly the pairs of the listed blocks (and causality, and a sliding window), on a
    (128, block_n) flex grid."""
    from torch.nn.attention.flex_attention import BlockMask

    table = blocks.table.to(blocks.offsets.device)
    dev = table.device
    L = table.seq_len
    FBM, FBN = block_size or (max(128, table.block_m), table.block_n)  # flex's query tile is 128 rows
    FM, FN = -(-L // FBM), -(-L // FBN)
    mask = blocks.dense_mask().to(dev)  # [H, M, N]
    if window is not None:
        mask = mask & window_blocks(table.q_start, table.q_len, table.kv_start, table.kv_len, window)[None]
    a_q = _overlap(table.q_start, table.q_len, FBM, FM)  # [M, FM]
    a_k = _overlap(table.kv_start, table.kv_len, FBN, FN)  # [N, FN]
    listed = torch.einsum("mf,hmn,ng->hfg", a_q, mask.float(), a_k)  # listed blocks overlapping each flex block
    touching = a_q.sum(0)[:, None] * a_k.sum(0)[None, :]  # all of our blocks overlapping it
    q_first = torch.arange(FM, device=dev) * FBM
    k_first = torch.arange(FN, device=dev) * FBN
    causal = k_first[None, :] <= torch.clamp(q_first + FBM, max=L)[:, None] - 1
    below = ((k_first[None, :] + FBN - 1 <= q_first[:, None])  # every pair causal
             & (q_first[:, None] + FBM <= L) & (k_first[None, :] + FBN <= L))  # and in bounds
    any_listed = (listed > 0) & causal[None]
    full = any_listed & (listed == touching[None]) & below[None] & (window is None)
    partial = any_listed & ~full

    def lists(m):
        counts = m.sum(-1, dtype=torch.int32)
        # selected block ids first (stable, ascending), kept as the index list
        order = torch.argsort((~m).to(torch.int8), dim=-1, stable=True).to(torch.int32)
        return counts[None].contiguous(), order[None].contiguous()

    kv_num, kv_idx = lists(partial)
    full_num, full_idx = lists(full)
    row_block, key_block = table.token_blocks()

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & mask[h, row_block[q_idx], key_block[kv_idx]]

    if window is not None:
        def mask_mod(b, h, q_idx, kv_idx):  # noqa: F811 - the windowed form
            return ((q_idx >= kv_idx) & (q_idx - kv_idx < window)
                    & mask[h, row_block[q_idx], key_block[kv_idx]])

    # compute_q_blocks builds the transposed lists only the backward pass reads: skip it (forward only)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=(FBM, FBN), mask_mod=mask_mod,
                                    seq_lengths=(L, L), compute_q_blocks=False)


def _kernel_option_candidates(block_n: int):
    """Flex's own KV tile must divide the BlockMask's KV block: 64-wide blocks need BLOCK_N = 64."""
    return [None] if block_n >= 128 else [{"BLOCK_N": 64}, {"fwd_BLOCK_N": 64}, None]


class FlexBackend:
    name = "flex"

    def __init__(self):
        self._options: dict[int, dict | None] = {}  # block_n → kernel_options that compiled

    def prepare(self, table, block_lists: list[BlockLists], stacked=None):
        """attend(layer, q, k, v, scale) with every layer's BlockMask built once per prompt."""
        masks = [block_mask_from_lists(b) for b in block_lists]

        def attend(layer, q, k, v, scale):
            return self.forward(q, k, v, block_lists[layer], scale, plan=masks[layer])

        return attend

    def forward(self, q, k, v, blocks: BlockLists, scale, return_lse=False, plan=None,
                features: LayerFeatures = PLAIN):
        from torch.nn.attention.flex_attention import AuxRequest

        bm = plan if plan is not None else block_mask_from_lists(blocks, window=features.window)
        group = q.shape[0] // k.shape[0]
        softcap, sinks = features.softcap, features.sinks
        if sinks is not None and return_lse:
            raise ValueError("the log-sum-exp of a layer with sinks is not computed")
        lse_needed = return_lse or sinks is not None
        score_mod = None
        if softcap is not None:
            def score_mod(score, b, h, q_idx, kv_idx):
                return softcap * torch.tanh(score / softcap)

        def call(options):
            return _compiled_flex()(q[None], k[None], v[None], block_mask=bm, scale=scale, enable_gqa=group > 1,
                                    score_mod=score_mod, return_aux=AuxRequest(lse=True) if lse_needed else None,
                                    kernel_options=options)

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
        if sinks is not None:
            o, aux = out
            return apply_sinks(o[0], aux.lse[0], sinks)
        if return_lse:
            o, aux = out
            return o[0], aux.lse[0].float()
        return out[0]

    def featured(self, block_lists: list[BlockLists]):
        """attend(layer, q, k, v, scale, features) for layers with attention features, each layer's BlockMask
        built at its first call (its window is known then)."""
        masks: dict[int, object] = {}

        def attend(layer, q, k, v, scale, features):
            if layer not in masks:
                masks[layer] = block_mask_from_lists(block_lists[layer], window=features.window)
            return self.forward(q, k, v, block_lists[layer], scale, plan=masks[layer], features=features)

        return attend
