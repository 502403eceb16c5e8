"""One kernel case against its reference: the bundled kernels run on fresh random inputs (outputs poisoned with
NaN, so a value the kernel never writes shows up) and are compared with `attention.reference` (fp32) and
`block_lists.decode_layer`. The GPU tests assert these cases; the device check
(`python -m sift_cli.lab.bench.kernel_check`) sweeps them and reports every error.

Layouts come from block tables (SPEC §6 v2): plain causal (one segment), or prompts whose prefix and documents
have awkward lengths, with bits drawn at random or decoded from real profiles.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..attention.base import BlockLists
from ..attention.reference import block_sparse_attention
from ..block_lists import block_lists_from_mask, decode_layer, dense_block_lists
from ..block_table import BlockTable
from ..layout import PromptBits, PromptLayout, random_prompt_bits
from .plan import sparse_attention_forward
from .work_order import SPLIT_MAX, SPLIT_MIN_BLOCKS, work_order
from .coalesce import KernelLists, coalesce_reference
from .decode import CudaDecoder, WorkSpec, decode_layer_cuda

ROW_BOUND = 2e-2  # worst row's ‖out − ref‖ / ‖ref‖ (bf16 inputs and output, bf16 P)
LSE_BOUND = 1e-3


def random_block_lists(table: BlockTable, H: int, density: float, seed: int = 0) -> BlockLists:
    """Random block-sparse causal lists over `table`: every block that needs a mask (the diagonal ones, partial
    ones) kept, each other causal block kept with probability `density` (1.0: all causal blocks)."""
    if density >= 1.0:
        return dense_block_lists(table, H)
    dev = table.device
    g = torch.Generator(device=dev).manual_seed(seed)
    M, N = table.n_query_blocks, table.n_kv_blocks
    causal = torch.arange(N, device=dev)[None, :] <= table.last_causal_kv_block()[:, None]
    keep = torch.rand(H, M, N, generator=g, device=dev) < density
    mask = (keep | table.needs_mask()[None]) & causal[None]
    return block_lists_from_mask(mask.contiguous(), table)


def document_layout(rng, total: int, lo: int, hi: int, prefix_len: int = 16, suffix_len: int = 32
                    ) -> PromptLayout:
    """prefix ‖ documents of random lengths in [lo, hi] (the last one cut to fit) ‖ suffix, exactly `total` tokens."""
    lengths, used = [], prefix_len + suffix_len
    while used < total:
        n = min(int(rng.integers(lo, hi + 1)), total - used)
        lengths.append(n)
        used += n
    return PromptLayout.build(prefix_len, [f"d{i}" for i in range(len(lengths))], lengths, suffix_len)


def random_case(rng, tile: int, n_layers: int = 2, n_heads: int = 3, doc_lengths=None, prefix_len=None,
                suffix_len=None, la_p=0.3, ca_p=0.3, dense_p=0.2, max_docs: int = 5, max_doc_tiles: int = 6,
                max_prefix: int = 139, max_suffix: int = 199) -> tuple[PromptBits, list]:
    """Random bits on a prompt of random segments (those not given): 1 to max_docs documents of fewer than
    max_doc_tiles tiles, a prefix of up to max_prefix tokens and a suffix of up to max_suffix; each document is
    dense (no bits) with probability dense_p. Returns the bits and the drawn arrays (`random_prompt_bits`).
    rng: a numpy Generator."""
    if doc_lengths is None:
        doc_lengths = [int(x) for x in rng.integers(1, max_doc_tiles * tile, size=int(rng.integers(1, max_docs + 1)))]
    prefix_len = int(rng.integers(0, max_prefix + 1)) if prefix_len is None else prefix_len
    suffix_len = int(rng.integers(0, max_suffix + 1)) if suffix_len is None else suffix_len
    layout = PromptLayout.build(prefix_len, [f"d{i}" for i in range(len(doc_lengths))], doc_lengths, suffix_len)
    dense = {d for d in range(len(doc_lengths)) if rng.random() < dense_p}
    return random_prompt_bits(layout, tile, n_layers, n_heads, la_p, ca_p, rng, dense)


def random_case_bits(rng, tile: int, **kw) -> PromptBits:
    """`random_case`'s bits alone."""
    return random_case(rng, tile, **kw)[0]


