"""Measurements of the paper's claims on the user's own model and corpus.

One module per measurement; each takes plain data (a loaded model, shard sets, prompt specs) and returns plain
dicts, and a `*_report` function per command does what `sift eval …` asks (load the model, build the prompts,
measure), so the CLI (`sift_cli/cli/eval.py`) only parses and renders:

- `prompt_sets` prompt specs (NQ, essays, user files), profiling into a work directory, prompt composition
- `probe`       run a model's dense forward and hand every layer's post-RoPE q, k to a callback
- `recall`      truly high attention cells of composed prompts against the stored LA tiles / CA pages
- `backend`     the backend an evaluation runs SIFT with (on CPU the reference in its banded mode)
- `kvreuse`     per-document KV caches, RoPE re-rotation, naive KV reuse and CacheBlend
- `static`      the sink+window static sparse baseline at a given block density
- `qa_records`  multi-document QA records: reading, writing, the NQ builder
- `qa`          lost-in-the-middle scoring, every mode side by side on each question
- `thresholds`  threshold-free document statistics: bits for any (T, alpha, beta, gamma) from one model pass
- `sweep`       density and fidelity over a grid of thresholds; `calibrate` picks the sparsest that meets a target
- `storage`     SIFT metadata bytes against KV-cache bytes (shard sets and published model configs)
"""
