"""Block lists → the attention kernel's key tiles (kernels/coalesce.cu): each row's runs of consecutive KV blocks
re-cut from their ends into tiles of `key_block` keys, the same keys in fewer tiles.

KV blocks are cut per segment (block_table.py), so a 140-key document is blocks of 64, 64 and 12 keys and a row of
twenty such documents lists sixty blocks where a grid would have 44: at the kernel, each block is a whole tile. The
keys a row selects are runs of consecutive blocks (blocks tile the prompt), and a run of e - a keys needs only
ceil((e - a) / key_block) tiles. The mask is unchanged: a tile holds only keys of listed blocks, and the kernel
masks keys past a tile's end as it did past a block's. `KernelLists` runs the CUDA passes for every layer of a
prompt (count, the decoder's prefix sum with the work order, write; no host synchronisation, capturable);
`coalesce_reference` is the plain PyTorch statement of the same entries, for tests.
"""

from __future__ import annotations

import torch

from ..block_table import BlockTable
from ..errors import SiftError
from .decode import WorkSpec, check_work_blocks, scan_counts, work_buffers
from .runtime import check_device, compiled_module, function_ptr, launch

CO_WARPS = 4  # rows (one warp each) per CTA, coalesce.cu
CO_LIST = 1024  # listed blocks staged per warp, coalesce.cu
MAX_START = 1 << 23  # an entry packs (first key << 8) | key count into an int32


def entry(start: int, length: int) -> int:
    return (start << 8) | length


def _row_tiles(blocks: list[int], starts: list[int], lens: list[int], q0: int, key_block: int) -> list[int]:
    runs: list[list[int]] = []
    for kb in sorted(blocks):
        if runs and runs[-1][-1] == kb - 1:
            runs[-1].append(kb)
        else:
            runs.append([kb])
    tiles = []
    for run in runs:
        a, e = starts[run[0]], starts[run[-1]] + lens[run[-1]]
        j = 1
        while e - (j - 1) * key_block > a:
            lo = max(a, e - j * key_block)
            tiles.append((lo, e - (j - 1) * key_block - lo))
            j += 1
    needs_mask = [n < key_block or s + key_block - 1 > q0 for s, n in tiles]
    first = sorted((t for t, m in zip(tiles, needs_mask) if m), reverse=True)
    rest = sorted((t for t, m in zip(tiles, needs_mask) if not m), reverse=True)
    return [entry(s, n) for s, n in first + rest]


def coalesce_reference(offsets: torch.Tensor, indices: torch.Tensor, table: BlockTable, merge: bool = True
                       ) -> tuple[torch.Tensor, list[list[int]]]:
    """Per layer (leading dim of offsets [n, H, M + 1] / indices [n, capacity]): the kernel's entries, as
    (offsets int32 [n, H, M + 1], each layer's flat entry list). Without `merge`, one entry per block, in the
    lists' canonical order (what the kernel read before merging)."""
    n, H, M1 = offsets.shape
    q_start, starts, lens = table.q_start.tolist(), table.kv_start.tolist(), table.kv_len.tolist()
    out_offsets = torch.zeros(n, H, M1, dtype=torch.int32)
    out_entries = []
    for z in range(n):
        flat: list[int] = []
        for h in range(H):
            for m in range(M1 - 1):
                o0, o1 = int(offsets[z, h, m]), int(offsets[z, h, m + 1])
                blocks = indices[z, o0:o1].tolist()
                out_offsets[z, h, m] = len(flat)
                if merge:
                    flat += _row_tiles(blocks, starts, lens, q_start[m], table.block_n)
                else:
                    flat += [entry(starts[kb], lens[kb]) for kb in blocks]
            out_offsets[z, h, M1 - 1] = len(flat)
        out_entries.append(flat)
    return out_offsets, out_entries


_FUNCTIONS: dict[int, dict[str, int]] = {}


def _functions(device_index: int) -> dict[str, int]:
    fns = _FUNCTIONS.get(device_index)
    if fns is None:
        mod = compiled_module("coalesce.cu", (), device_index)
        fns = _FUNCTIONS[device_index] = {n: function_ptr(mod, f"sift_coalesce_{n}") for n in ("count", "write")}
    return fns


class KernelLists:
    """Every layer's lists (offsets [n, H, M + 1], indices [n, capacity], canonical, over `table`) as the attention
    kernel reads them: `offsets` [n, H, M + 1] and `entries` [n, capacity] of packed tiles of up to
    `table.block_n` keys (the kernel's KEY_BLOCK), and `work`, the
    kernel's work order of those tiles (`cuda.work_order.work_order`'s dict, leading dim n). A spec with
    merge=False keeps one entry per block (for comparisons)."""

    def __init__(self, offsets: torch.Tensor, indices: torch.Tensor, table: BlockTable, spec: WorkSpec):
        check_device(offsets, "the block lists")
        device = offsets.device
        if table.seq_len >= MAX_START:
            raise SiftError(f"the cuda backend takes prompts of up to {MAX_START - 1} tokens, not {table.seq_len}")
        n, H, M1 = offsets.shape
        M, N = M1 - 1, table.n_kv_blocks
        check_work_blocks(N)  # before any launch; it also bounds the shared memory below (42 KB at the cap)
        self.offsets = torch.empty_like(offsets)
        self.entries = torch.empty_like(indices)  # a row never has more tiles than blocks
        self.work = work_buffers(n, H * M, spec.split_max, device)
        counts = torch.empty(n, H, M, dtype=torch.int32, device=device)
        masked = torch.empty_like(counts)
        if not (n and H and M):
            for t in (self.offsets, *self.work.values()):
                t.zero_()
            return
        words = N // 32 + 1
        args = [("offsets", "p", offsets.data_ptr()), ("indices", "p", indices.data_ptr()),
                ("capacity", "l", indices.shape[1]), ("q_start", "p", table.q_start.data_ptr()),
                ("kv_start", "p", table.kv_start.data_ptr()), ("kv_len", "p", table.kv_len.data_ptr()),
                ("n_heads", "i", H), ("n_qblocks", "i", M), ("key_shift", "i", table.block_n.bit_length() - 1),
                ("merge", "i", int(spec.merge)), ("words", "i", words)]
        fn = _functions(device.index)
        grid, block = (-(-H * M // CO_WARPS), n, 1), (32 * CO_WARPS, 1, 1)
        smem = 4 * (words + CO_LIST) * CO_WARPS
        launch(fn["count"], grid, block, smem,
               args + [("counts", "p", counts.data_ptr()), ("masked", "p", masked.data_ptr())], device)
        scan_counts(counts, self.offsets, self.work, spec, N)
        launch(fn["write"], grid, block, smem,
               args + [("masked", "p", masked.data_ptr()), ("tile_offsets", "p", self.offsets.data_ptr()),
                       ("entries", "p", self.entries.data_ptr()),
                       ("entry_capacity", "l", self.entries.shape[1])], device)
        self._keep = (offsets, indices, table, counts, masked)  # alive until the launches run
