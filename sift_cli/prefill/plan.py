"""A SIFT prefill's preparation: the prompt's block table, its bits and table on the device, every layer's block
lists decoded (on a side stream with the CUDA decoder, overlapping the forward's start) and the backend's
per-prompt plan."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..attention.base import BlockLists
from ..attention.cuda import CudaBackend
from ..attention.integration import SparsePlan, prepare_plan
from ..block_lists import decode_layers
from ..block_table import BlockTable
from ..cuda.coalesce import KernelLists
from ..cuda.decode import CudaDecoder, DecodedLayers
from ..device_copy import to_device
from ..errors import SiftError
from ..layout import PromptBits
from ..models import LoadedModel
from .assemble import Prompt
from .options import PrefillOptions


def choose_decoder(device: torch.device) -> str:
    """The CUDA decode kernel wherever it can run (any backend reads its lists), else the PyTorch decoder."""
    if device.type != "cuda":
        return "torch"
    return "cuda" if CudaBackend.available(device)[0] else "torch"


def decode_all_layers(bits: PromptBits, table: BlockTable, n_layers: int, decoder: str = "torch", spec=None
                      ) -> tuple[Sequence[BlockLists], tuple | None]:
    """Every layer's CSR lists over `table` (bits already on the device), and, from the CUDA decoder, the stacked
    (offsets, indices, tiles) of all layers; tiles: the attention kernel's lists and work order
    (`cuda.coalesce.KernelLists`) when `spec` (a cuda.decode.WorkSpec) asks for them, else None. The CUDA decoder
    never waits for the device."""
    if decoder == "cuda":
        dec = CudaDecoder(bits, table, layers=range(n_layers))
        tiles = KernelLists(dec.offsets, dec.indices, dec.table, spec) if spec is not None else None
        return DecodedLayers(dec), (dec.offsets, dec.indices, tiles)
    return decode_layers(bits, table, n_layers), None


_SIDE_STREAMS: dict = {}


def prepare_sparse(lm: LoadedModel, bits: PromptBits, table: BlockTable, backend, decoder: str) -> SparsePlan:
    """Decode every layer and let the backend prepare its per-prompt form, with no device synchronisation. The
    CUDA decoder runs on a side stream: the forward's first sparse layer waits for it, so the decode overlaps
    the embedding and the first layer's projections instead of adding to the time to first token."""
    if decoder != "cuda" or not getattr(backend, "waits_for_ready", False):
        block_lists, stacked = decode_all_layers(bits, table, lm.n_layers, decoder)
        return prepare_plan(backend, table, block_lists, stacked)
    dev = lm.device
    main = torch.cuda.current_stream(dev)
    side = _SIDE_STREAMS.get(dev)
    if side is None:
        side = _SIDE_STREAMS[dev] = torch.cuda.Stream(dev)
    # The side stream first waits for everything queued on the main one, so memory it allocates here and frees
    # later is only reused by side-stream work that starts after the forward that read it.
    side.wait_stream(main)
    ready = torch.cuda.Event()  # recorded after all the side stream's work: the first sparse layer waits for it
    with torch.cuda.stream(side):
        spec = backend.work_spec(table, dev, lm.head_dim)
        block_lists, stacked = decode_all_layers(bits, table, lm.n_layers, decoder, spec)
        plan = prepare_plan(backend, table, block_lists, stacked, ready)
        ready.record(side)
    return plan


def prompt_block_table(prompt: Prompt, opts: PrefillOptions) -> BlockTable:
    """The prompt's block table, built on the host."""
    if opts.block_m is None:
        raise SiftError("internal: the query block size is unset; resolve the options with for_backend first")
    if opts.query_blocks == "auto":
        raise SiftError("internal: the query blocks are unresolved; resolve the options with for_backend first")
    return BlockTable.for_layout(prompt.layout, opts.block_m, opts.block_n, opts.query_blocks)


def prompt_tensors(prompt: Prompt, opts: PrefillOptions, device, bits: PromptBits | None = None
                   ) -> tuple[PromptBits, BlockTable]:
    """The prompt's bits (every layer's; `bits` when given, else `prompt.bits`) and block table on the device, the
    small tensors of both in one copy."""
    bits, table = bits if bits is not None else prompt.bits, prompt_block_table(prompt, opts)
    moved = to_device(bits.tensors() + table.tensors(), device)
    return bits.with_tensors(moved[: len(bits.TENSORS)]), table.with_tensors(moved[len(bits.TENSORS):])


def untimed_plan(lm: LoadedModel, prompt: Prompt, backend, opts: PrefillOptions, decoder: str) -> SparsePlan:
    """The prompt's bits moved and every layer decoded outside any timing: the lists a report describes when the
    forward did not need them (a prompt without bits runs full recompute's kernel)."""
    bits, table = prompt_tensors(prompt, opts, lm.device)
    return prepare_sparse(lm, bits, table, backend, decoder)
