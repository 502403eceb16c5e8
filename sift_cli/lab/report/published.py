"""Which table of the docs comes from which committed result, and the command that produces that result.

A table is named in a page by its markers (`<!-- table:NAME -->` … `<!-- /table:NAME -->`); its results are
`docs/results/<file>` for each of its files that is committed (rows of several runs in one table, each run's
provenance named: e.g. the longest prompts measured in a call of their own). With none committed it renders as "not
yet re-measured" with its command.
`experiments/remeasure.py` runs these commands on a GPU and writes the files under these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import tables


@dataclass(frozen=True)
class Published:
    name: str
    results: tuple[str, ...]  # file names under docs/results, in the order their rows are shown
    render: Callable[[dict], str]
    command: str  # what produces the (first) result (run from the repository root)


PREFILL_8B = "sift bench prefill --models llama3-8b --lengths 8k,16k,32k,64k --repeat 3"
KERNELS = "sift bench kernels --lengths 16k,32k,64k --timing graph"

TABLES = {t.name: t for t in (
    Published("prefill-8b-eager", ("prefill-8b-eager.json", "prefill-8b-eager-128k.json"), tables.prefill,
              f"{PREFILL_8B} --modes full,sift,cacheblend --save docs/results/prefill-8b-eager.json"),
    Published("prefill-8b-graphed", ("prefill-8b-graphed.json", "prefill-8b-graphed-128k.json"), tables.prefill,
              f"{PREFILL_8B} --modes full,sift --cuda-graphs --save docs/results/prefill-8b-graphed.json"),
    Published("prefill-smollm2", ("prefill-smollm2.json",), tables.prefill,
              "sift bench prefill --models smollm2 --lengths 2k,4k,8k --modes full,sift --cuda-graphs "
              "--save docs/results/prefill-smollm2.json"),
    Published("kernels-documents", ("kernels.json",), tables.kernels_documents,
              f"{KERNELS} --save docs/results/kernels.json"),
    Published("kernels-causal", ("kernels.json",), tables.kernels_causal, f"{KERNELS} --save docs/results/kernels.json"),
    Published("decode", ("kernels.json",), tables.decode, f"{KERNELS} --save docs/results/kernels.json"),
    Published("profile", ("profile.json",), tables.profile, "sift bench profile --save docs/results/profile.json"),
    Published("store", ("store.json",), tables.store,
              "sift bench store --sizes 10000,100000,1000000 --save docs/results/store.json"),
    Published("store-scans", ("store.json",), tables.store_scans,
              "sift bench store --sizes 10000,100000,1000000 --save docs/results/store.json"),
    Published("store-lookup", ("prefill-8b-corpus-eager.json", "prefill-8b-corpus-graphed.json"), tables.store_lookup,
              "sift bench prefill --models llama3-8b --lengths 16k,32k --corpus-docs 100000 --repeat 5 "
              "[--cuda-graphs] --save docs/results/prefill-8b-corpus-{eager,graphed}.json"),
    Published("frontier", ("frontier-essays.json", "frontier-nq20.json", "frontier-nq10.json", "frontier-pairs.json"),
              tables.frontier, "sift eval frontier --sets essays --n-prompts 20 --device cuda --dtype bfloat16 "
                               "--backend cuda --save docs/results/frontier-essays.json (one file per set)"),
    Published("gather", ("gather.json", "gather-8k.json"), tables.gather,
              "sift bench gather --shards ESSAYS-SET --save docs/results/gather.json (ESSAYS-SET: `sift profile` of "
              "8 essays cut at 1,000 words)"),
    Published("storage", ("storage-t128.json", "storage-t64.json"), tables.storage,
              "sift eval storage --tile 128 --save docs/results/storage-t128.json; sift eval storage --tile 64 "
              "--save docs/results/storage-t64.json"),
    Published("qa", ("qa-nq10-fp32-reference.json", "qa-nq20-fp32-reference.json", "qa-nq10-bf16-cuda.json",
                     "qa-nq20-bf16-cuda.json"), tables.qa,
              "sift eval qa --nq --n-docs 10 --questions 100 --device cuda --dtype float32 --backend reference --save "
              "docs/results/qa-nq10-fp32-reference.json (one file per --n-docs and precision; --dtype bfloat16 "
              "--backend cuda: qa-nq10-bf16-cuda.json)"),
    Published("sweep", ("sweep-essays.json", "sweep-nq20.json"), tables.sweep,
              "sift eval sweep --data essays --n-prompts 3 --points '32,0.001,0.01,0.1;64,0.001,0.01,0.1;"
              "32,0.003,0.01,0.3;32,0.01,0.03,0.3;32,0.03,0.03,0.5' --device cuda --dtype float32 --backend reference "
              "--save docs/results/sweep-essays.json (and --data nq --n-docs 20 --n-prompts 6: sweep-nq20.json)"),
    Published("recall", ("recall-nq20.json", "recall-essays.json"), tables.recall,
              "sift eval recall --data nq --n-docs 20 --n-prompts 6 --threads 1 --save docs/results/recall-nq20.json; "
              "sift eval recall --data essays --n-prompts 3 --threads 1 --save docs/results/recall-essays.json"),
)}
