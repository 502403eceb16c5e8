"""One profiling worker in this process: its rank (flags, torchrun or Slurm), the buckets it owns, its model on
its GPU and its configuration, then `profile_corpus` over its buckets. `sift profile` runs one (also as each
child of `--gpus N`, and under torchrun or Slurm); every Ray task runs one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..config import ResolvedConfig, resolve_profile_config
from ..corpus import CorpusFormat
from ..errors import SiftError
from ..models import LoadedModel, load_model
from ..profile.job import ProfileReport, profile_corpus
from ..sample import resolve_corpus
from .ranks import WorkerRank, detect_rank, owned_shards, worker_device


def check_num_shards(num_shards: int | None) -> None:
    if num_shards is not None and num_shards < 1:
        raise SiftError("--num-shards must be at least 1")


@dataclass
class ProfileWorker:
    corpus: str
    out: Path
    rank: WorkerRank
    lm: LoadedModel
    config: ResolvedConfig  # config.warning: say it before profiling
    fmt: CorpusFormat
    num_shards: int | None
    docs_per_shard: int
    strict: bool
    prefix_text: str | None
    only_shards: set[int] | None  # this worker's buckets (None: all)

    @staticmethod
    def start(corpus: str, out: str | Path, *, model: str | None = None, device: str | None = "auto",
              dtype: str | None = "auto", trust_remote_code: bool = False, online: bool = False,
              flags: dict | None = None, read_config_file: bool = False, config_file: str | Path | None = None,
              fmt: CorpusFormat = CorpusFormat(), num_shards: int | None = None, docs_per_shard: int = 1000,
              strict: bool = False, prefix_text: str | None = None, rank: int | None = None,
              world_size: int | None = None) -> "ProfileWorker":
        """Find this worker's rank and buckets, load the model on its device, resolve the configuration.

        flags: ProfileConfig fields given explicitly (None: unset); read_config_file: unset thresholds from
        sift.toml (`config_file`, $SIFT_CONFIG or ./sift.toml), as `sift profile` does."""
        corpus = resolve_corpus(corpus)
        check_num_shards(num_shards)
        worker = detect_rank(rank, world_size)
        only = None
        if worker.world_size > 1:
            if num_shards is None:
                raise SiftError(f"worker {worker.rank} of {worker.world_size} (from {worker.source}): pass "
                                f"--num-shards (the same number to every worker)")
            only = owned_shards(num_shards, worker.rank, worker.world_size)
        lm = load_model(model, device=worker_device(device, worker.local_rank), dtype=dtype,
                        trust_remote_code=trust_remote_code, online=online)
        config = resolve_profile_config(lm.device, flags, read_file=read_config_file, config_file=config_file, lm=lm)
        return ProfileWorker(corpus, Path(out), worker, lm, config, fmt, num_shards, docs_per_shard, strict,
                             prefix_text, only)

    def run(self, progress: Callable[[int, int], None] | None = None) -> ProfileReport:
        """Profile this worker's buckets; progress(done_tokens, total_tokens) as batches finish."""
        return profile_corpus(self.corpus, self.out, self.lm, self.config.profile, self.fmt,
                              num_shards=self.num_shards, docs_per_shard=self.docs_per_shard, strict=self.strict,
                              prefix_text=self.prefix_text, progress=progress, only_shards=self.only_shards)
