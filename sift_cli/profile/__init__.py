"""Offline profiling (SPEC §3): documents → model pass → attention statistics → bits → shards.

- `forward`            the profiling forward: SDPA plus statistics per layer; `profile_batch`, `launch_profile_batch`
- `statistics`         the reference statistics of one document in fp32 torch, in bounded memory
- `triton_statistics`  the same statistics for a whole padded batch with Triton kernels (the fast path on CUDA)
- `doc_bits`           `DocBits` and the packing of a batch's bits on the device
- `batches`            documents into padded batches
- `job`                `sift profile` as a job: a corpus into hash-bucketed shard files, resumable
"""
