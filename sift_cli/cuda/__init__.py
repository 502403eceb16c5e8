"""Host code of the bundled CUDA kernels (`kernels/*.cu`): `runtime` (sources, NVRTC compilation, cache, TMA
descriptors, launch), `attention` (the sparse attention forward), `decode` (the bit-vector decoder), `checks`
(one kernel case against its reference)."""
