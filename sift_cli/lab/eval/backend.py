"""The attention backend an evaluation runs SIFT with."""

from __future__ import annotations

import torch

from ...attention.backends import get_backend
from ...attention.reference import BAND_ROWS, ReferenceBackend
from ...model_features import features_of


def eval_backend(name: str, device: torch.device, features=None):
    """`reference`: the reference in its banded mode (the same function in a fraction of the memory); otherwise
    what `attention.get_backend` gives (`auto`: cuda / flex on a GPU, gather on a CPU). features: the model's
    (`model_features.features_of`), so `auto` never picks a kernel that cannot compute it and `cuda` is refused
    for one."""
    if name == "reference":
        return ReferenceBackend(rows=BAND_ROWS)
    return get_backend(name, device, features)


def model_backend(name: str, lm):
    """`eval_backend` for a loaded model: on its device, for its attention features."""
    return eval_backend(name, lm.device, features_of(lm.model))
