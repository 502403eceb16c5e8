"""One kernel case against its reference: the bundled kernels run on random inputs (outputs poisoned with NaN, so
a value the kernel never writes shows up) and are compared with `attention.reference` and
`block_lists.decode_layer`. The GPU tests assert these cases; the device check
(`python -m sift_cli.lab.bench.kernel_check`) sweeps them and reports every error.
"""

from __future__ import annotations

import math

import torch

from ..attention.base import BlockLists
from ..attention.reference import block_sparse_attention
from ..block_lists import block_lists_from_mask, decode_layer, dense_block_lists
from ..layout import PromptBits, PromptLayout, random_prompt_bits
from .attention import BLOCK_M, sparse_attention_forward
from .decode import CudaDecoder, decode_layer_cuda


def random_block_lists(H: int, L: int, block_n: int, density: float, seed: int = 0, device="cuda",
                       block_m: int = BLOCK_M) -> BlockLists:
    """Random block-sparse causal block lists: every block touching the diagonal kept, each other causal block kept
    with probability `density` (density 1.0: all causal blocks)."""
    if density >= 1.0:
        return dense_block_lists(L, H, block_m, block_n, device=device)
    g = torch.Generator(device=device).manual_seed(seed)
    M, N = -(-L // block_m), -(-L // block_n)
    q_first = torch.arange(M, device=device) * block_m
    q_last = torch.clamp(q_first + block_m, max=L) - 1
    k_first = torch.arange(N, device=device) * block_n
    k_last = k_first + block_n - 1
    causal = k_first[None, :] <= q_last[:, None]
    diag = causal & (k_last[None, :] >= q_first[:, None])
    keep = torch.rand(H, M, N, generator=g, device=device) < density
    mask = (keep & causal[None]) | diag[None]
    return block_lists_from_mask(mask.contiguous(), block_m, block_n, L)


def make_block_lists(kind: str, H: int, L: int, block_n: int, seed: int, device="cuda") -> BlockLists:
    """kind: dense (every causal block), sparse (30% of the off-diagonal blocks) or sparse10 (10%)."""
    if kind == "dense":
        return dense_block_lists(L, H, BLOCK_M, block_n, device=device)
    if kind == "sparse":
        return random_block_lists(H, L, block_n, 0.3, seed=seed, device=device)
    if kind == "sparse10":
        return random_block_lists(H, L, block_n, 0.1, seed=seed, device=device)
    raise ValueError(kind)


def attention_case(H: int, H_kv: int, L: int, D: int, blocks: BlockLists, seed: int = 0, std: float = 1.0,
                   **variant) -> dict:
    """Run the kernel on fresh random inputs with poisoned outputs; compare with the fp32 reference."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(H, L, D, generator=g, device="cuda") * std).to(torch.bfloat16)
    k = (torch.randn(H_kv, L, D, generator=g, device="cuda") * std).to(torch.bfloat16)
    v = torch.randn(H_kv, L, D, generator=g, device="cuda").to(torch.bfloat16)
    scale = 1.0 / math.sqrt(D)
    out = torch.full((H, L, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((H, L), float("nan"), dtype=torch.float32, device="cuda")
    sparse_attention_forward(q, k, v, blocks, scale, return_lse=True, out=out, lse=lse, **variant)
    torch.cuda.synchronize()
    ref, ref_lse = block_sparse_attention(q.float(), k.float(), v.float(), blocks, scale, return_lse=True)
    o = out.float()
    res = dict(H=H, H_kv=H_kv, L=L, D=D, block_n=blocks.block_n, density=round(blocks.density(), 4),
               nan_out=int(torch.isnan(o).sum()), nan_lse=int(torch.isnan(lse).sum()))
    diff = (o - ref).nan_to_num(nan=1e30)
    res["rel_err"] = float(diff.norm() / ref.norm().clamp_min(1e-30))
    res["max_abs_err"] = float(diff.abs().max())
    res["lse_max_abs_err"] = float((lse - ref_lse).nan_to_num(nan=1e30).abs().max())
    res["ok"] = res["nan_out"] == 0 and res["nan_lse"] == 0 and res["rel_err"] < 1e-2 and res["lse_max_abs_err"] < 1e-2
    if not res["ok"]:  # where is it wrong? per 64-row slab and per head
        err = (o - ref).abs().nan_to_num(nan=1e30)
        bad = torch.nonzero(err.amax(dim=(0, 2)) > 0.05).flatten()
        res["bad_rows_first"] = bad[:8].tolist()
        res["bad_rows_count"] = int(bad.numel())
        res["bad_heads"] = torch.nonzero(err.amax(dim=(1, 2)) > 0.05).flatten().tolist()[:8]
    return res


def random_case_bits(rng, tile: int, n_layers: int = 2, n_heads: int = 3, doc_lengths=None, prefix_len=None,
                     suffix_len=None, la_p=0.3, ca_p=0.3) -> PromptBits:
    """Random bits on a prompt of random segments (those not given): up to 5 documents of up to 6 tiles, a prefix
    of up to 139 tokens and a suffix of up to 199. rng: a numpy Generator."""
    if doc_lengths is None:
        doc_lengths = [int(x) for x in rng.integers(1, 6 * tile, size=int(rng.integers(1, 6)))]
    prefix_len = int(rng.integers(0, 140)) if prefix_len is None else prefix_len
    suffix_len = int(rng.integers(0, 200)) if suffix_len is None else suffix_len
    layout = PromptLayout.build(prefix_len, [f"d{i}" for i in range(len(doc_lengths))], doc_lengths, suffix_len)
    return random_prompt_bits(layout, tile, n_layers, n_heads, la_p, ca_p, rng)[0]


def decode_case(bits: PromptBits, block_n: int, block_m: int = 128) -> dict:
    """The CUDA decoder on every layer of `bits` against `decode_layer`, and its one-layer entry point."""
    gpu = bits.to("cuda")
    dec = CudaDecoder(gpu, block_m, block_n)
    res = dict(tile=bits.tile, block_n=block_n, L=bits.layout.seq_len, docs=len(bits.layout.docs), ok=True,
               layers=bits.n_layers)
    for layer in range(bits.n_layers):
        want = decode_layer(bits, layer, block_m, block_n)
        got = dec.layer(layer)
        torch.cuda.synchronize()
        if not _same_lists(got, want):
            res["ok"] = False
            res["first_bad_layer"] = layer
            go, wo = got.offsets.cpu(), want.offsets
            res["offsets_equal"] = bool(torch.equal(go, wo))
            if not res["offsets_equal"]:
                res["first_bad_offset"] = torch.nonzero(go != wo)[0].tolist()
            break
    last = bits.n_layers - 1
    single = _same_lists(decode_layer_cuda(gpu, last, block_m, block_n), decode_layer(bits, last, block_m, block_n))
    res["single_layer_entry_ok"] = single
    res["ok"] = res["ok"] and single
    return res


def _same_lists(got: BlockLists, want: BlockLists) -> bool:
    return torch.equal(got.offsets.cpu(), want.offsets) and torch.equal(got.indices.cpu(), want.indices)
