"""One profiling worker in this process: its rank (flags, torchrun or Slurm), the buckets it owns, its model on
its GPU and its configuration, then `profile_corpus` over its buckets. `sift profile` runs one (also as each
child of `--gpus N`, and under torchrun or Slurm); every Ray task runs one.

A worker times its start-up by phase (`startup.py`: imports, model load, CUDA context, warm-up), reports it with
its job report (`ProfileReport.startup`) and leaves a record of it in the output directory (`records.py`), which
`sift status` shows. It points Triton's and CuPy's compile caches under the sift cache unless they are set
(`cache.use_shared_compile_caches`), so workers of a run, and later runs, compile each kernel once.
"""

from __future__ import annotations

from . import startup  # first: the import phases below are timed from here

import torch  # noqa: E402,F401  (the largest import of a worker, timed on its own)

startup.mark_imported("import_torch")

from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

from ..cache import use_shared_compile_caches  # noqa: E402
from ..config import ProfileConfig, ResolvedConfig, resolve_profile_config  # noqa: E402
from ..corpus import Corpus, CorpusFormat, load_corpus  # noqa: E402
from ..errors import SiftError  # noqa: E402
from ..models import LoadedModel, load_model  # noqa: E402
from ..profile.checks import check_out_before_model  # noqa: E402
from ..profile.forward import launch_profile_batch  # noqa: E402
from ..profile.job import STRICT_REMEDY, ProfileReport, profile_corpus  # noqa: E402
from ..sample import resolve_corpus  # noqa: E402
from ..tokens import encode, prefix_token_ids  # noqa: E402
from .ranks import WorkerRank, check_num_shards, detect_rank, owned_shards, worker_device  # noqa: E402
from .records import WorkerRecord  # noqa: E402

startup.mark_imported("import_sift")


def warm_up(lm: LoadedModel, cfg: ProfileConfig, prefix_text: str | None = None) -> None:
    """Run one tiny batch (two short documents, one with a partial tile) through the profiling forward and drop
    its bits, so that the first CUDA kernels, Triton's compilation or disk-cache load, and cuBLAS/cuDNN set-up
    count as start-up rather than as the first batch's profiling. Changes nothing the run computes."""
    try:
        prefix = prefix_token_ids(lm.tokenizer, prefix_text)
    except SiftError:
        return  # the job reports it
    filler = encode(lm.tokenizer, "A short warm-up document about nothing in particular. ") or prefix[-1:]
    room = max(1, lm.max_context - len(prefix))
    docs = [(filler * (2 * cfg.tile + 3))[:min(room, 2 * cfg.tile + 3)], (filler * cfg.tile)[:min(room, cfg.tile)]]
    launch_profile_batch(lm.model, prefix, docs, cfg)()


@dataclass
class ProfileWorker:
    corpus: Corpus  # read and checked before the model loaded
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
    startup: dict | None = None  # {seconds, since, phases}: see startup.py

    @staticmethod
    def start(corpus: str, out: str | Path, *, model: str | None = None, device: str | None = "auto",
              dtype: str | None = "auto", trust_remote_code: bool = False, online: bool = False,
              flags: dict | None = None, read_config_file: bool = False, config_file: str | Path | None = None,
              fmt: CorpusFormat = CorpusFormat(), num_shards: int | None = None, docs_per_shard: int = 1000,
              strict: bool = False, prefix_text: str | None = None, rank: int | None = None,
              world_size: int | None = None, warmup: bool | None = None,
              from_process_start: bool = False) -> "ProfileWorker":
        """Find this worker's rank and buckets, load the model on its device, resolve the configuration, and time
        it all (`startup`).

        flags: ProfileConfig fields given explicitly (None: unset); read_config_file: unset thresholds from
        sift.toml (`config_file`, $SIFT_CONFIG or ./sift.toml), as `sift profile` does. warmup: run one tiny batch
        first (None: on a GPU). from_process_start: start-up counts from the process's start, imports included
        (the worker is what this process is for, as in `sift profile`); otherwise from this call."""
        clock = startup.StartupClock(from_process_start)
        use_shared_compile_caches()
        corpus = resolve_corpus(corpus)
        check_num_shards(num_shards)
        worker = detect_rank(rank, world_size)
        only = None
        if worker.world_size > 1:
            if num_shards is None:
                raise SiftError(f"worker {worker.rank} of {worker.world_size} (from {worker.source}): pass "
                                f"--num-shards (the same number to every worker)")
            only = owned_shards(num_shards, worker.rank, worker.world_size)
        # the flags, sift.toml and the corpus are checked before the model loads (seconds); every bad document is
        # listed at once (with strict they stop the run, else they are skipped and reported)
        asked = resolve_profile_config("cpu", flags, read_file=read_config_file, config_file=config_file)
        check_out_before_model(out, asked.profile)
        with clock.phase("read_corpus"):
            corpus = load_corpus(corpus, fmt).check(STRICT_REMEDY) if strict else load_corpus(corpus, fmt)
        lm = load_model(model, device=worker_device(device, worker.local_rank), dtype=dtype,
                        trust_remote_code=trust_remote_code, online=online, phases=clock.phases)
        with clock.phase("config"):
            config = resolve_profile_config(lm.device, flags, read_file=read_config_file, config_file=config_file,
                                            lm=lm)
        if warmup if warmup is not None else lm.device.type == "cuda":
            with clock.phase("warmup"):
                warm_up(lm, config.profile, prefix_text)
        return ProfileWorker(corpus, Path(out), worker, lm, config, fmt, num_shards, docs_per_shard, strict,
                             prefix_text, only, clock.finish())

    def run(self, progress: Callable[[int, int], None] | None = None) -> ProfileReport:
        """Profile this worker's buckets; progress(done_tokens, total_tokens) as batches finish. The report carries
        the start-up; a record of this worker (`records.py`) is left in the output directory once it has profiled
        a batch, and updated when it ends."""
        record = WorkerRecord(self.out, self.rank.to_json(), str(self.lm.device), self.startup)

        def tick(done: int, total: int) -> None:
            if done and not record.written:  # once a batch (or a layer of one) is done, not at the first 0
                record.write(state="profiling")
            if progress:
                progress(done, total)

        try:
            report = profile_corpus(self.corpus, self.out, self.lm, self.config.profile, self.fmt,
                                    num_shards=self.num_shards, docs_per_shard=self.docs_per_shard,
                                    strict=self.strict, prefix_text=self.prefix_text, progress=tick,
                                    only_shards=self.only_shards)
        except BaseException as exc:
            if record.written:
                record.write(state="failed", error=f"{type(exc).__name__}: {str(exc)[:300]}")
            raise
        report.startup = self.startup
        record.write(state="finished", shards_written=report.written, shards_reused=report.shards_reused,
                     profiled=report.profiled, tokens=report.tokens, seconds=round(report.seconds, 3),
                     prepare=report.to_json()["prepare"])
        return report
