"""The request path, one step a module, as profiling is one package (`profile/`):

- `lookup`: the shard sets a prompt reads, and its documents' bits fetched from them;
- `inputs`, `assemble`: the prompt's documents and query, then prefix ‖ docs ‖ suffix as token ids and bits;
- `options`, `plan`: what one prefill runs with; the block table, the bits on the device, every layer's lists;
- `run`, `graphs`: one timed prefill, full recompute or SIFT, eager or replayed from a CUDA graph;
- `report`, `generate`: both modes side by side and what a report says of them; the greedy answers;
- `job`, `missing`: `sift prefill` as a job; documents no set holds, profiled for the next prompt.
"""
