// SIFT bit-vector decode (SPEC §6, §7 v2): LA / CA bit vectors of one prompt -> per-layer CSR block lists over
// the prompt's document-aligned block table.
//
// Query block m covers rows [q_start[m], q_start[m] + q_len[m]); KV block kb covers keys [kv_start[kb],
// kv_start[kb] + kv_len[kb]) and lies inside one segment: kv_doc[kb] is its document, -1 for the prefix and
// n_docs for the suffix. Block (m, kb) is listed iff some allowed (query, key) pair with key <= query lies in it,
// where a query row
//   in the prefix or the suffix  sees every key (causal, dense);
//   in doc d (local row i)       sees every prefix key, the keys of earlier docs whose CA page is set (every
//                                key of a dense one), and the keys j of doc d whose LA tile (i / T, j / T) is set;
//   in a dense doc               (doc_dense[d] = 1: no bits) sees every key, like the suffix.
// This is evaluated exactly on intervals, the same rule as sift_cli's PyTorch builder (which the output must
// equal), in three launches that cover every layer of the prompt at once (grid z = layer):
//   sift_decode_count  counts the listed KV blocks of each row -> counts[layer][h * M + m];
//   sift_decode_scan   prefix sums -> CSR offsets [layer][H][M + 1];
//   sift_decode_write  writes each row's KV block ids into indices[layer * capacity + ...] in canonical order:
//                      first the blocks that need a mask (kv_len < block_n, or last key past the query block's
//                      first row), then the others, each group descending (the attention kernel relies on it).
// One CTA of 128 threads per (query block, DEC_HEADS heads, layer). Thread t takes KV blocks kb_max - t,
// kb_max - t - 128, ...; the row's geometry and each KV block's (kv_block) are worked out once and shared by the
// CTA's heads, which differ only in the bits they read. The write pass ranks the listed blocks of each 128-wide
// chunk by warp ballots met in shared memory, so each group comes out descending without sorting. No CUDA
// headers; the one #include is kernels/split_row.cuh, shared with the attention kernel.

#include "split_row.cuh"

#define DEC_THREADS 128
#define DEC_HEADS 8  // heads per CTA (grid y = ceil(H / DEC_HEADS))

struct DecodeArgs {
  const unsigned char* la;   // all docs' LA vectors
  const unsigned char* ca;   // all docs' CA vectors
  const int* doc_start;      // [n_docs] global token offset
  const int* doc_len;        // [n_docs]
  const long long* la_base;  // [n_docs] byte offset of doc d's LA blob
  const int* la_len;         // [n_docs] bytes of one (layer, head) LA vector of doc d
  const long long* ca_base;  // [n_docs]
  const int* ca_len;         // [n_docs]
  const int* doc_dense;      // [n_docs] 1: no bits, dense in both directions
  const int* q_start;        // [M]
  const int* q_len;          // [M]
  const int* kv_start;       // [N]
  const int* kv_len;         // [N]
  const int* kv_doc;         // [N]
  int n_docs, prefix_len, docs_end, seq_len, tile, n_heads, block_n, n_qblocks, n_kvblocks;
};

struct RowCtx {
  int q0, q1;           // the query block's first and last row
  int dense_last;       // last prefix/suffix/dense-doc row in the block (-1: none)
  int has_doc_rows;     // the block holds at least one document row
  int d_first, d_last;  // documents with rows in the block
  int kb_max;           // last KV block whose first key is <= q1
  int layer;
};

