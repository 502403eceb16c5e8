"""CacheBlend's reused KV for `sift bench prefill`, in pinned host memory and streamed to the GPU per layer."""

from __future__ import annotations

import torch

from ..eval.kvreuse import rotate


class HostKV:
    """Reused KV of every layer from `first_layer` on, in pinned host memory, [S, H_kv, D] per tensor (so any
    prefix of positions is a contiguous slice), plus a per-layer loader that streams it to the GPU on a side
    stream one layer ahead and rotates the (pre-RoPE) keys to their positions, as CacheBlend's code does."""

    def __init__(self, n_layers: int, max_tokens: int, kv_heads: int, head_dim: int, dtype, first_layer: int = 1,
                 pin: bool = True, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.first = first_layer
        self.k, self.v = {}, {}
        draw = torch.randn(max_tokens, kv_heads, head_dim, generator=g).to(dtype)  # values do not matter for speed
        for layer in range(first_layer, n_layers):
            for store in (self.k, self.v):
                t = torch.empty(max_tokens, kv_heads, head_dim, dtype=dtype, pin_memory=pin)
                t.copy_(draw)
                store[layer] = t
        del draw

    def bytes_per_layer(self, n: int) -> int:
        t = self.k[self.first]
        return 2 * n * t.shape[1] * t.shape[2] * t.element_size()

    def loader(self, n: int, device, inv_freq, streaming: bool = True):
        pos = torch.arange(n, device=device)
        if not streaming:  # KV resident on the GPU already (compute-only timing)
            dev = {layer: (self.k[layer][:n].to(device), self.v[layer][:n].to(device)) for layer in self.k}
            def resident(layer):
                k, v = dev[layer]
                return rotate(k.transpose(0, 1), pos, inv_freq), v.transpose(0, 1)

            return resident
        stream = torch.cuda.Stream(device)
        pending: dict[int, tuple] = {}

        def issue(layer):
            if layer in pending or layer not in self.k:
                return
            with torch.cuda.stream(stream):
                k = self.k[layer][:n].to(device, non_blocking=True)
                v = self.v[layer][:n].to(device, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(stream)
            pending[layer] = (k, v, ev)

        issue(self.first)

        def load(layer):
            issue(layer)
            k, v, ev = pending.pop(layer)
            cur = torch.cuda.current_stream(device)
            cur.wait_event(ev)
            k.record_stream(cur)
            v.record_stream(cur)
            issue(layer + 1)
            return rotate(k.transpose(0, 1), pos, inv_freq), v.transpose(0, 1)

        return load
