"""Documents a prompt names that the shard sets lack: where a prompt's bits are read from, and the on-the-fly
profiling of its dense documents into a shard set for the next prompt (`--profile-missing`), with the
thresholds, tile and prefix of the set the prompt was assembled from. (`shards.ids` says which ids a set lacks.)
"""

from __future__ import annotations

from pathlib import Path

from ..config import ProfileConfig, resolve_profile_config, rule_of
from ..models import LoadedModel
from ..profile.additions import AddReport, add_documents
from ..profile.job import check_compatible, shard_metadata
from ..shards.reader import ShardSet
from .assemble import NOT_PROFILED, Prompt


def profile_config_of(shards: ShardSet, lm: LoadedModel) -> ProfileConfig:
    """The rule, its parameters and the tile `shards` was made with, with the device defaults of `lm`'s
    device."""
    return resolve_profile_config(lm.device, rule_of(shards.meta)).profile


def check_destination(out: str | Path, shards: ShardSet, lm: LoadedModel) -> None:
    """Refuse, before any model work, a destination set made with another model, thresholds or prefix."""
    check_compatible(Path(out), shard_metadata(lm, profile_config_of(shards, lm), shards.prefix_token_ids, 0))


def profile_dense_documents(prompt: Prompt, lm: LoadedModel, out: str | Path, shards: ShardSet) -> AddReport:
    """Profile the prompt's documents that have no bits because no set holds them (given as text) into `out`."""
    docs = [d.document for d in prompt.dense if d.reason == NOT_PROFILED and d.document is not None]
    return add_documents(out, docs, lm, profile_config_of(shards, lm), shards.prefix_token_ids)