// Last index i < n with starts[i] <= x (starts ascending: documents, KV blocks); -1 if none.
__device__ __forceinline__ int last_at_most(const int* starts, int n, int x) {
  int lo = 0, hi = n - 1, ans = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    if (starts[mid] <= x) {
      ans = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return ans;
}

__device__ __forceinline__ int get_bit(const unsigned char* vec, long long idx) {
  return (vec[idx >> 3] >> (7 - (int)(idx & 7))) & 1;
}

__device__ __forceinline__ RowCtx make_ctx(const DecodeArgs& a, int m, int layer) {
  RowCtx c;
  c.q0 = a.q_start[m];
  c.q1 = c.q0 + a.q_len[m] - 1;
  c.layer = layer;
  int dl = -1;
  if (a.prefix_len > 0 && c.q0 < a.prefix_len) dl = min(c.q1, a.prefix_len - 1);
  if (c.q1 >= a.docs_end) dl = c.q1;  // suffix rows (the suffix is the tail of the prompt)
  c.dense_last = dl;  // raised below by the rows of dense documents
  c.has_doc_rows = (a.n_docs > 0) && (c.q1 >= a.prefix_len) && (c.q0 < a.docs_end);
  c.d_first = c.d_last = -1;
  if (c.has_doc_rows) {
    c.d_first = last_at_most(a.doc_start, a.n_docs, max(c.q0, a.prefix_len));
    c.d_last = last_at_most(a.doc_start, a.n_docs, min(c.q1, a.docs_end - 1));
    for (int d = c.d_first; d <= c.d_last; ++d)
      if (a.doc_dense[d]) c.dense_last = max(c.dense_last, min(c.q1, a.doc_start[d] + a.doc_len[d] - 1));
  }
  c.kb_max = last_at_most(a.kv_start, a.n_kvblocks, c.q1);
  return c;
}

// Does this row's list need block kb in its masked group (see the header)?
__device__ __forceinline__ bool needs_mask(const DecodeArgs& a, const RowCtx& c, int kb) {
  return a.kv_len[kb] < a.block_n || a.kv_start[kb] + a.block_n - 1 > c.q0;
}

// What a row's list decides about KV block kb before looking at any head's bits (see the header's rule).
struct KvBlock {
  int verdict;                        // 1: listed for every head, 0: for none, -1: the head's bits decide
  int p_lo, p_hi;                     // CA pages to look at (none when p_lo > p_hi)
  int r_lo, r_hi, c_lo, c_hi;         // LA tiles to look at (none when r_lo > r_hi)
  int k0, s, re;                      // first key, its document's first key, the document's last row here
  const unsigned char* ca_v;          // CA vector of head 0 in this layer; head h's is h * ca_len further
  const unsigned char* la_v;
  int ca_len, la_len;
};

// The head-independent part of "is KV block kb listed for this row": the block's geometry, loaded once and
// shared by the CTA's heads.
__device__ __forceinline__ KvBlock kv_block(const DecodeArgs& a, const RowCtx& c, int kb) {
  KvBlock b;
  b.verdict = 0;
  b.p_lo = 1, b.p_hi = 0, b.r_lo = 1, b.r_hi = 0;
  const int k0 = a.kv_start[kb];
  const int k1 = k0 + a.kv_len[kb] - 1;
  if (k0 <= c.dense_last) { b.verdict = 1; return b; }  // prefix / suffix rows: causal dense
  if (!c.has_doc_rows) return b;
  const int d = a.kv_doc[kb];
  if (d < 0) { b.verdict = 1; return b; }               // doc rows see the whole prefix
  if (d >= a.n_docs || d > c.d_last) return b;          // suffix keys, or keys of docs no row here sees
  if (a.doc_dense[d]) { b.verdict = d < c.d_last; return b; }  // its own rows are dense (dense_last)
  const int T = a.tile;
  const long long vec0 = (long long)c.layer * a.n_heads;  // (layer, head 0) vector inside a doc blob
  const int s = a.doc_start[d];
  b.k0 = k0, b.s = s;
  if (d < c.d_last) {                                   // CA pages of an earlier doc (rows of a later doc see them)
    b.ca_len = a.ca_len[d];
    b.ca_v = a.ca + a.ca_base[d] + vec0 * b.ca_len;
    b.p_lo = (k0 - s) / T, b.p_hi = (k1 - s) / T;
  }
  if (d >= c.d_first) {                                 // LA tiles inside doc d
    const int e = s + a.doc_len[d];
    const int rs = max(c.q0, s), re = min(c.q1, e - 1);  // this doc's rows inside the block
    if (rs <= re && k0 <= re) {
      b.la_len = a.la_len[d];
      b.la_v = a.la + a.la_base[d] + vec0 * b.la_len;
      b.re = re;
      b.r_lo = (rs - s) / T, b.r_hi = (re - s) / T;
      b.c_lo = (k0 - s) / T, b.c_hi = (k1 - s) / T;
    }
  }
  if (b.p_lo <= b.p_hi || b.r_lo <= b.r_hi) b.verdict = -1;
  return b;
}

// Is the block listed for head h (of the layer kv_block was given)?
__device__ __forceinline__ bool listed(const KvBlock& b, int h, int T) {
  if (b.verdict >= 0) return b.verdict;
  if (b.p_lo <= b.p_hi) {
    const unsigned char* v = b.ca_v + (long long)h * b.ca_len;
    for (int p = b.p_lo; p <= b.p_hi; ++p)
      if (get_bit(v, p)) return true;
  }
  if (b.r_lo <= b.r_hi) {
    const unsigned char* v = b.la_v + (long long)h * b.la_len;
    for (int r = b.r_lo; r <= b.r_hi; ++r) {
      const int max_row = min(b.re, b.s + (r + 1) * T - 1);
      const int top = min(b.c_hi, r);
      for (int cc = b.c_lo; cc <= top; ++cc) {
        const int min_col = max(b.k0, b.s + cc * T);
        if (max_row >= min_col && get_bit(v, (long long)r * (r + 1) / 2 + cc)) return true;
      }
    }
  }
  return false;
}

// Kernel parameters are flat (pointers and ints), gathered into DecodeArgs inside the kernel.
#define DECODE_PARAMS                                                                                      \
  const unsigned char *la, const unsigned char *ca, const int *doc_start, const int *doc_len,              \
      const long long *la_base, const int *la_len, const long long *ca_base, const int *ca_len,            \
      const int *doc_dense,                                                                                \
      const int *q_start, const int *q_len, const int *kv_start, const int *kv_len, const int *kv_doc,     \
      int n_docs, int prefix_len, int docs_end, int seq_len, int tile, int n_heads, int block_n,           \
      int n_qblocks, int n_kvblocks
#define DECODE_ARGS                                                                                        \
  DecodeArgs a;                                                                                            \
  a.la = la; a.ca = ca; a.doc_start = doc_start; a.doc_len = doc_len; a.la_base = la_base;                 \
  a.la_len = la_len; a.ca_base = ca_base; a.ca_len = ca_len; a.doc_dense = doc_dense;                      \
  a.q_start = q_start; a.q_len = q_len;                                                                    \
  a.kv_start = kv_start; a.kv_len = kv_len; a.kv_doc = kv_doc; a.n_docs = n_docs;                          \
  a.prefix_len = prefix_len; a.docs_end = docs_end; a.seq_len = seq_len; a.tile = tile;                    \
  a.n_heads = n_heads; a.block_n = block_n; a.n_qblocks = n_qblocks; a.n_kvblocks = n_kvblocks;

// Pass 1. grid (M, ceil(H / DEC_HEADS), n_layers_in_launch); counts[(z * H + h) * M + m] for layer layer0 + z.
// Each thread loads a KV block's geometry once and evaluates the bits of the CTA's heads on it.
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 8)
sift_decode_count(DECODE_PARAMS, int layer0, int* __restrict__ counts) {
  DECODE_ARGS
  const int m = blockIdx.x, z = blockIdx.z;
  const RowCtx c = make_ctx(a, m, layer0 + z);
  __shared__ int warp_sum[DEC_HEADS][DEC_THREADS / 32];
  const int h0 = blockIdx.y * DEC_HEADS;
  const int nh = min(DEC_HEADS, a.n_heads - h0);
  int n[DEC_HEADS];
#pragma unroll
  for (int hh = 0; hh < DEC_HEADS; ++hh) n[hh] = 0;
  if (c.dense_last == c.q1) {                                  // fully dense row block
#pragma unroll
    for (int hh = 0; hh < DEC_HEADS; ++hh) n[hh] = (threadIdx.x == 0) ? c.kb_max + 1 : 0;
  } else {
    for (int kb = c.kb_max - (int)threadIdx.x; kb >= 0; kb -= DEC_THREADS) {
      const KvBlock b = kv_block(a, c, kb);
#pragma unroll
      for (int hh = 0; hh < DEC_HEADS; ++hh)
        if (hh < nh) n[hh] += listed(b, h0 + hh, a.tile) ? 1 : 0;
    }
  }
#pragma unroll
  for (int hh = 0; hh < DEC_HEADS; ++hh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) n[hh] += __shfl_xor_sync(0xffffffffu, n[hh], o);
    if ((threadIdx.x & 31) == 0) warp_sum[hh][threadIdx.x >> 5] = n[hh];
  }
  __syncthreads();
  if (threadIdx.x < nh) {
    int t = 0;
#pragma unroll
    for (int w = 0; w < DEC_THREADS / 32; ++w) t += warp_sum[threadIdx.x][w];
    counts[((long long)z * a.n_heads + h0 + threadIdx.x) * a.n_qblocks + m] = t;
  }
}

