"""The attention backend an evaluation runs SIFT with."""

from __future__ import annotations

import torch

from ...attention.backends import get_backend
from ...attention.reference import BAND_ROWS, ReferenceBackend


def eval_backend(name: str, device: torch.device):
    """The reference in its banded mode on CPU (or when asked for `reference`): the same function in a fraction of
    the memory; otherwise what `attention.get_backend` gives."""
    if name == "reference" or (name == "auto" and device.type != "cuda"):
        return ReferenceBackend(rows=BAND_ROWS)
    return get_backend(name, device)
