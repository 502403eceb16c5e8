"""FlexAttention backend: Flex's BlockMask built from the prompt's own document-aligned block table, compiled
once per shape.

Our blocks follow the prompt's segments (block_table.py); Flex's are uniform. `flex_layout` pads every query
block to `block_m` rows and every KV block to `block_n` keys, so each of our blocks is one Flex block: our CSR
lists are Flex's lists, whole causal blocks are "full" (no mask_mod), and the mask_mod (causality over token →
position lookups) runs only on blocks a segment's end or the diagonal cuts. The gathers into and out of the padded
layout are part of each call.

A layer with attention features (`features.LayerFeatures`): its window intersects the block mask and joins the
mask_mod (no block is "full" then), soft-capping is a score_mod, and the sinks rescale the output through its
log-sum-exp (`features.apply_sinks`).
"""

from __future__ import annotations

import functools

import torch

from .base import BlockLists
from .features import PLAIN, LayerFeatures, apply_sinks
from .flex_layout import block_mask_on_table


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    import torch._dynamo

    from torch.nn.attention.flex_attention import flex_attention

    # one compilation per prompt length: allow many lengths in one process before dynamo gives up
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    return torch.compile(flex_attention, dynamic=False)


def _kernel_option_candidates(block_m: int, block_n: int):
    """Flex's own tiles must divide the BlockMask's blocks: 64-row / 64-wide blocks need BLOCK_M / BLOCK_N = 64
    (older torch spells them fwd_BLOCK_*)."""
    opts = {**({"BLOCK_M": 64} if block_m < 128 else {}), **({"BLOCK_N": 64} if block_n < 128 else {})}
    if not opts:
        return [None]
    return [opts, {f"fwd_{k}": v for k, v in opts.items()}, None]


class FlexBackend:
    name = "flex"

    def __init__(self):
        self._options: dict[tuple, dict | None] = {}  # (block_m, block_n) → kernel_options that compiled

    def prepare(self, table, block_lists: list[BlockLists], stacked=None):
        """attend(layer, q, k, v, scale) with every layer's BlockMask built once per prompt (one padded layout)."""
        layout = None
        masks = []
        for b in block_lists:
            mask, layout = block_mask_on_table(b, layout)
            masks.append((mask, layout))

        def attend(layer, q, k, v, scale):
            return self.forward(q, k, v, block_lists[layer], scale, plan=masks[layer])

        return attend

    def forward(self, q, k, v, blocks: BlockLists, scale, return_lse=False, plan=None,
                features: LayerFeatures = PLAIN):
        from torch.nn.attention.flex_attention import AuxRequest

        bm, layout = plan if plan is not None else block_mask_on_table(blocks, window=features.window)
        qp, kp, vp = layout.queries(q), layout.keys(k), layout.keys(v)
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
            return _compiled_flex()(qp[None], kp[None], vp[None], block_mask=bm, scale=scale, enable_gqa=group > 1,
                                    score_mod=score_mod, return_aux=AuxRequest(lse=True) if lse_needed else None,
                                    kernel_options=options)

        key = (layout.block_m, layout.block_n)
        if key in self._options:
            out = call(self._options[key])
        else:
            error = None
            for options in _kernel_option_candidates(*key):
                try:
                    out = call(options)
                    self._options[key] = options
                    break
                except Exception as exc:  # this torch spells the option differently: try the next
                    error = exc
            else:
                raise error
        if sinks is not None:
            o, aux = out
            return apply_sinks(layout.rows(o[0]), layout.rows(aux.lse[0]), sinks)
        if return_lse:
            o, aux = out
            return layout.rows(o[0]), layout.rows(aux.lse[0].float())
        return layout.rows(out[0])

    def featured(self, block_lists: list[BlockLists]):
        """attend(layer, q, k, v, scale, features) for layers with attention features, each layer's BlockMask
        built at its first call (its window is known then)."""
        masks: dict[int, object] = {}

        def attend(layer, q, k, v, scale, features):
            if layer not in masks:
                masks[layer] = block_mask_on_table(block_lists[layer], window=features.window)
            return self.forward(q, k, v, block_lists[layer], scale, plan=masks[layer], features=features)

        return attend