// Pass 2. grid (M, ceil(H / DEC_HEADS), n_layers_in_launch); offsets [n][H][M + 1] from the scan; layer
// layer0 + z writes its CSR index array at indices + z * capacity. Each chunk of 128 KV blocks is evaluated once
// for all the CTA's heads; each warp's ballot per head goes to shared memory, where every thread finds its place.
extern "C" __global__ void __launch_bounds__(DEC_THREADS, 8)
sift_decode_write(DECODE_PARAMS, int layer0, const int* __restrict__ offsets, int* __restrict__ indices,
                  long long capacity) {
  DECODE_ARGS
  const int m = blockIdx.x, z = blockIdx.z;
  const RowCtx c = make_ctx(a, m, layer0 + z);
  int* out = indices + (long long)z * capacity;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned lanes_below = (1u << lane) - 1u;
  __shared__ unsigned warp_ballot[DEC_HEADS][DEC_THREADS / 32];
  const int h0 = blockIdx.y * DEC_HEADS;
  const int nh = min(DEC_HEADS, a.n_heads - h0);
  int base[DEC_HEADS];
#pragma unroll
  for (int hh = 0; hh < DEC_HEADS; ++hh)
    base[hh] = hh < nh ? offsets[((long long)z * a.n_heads + h0 + hh) * (a.n_qblocks + 1) + m] : 0;
  for (int group = 0; group < 2; ++group) {                    // 0: blocks that need a mask, 1: the rest
    for (int chunk = 0; chunk <= c.kb_max; chunk += DEC_THREADS) {
      const int kb = c.kb_max - chunk - tid;                   // lower thread id -> larger block id
      KvBlock b;
      b.verdict = 0;
      if (kb >= 0 && needs_mask(a, c, kb) == (group == 0)) b = kv_block(a, c, kb);
#pragma unroll
      for (int hh = 0; hh < DEC_HEADS; ++hh) {
        const unsigned ballot = __ballot_sync(0xffffffffu, hh < nh && listed(b, h0 + hh, a.tile));
        if (lane == 0) warp_ballot[hh][warp] = ballot;
      }
      __syncthreads();
#pragma unroll
      for (int hh = 0; hh < DEC_HEADS; ++hh) {
        int before = 0, total = 0;
#pragma unroll
        for (int w = 0; w < DEC_THREADS / 32; ++w) {
          const int cnt = __popc(warp_ballot[hh][w]);
          before += (w < warp) ? cnt : 0;
          total += cnt;
        }
        const unsigned ballot = warp_ballot[hh][warp];
        if ((ballot >> lane) & 1u) out[base[hh] + before + __popc(ballot & lanes_below)] = kb;
        base[hh] += total;
      }
      __syncthreads();                                          // warp_ballot is rewritten by the next chunk
    }
  }
}