def attention_case(H: int, H_kv: int, D: int, blocks: BlockLists, seed: int = 0, std: float = 1.0,
                   out_layout: str = "LHD", **variant) -> dict:
    """Run the kernel on fresh random inputs (q/k/v as the model lays them out, [L, heads, D] memory) with
    poisoned outputs; compare every row with the fp32 reference."""
    L = blocks.seq_len
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(L, H, D, generator=g, device="cuda") * std).to(torch.bfloat16).transpose(0, 1)
    k = (torch.randn(L, H_kv, D, generator=g, device="cuda") * std).to(torch.bfloat16).transpose(0, 1)
    v = torch.randn(L, H_kv, D, generator=g, device="cuda").to(torch.bfloat16).transpose(0, 1)
    scale = 1.0 / math.sqrt(D)
    if out_layout == "LHD":
        out = torch.full((L, H, D), float("nan"), dtype=torch.bfloat16, device="cuda").transpose(0, 1)
    elif out_layout == "unaligned":  # rows of D + 1 columns, one column in: written through a fresh buffer
        out = torch.full((L, H, D + 1), float("nan"), dtype=torch.bfloat16, device="cuda")[..., 1:].transpose(0, 1)
    else:
        out = torch.full((H, L, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((H, L), float("nan"), dtype=torch.float32, device="cuda")
    blocks = blocks.to("cuda")
    sparse_attention_forward(q, k, v, blocks, scale, return_lse=True, out=out, lse=lse, **variant)
    again = sparse_attention_forward(q, k, v, blocks, scale, **variant)
    torch.cuda.synchronize()
    ref, ref_lse = block_sparse_attention(q.float(), k.float(), v.float(), blocks, scale, return_lse=True)
    o = out.float()
    res = dict(H=H, H_kv=H_kv, L=L, D=D, block_m=blocks.block_m, block_n=blocks.block_n,
               query_blocks=blocks.table.query_blocks,
               density=round(blocks.density(), 4), nan_out=int(torch.isnan(o).sum()),
               nan_lse=int(torch.isnan(lse).sum()), variant={k: v for k, v in variant.items()})
    row_err = ((o - ref).nan_to_num(nan=1e30).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30))  # [H, L]
    res["worst_row_rel_err"] = float(row_err.max()) if L else 0.0
    res["rel_err"] = float((o - ref).nan_to_num(nan=1e30).norm() / ref.norm().clamp_min(1e-30))
    res["lse_max_abs_err"] = float((lse - ref_lse).nan_to_num(nan=1e30).abs().max()) if L else 0.0
    res["deterministic"] = bool(torch.equal(again.float(), o)) if not res["nan_out"] else False
    res["ok"] = (res["nan_out"] == 0 and res["nan_lse"] == 0 and res["worst_row_rel_err"] < ROW_BOUND
                 and res["lse_max_abs_err"] < LSE_BOUND and res["deterministic"])
    if not res["ok"] and L:  # where is it wrong?
        bad = torch.nonzero(row_err.amax(0) > ROW_BOUND).flatten()
        res["bad_rows_first"] = bad[:8].tolist()
        res["bad_rows_count"] = int(bad.numel())
        res["bad_heads"] = torch.nonzero(row_err.amax(1) > ROW_BOUND).flatten().tolist()[:8]
    return res


def decode_case(bits: PromptBits, block_n: int, query_blocks: str = "segment", block_m: int = 128) -> dict:
    """The CUDA decoder on every layer of `bits` against `decode_layer` (order included), and its one-layer
    entry point; then the kernel's tiles of those lists (`KernelLists`, merged and not) against
    `coalesce_reference`, and their work order against `work_order`, with splits (4 SMs) and without."""
    table = BlockTable.for_layout(bits.layout, block_m, block_n, query_blocks)
    gpu = bits.to("cuda")
    dec = CudaDecoder(gpu, table)
    res = dict(tile=bits.tile, block_m=block_m, block_n=block_n, query_blocks=query_blocks, L=bits.layout.seq_len,
               docs=len(bits.layout.docs), ok=True, layers=bits.n_layers)
    for layer in range(bits.n_layers):
        want = decode_layer(bits, layer, table)
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
    single = _same_lists(decode_layer_cuda(gpu, table, last), decode_layer(bits, last, table))
    res["single_layer_entry_ok"] = single
    res["tiles_ok"] = tiles_match(dec.offsets, dec.indices, dec.table, per_step=2 if block_n == 64 else 1)
    res["ok"] = res["ok"] and single and all(res["tiles_ok"])
    return res


def tiles_match(offsets: torch.Tensor, indices: torch.Tensor, table: BlockTable, per_step: int) -> list[bool]:
    """`KernelLists` of every layer's lists (merged with splits on 4 SMs, merged unsplit on 132, unmerged): the
    offsets and entries equal `coalesce_reference`'s, the work order `work_order`'s."""
    ok = []
    ref_off = {m: coalesce_reference(offsets.cpu(), indices.cpu(), table.to("cpu"), m) for m in (True, False)}
    for spec in (WorkSpec(per_step, 4, SPLIT_MAX, SPLIT_MIN_BLOCKS), WorkSpec(per_step, 132, 1, SPLIT_MIN_BLOCKS),
                 WorkSpec(per_step, 4, SPLIT_MAX, SPLIT_MIN_BLOCKS, merge=False)):
        tiles = KernelLists(offsets, indices, table, spec)
        want_off, want_entries = ref_off[spec.merge]
        same = torch.equal(tiles.offsets.cpu(), want_off)
        for z, flat in enumerate(want_entries):
            same = same and tiles.entries[z, : len(flat)].cpu().tolist() == flat
        want_work = work_order(tiles.offsets, spec.per_step, spec.ctas, spec.split_max, spec.min_blocks)
        ok.append(same and _same_work(tiles.work, want_work))
    return ok


def _same_work(got: dict, want: dict) -> bool:
    """Equal work orders: cap, n_active and slot_base, and the first n_active entries of tile_order."""
    same = all(torch.equal(got[k].cpu(), want[k].cpu()) for k in ("cap", "n_active", "slot_base"))
    for layer, n in enumerate(want["n_active"][:, 0].tolist()):
        same = same and torch.equal(got["tile_order"][layer, :n].cpu(), want["tile_order"][layer, :n].cpu())
    return same


def _same_lists(got: BlockLists, want: BlockLists) -> bool:
    n = want.computed_blocks()
    return (torch.equal(got.offsets.cpu(), want.offsets)
            and torch.equal(got.indices[:n].cpu(), want.indices[:n]))


def awkward_layouts() -> list[tuple[int, list[int], int]]:
    """(prefix, document lengths, suffix) with lengths at and around block boundaries, empty prefix/suffix,
    one-token documents and a suffix shorter than a block."""
    return [(16, [300, 65, 1, 127, 900], 20), (0, [64, 63, 129], 0), (1, [1], 1), (63, [1000, 129, 64, 65], 127),
            (0, [2048], 3), (48, [511, 513, 7, 700], 96), (5, [], 7)]


def np_rng(seed: int):
    return np.random.default_rng(seed)
