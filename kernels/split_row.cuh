// Split-KV: a row of n listed blocks is cut into n_splits contiguous parts of about n / n_splits blocks, rounded up
// to whole pipeline steps of per_step blocks (at most split_max parts, n_splits ~ n / cap, none empty; an empty row
// is one empty part). The attention kernel runs the parts, the decoder orders them (its work order), and the host
// computes the same numbers (sift_cli/cuda/work_order.py). Included by both kernels; NVRTC gets it inlined by
// sift_cli.cuda.runtime.kernel_source.
#pragma once

__device__ __forceinline__ void split_row(int n, int cap, int split_max, int per_step, int& n_splits, int& chunk) {
  if (n <= 0 || split_max <= 1) {
    n_splits = 1;
    chunk = n;
    return;
  }
  n_splits = min(split_max, (n + cap - 1) / cap);
  chunk = ((n + n_splits - 1) / n_splits + per_step - 1) / per_step * per_step;  // whole pipeline steps
  n_splits = (n + chunk - 1) / chunk;
}