// Exclusive prefix sum over the CTA of one value per thread (threads in order); returns it, *total gets the sum.
__device__ __forceinline__ int cta_exclusive_scan(int v, int* warp_tot, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();  // warp_tot may still be read by a previous scan
  if (lane == 31) warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const int w = warp_tot[lane];
    int wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, wi, o);
      if (lane >= o) wi += y;
    }
    warp_tot[lane] = wi - w;  // exclusive prefix of warp totals
    if (lane == 31) warp_tot[32] = wi;
  }
  __syncthreads();
  *total = warp_tot[32];
  return warp_tot[warp] + incl - v;
}

// Prefix sum: counts [n_layers][H * M] -> offsets [n_layers][H][M + 1] (exclusive sums; offsets[h][M] is the
// end of head h, i.e. offsets[h + 1][0]). One CTA of SCAN_THREADS per layer; each thread scans a contiguous run.
//
// With tile_order set it also computes the attention kernel's work order (cuda/work_order.py's work_order, equal
// to it entry for entry), so a prompt's preparation launches nothing else: rows R = H * M are cut into parts of
// about cap = max(min_blocks, total / ctas) blocks (at most split_max, whole steps of per_step blocks), the
// virtual tiles v = row * split_max + part sorted by length, longest first, ties in part-major order (part, then
// row); n_active (tiles with a part), split_cap (cap) and split_slot (first workspace slot of each split row:
// exclusive sums of the part counts of split rows). Dynamic shared memory: n_bins ints, n_bins > the longest part.
#define SCAN_THREADS 1024
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
sift_decode_scan(const int* __restrict__ counts, int n_heads, int n_qblocks, int* __restrict__ offsets,
                 int* __restrict__ tile_order, int* __restrict__ n_active, int* __restrict__ split_cap,
                 int* __restrict__ split_slot, int per_step, int ctas, int split_max, int min_blocks, int n_bins) {
  extern __shared__ int bins[];
  __shared__ int warp_tot[33];
  const int z = blockIdx.x;
  const int R = n_heads * n_qblocks;
  const int* cnt = counts + (long long)z * R;
  int* off = offsets + (long long)z * n_heads * (n_qblocks + 1);
  const int per = (R + SCAN_THREADS - 1) / SCAN_THREADS;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int lo = min(tid * per, R), hi = min(lo + per, R);
  int sum = 0;
  for (int i = lo; i < hi; ++i) sum += cnt[i];
  int total;
  int run = cta_exclusive_scan(sum, warp_tot, &total);
  for (int i = lo; i < hi; ++i) {
    const int h = i / n_qblocks, m = i - h * n_qblocks;
    off[(long long)h * (n_qblocks + 1) + m] = run;
    run += cnt[i];
    if (m == n_qblocks - 1) off[(long long)h * (n_qblocks + 1) + n_qblocks] = run;
  }
  if (tile_order == nullptr) return;

  const int cap = max(min_blocks, (int)(((long long)total + ctas - 1) / ctas));
  int split_parts = 0, my_parts = 0;
  for (int i = lo; i < hi; ++i) {
    int parts, chunk;
    split_row(cnt[i], cap, split_max, per_step, parts, chunk);
    split_parts += parts > 1 ? parts : 0;
    my_parts += parts;
  }
  int n_tiles;
  run = cta_exclusive_scan(split_parts, warp_tot, &total);
  (void)cta_exclusive_scan(my_parts, warp_tot, &n_tiles);
  for (int i = lo; i < hi; ++i) {
    int parts, chunk;
    split_row(cnt[i], cap, split_max, per_step, parts, chunk);
    split_slot[(long long)z * R + i] = run;
    run += parts > 1 ? parts : 0;
  }
  if (tid == 0) {
    split_cap[z] = cap;
    n_active[z] = n_tiles;
  }
  // Counting sort of the tiles by length, descending.
  for (int b = tid; b < n_bins; b += SCAN_THREADS) bins[b] = 0;
  __syncthreads();
  for (int i = lo; i < hi; ++i) {
    int parts, chunk;
    const int n = cnt[i];
    split_row(n, cap, split_max, per_step, parts, chunk);
    for (int p = 0; p < parts; ++p) atomicAdd(&bins[max(0, min(chunk, n - p * chunk))], 1);
  }
  const int bper = (n_bins + SCAN_THREADS - 1) / SCAN_THREADS;  // bins scanned from the longest length down
  const int blo = min(tid * bper, n_bins), bhi = min(blo + bper, n_bins);
  __syncthreads();
  int bsum = 0;
  for (int j = blo; j < bhi; ++j) bsum += bins[n_bins - 1 - j];
  int brun = cta_exclusive_scan(bsum, warp_tot, &total);
  for (int j = blo; j < bhi; ++j) {
    const int c = bins[n_bins - 1 - j];
    bins[n_bins - 1 - j] = brun;  // first position of this length
    brun += c;
  }
  __syncthreads();
  // Stable placement in part-major order u = part * R + row: chunks of SCAN_THREADS, each warp's lanes ranked
  // among equal lengths by a match, the warps of a chunk taking their positions one after the other.
  int* order = tile_order + (long long)z * R * split_max;
  for (int u0 = 0; u0 < R * split_max; u0 += SCAN_THREADS) {
    const int u = u0 + tid;
    int key = -1, v = 0;
    if (u < R * split_max) {
      const int p = u / R, row = u - p * R;
      int parts, chunk;
      const int n = cnt[row];
      split_row(n, cap, split_max, per_step, parts, chunk);
      if (p < parts) {
        key = max(0, min(chunk, n - p * chunk));
        v = row * split_max + p;
      }
    }
    if (!__syncthreads_or(key >= 0)) continue;
    const unsigned peers = __match_any_sync(0xffffffffu, key);
    const int leader = __ffs(peers) - 1;
    const int rank = __popc(peers & ((1u << lane) - 1u));
    for (int w = 0; w < SCAN_THREADS / 32; ++w) {
      if (warp == w) {
        int base = 0;
        if (key >= 0 && lane == leader) {
          base = bins[key];
          bins[key] = base + __popc(peers);
        }
        base = __shfl_sync(0xffffffffu, base, leader);
        if (key >= 0) order[base + rank] = v;
      }
      __syncthreads();
    }
  }
}
