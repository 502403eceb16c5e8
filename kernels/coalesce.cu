// Block lists -> the attention kernel's key tiles (SPEC §6 v2 blocks, computed as fewer, fuller tiles).
//
// A row's CSR block list (canonical order, from decode.cu or sift_cli's PyTorch builder) names KV blocks cut per
// segment, so a document of 140 keys is three blocks of 64, 64 and 12 keys, and every block costs the kernel a
// whole tile. Consecutive KV blocks are adjacent in key space (segments tile the prompt), so the keys a row's
// list selects are a union of runs of consecutive blocks. Each run [a, e) is re-cut from its end into tiles of
// `key_block` keys, [max(a, e - j * key_block), e - (j - 1) * key_block) for j = 1 .. ceil((e - a) / key_block):
// the same keys, ceil((e - a) / key_block) tiles instead of one per block. A tile is a packed entry
// (first key << 8) | key count, in canonical order: first the tiles that need a mask (key count < key_block, or
// last key past the query block's first row), then the rest, each group by first key descending. With merge = 0
// every block is its own run: one entry per block, in the list's own order (the kernel's input before merging).
//
// One warp per row (query head h, query block m) of one layer, CO_WARPS rows per CTA, grid y = layer:
//   sift_coalesce_count  tiles per row -> counts[layer][h * M + m] (decode.cu's sift_decode_scan then makes the
//                        CSR offsets and the attention kernel's work order from them);
//   sift_coalesce_write  writes each row's entries at entries[layer * capacity + offsets[...]].
// The warp marks its row's blocks in a bitmap in shared memory (words ints per warp, words >= N / 32 + 1), then
// walks the blocks from the highest down, 32 at a time: lane i takes block top - 32 c - i, finds its run's end
// from the nearest run top at or above it (a ballot, carried across chunks), and owns the tiles whose first key
// lies in its block (at most two: one cut at e - j * key_block, and the run's bottom tile).

#define CO_WARPS 4

struct CoArgs {
  const int* offsets;   // [n_layers][H][M + 1] block lists
  const int* indices;   // [n_layers][capacity]
  long long capacity;
  const int* q_start;   // [M]
  const int* kv_start;  // [N]
  const int* kv_len;    // [N]
  int n_heads, n_qblocks, key_block, merge, words;
};

struct RowTiles {
  int row, z, q0, top;  // top: the highest listed block (-1: empty row)
  unsigned* bm;         // the row's bitmap of listed blocks
};

__device__ __forceinline__ bool bit(const unsigned* bm, int kb) { return (bm[kb >> 5] >> (kb & 31)) & 1u; }

// Marks the row's blocks in the warp's bitmap; false for a lane of a warp past the last row.
__device__ __forceinline__ bool load_row(const CoArgs& a, unsigned* smem, RowTiles& r) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int R = a.n_heads * a.n_qblocks;
  r.row = blockIdx.x * CO_WARPS + warp;
  r.z = blockIdx.y;
  if (r.row >= R) return false;
  const int h = r.row / a.n_qblocks, m = r.row - h * a.n_qblocks;
  const int* off = a.offsets + (long long)r.z * a.n_heads * (a.n_qblocks + 1) + h * (a.n_qblocks + 1) + m;
  const int start = off[0], n = off[1] - start;
  const int* idx = a.indices + (long long)r.z * a.capacity + start;
  r.q0 = a.q_start[m];
  r.bm = smem + warp * a.words;
  for (int w = lane; w < a.words; w += 32) r.bm[w] = 0u;
  __syncwarp();
  int top = -1;
  for (int i = lane; i < n; i += 32) {
    const int kb = idx[i];
    atomicOr(&r.bm[kb >> 5], 1u << (kb & 31));
    top = max(top, kb);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) top = max(top, __shfl_xor_sync(0xffffffffu, top, o));
  r.top = top;
  __syncwarp();
  return true;
}

// The tiles whose first key lies in one lane's block: a cut at e - j * key_block (len key_block) and the bottom
// tile of the run (len ((e - s - 1) % key_block) + 1); starts descending (the cut lies above the bottom).
struct LaneTiles {
  int n;
  int start[2], len[2];
};

// One chunk of 32 blocks below `base` (lane i: block base - i); `carry` is the run end running into the chunk
// from above, updated for the next chunk.
__device__ __forceinline__ LaneTiles chunk_tiles(const CoArgs& a, const RowTiles& r, int base, int& carry) {
  const int lane = threadIdx.x & 31;
  const int kb = base - lane;
  const bool listed = kb >= 0 && bit(r.bm, kb);
  bool up = false, down = false;
  int s = 0, l = 0;
  if (listed) {
    s = a.kv_start[kb], l = a.kv_len[kb];
    if (a.merge) {
      up = kb + 1 <= r.top && bit(r.bm, kb + 1);
      down = kb >= 1 && bit(r.bm, kb - 1);
    }
  }
  const bool is_top = listed && !up;
  const unsigned tops = __ballot_sync(0xffffffffu, is_top);
  const unsigned at_or_above = tops & (lane == 31 ? 0xffffffffu : ((2u << lane) - 1u));
  const int src = at_or_above ? 31 - __clz(at_or_above) : 0;
  int e = __shfl_sync(0xffffffffu, s + l, src);
  if (!at_or_above) e = carry;
  carry = __shfl_sync(0xffffffffu, e, 31);
  LaneTiles t;
  t.n = 0;
  if (!listed) return t;
  const int B = a.key_block;
  const int lo = s + (down ? 0 : 1), hi = s + l;  // a cut at the run's bottom key is the bottom tile itself
  if ((e - lo) / B != (e - hi) / B) {
    t.start[t.n] = e - ((e - lo) / B) * B;
    t.len[t.n++] = B;
  }
  if (!down) {
    t.start[t.n] = s;
    t.len[t.n++] = (e - s - 1) % B + 1;
  }
  return t;
}

__device__ __forceinline__ bool masked(const CoArgs& a, int start, int len, int q0) {
  return len < a.key_block || start + a.key_block - 1 > q0;
}

#define CO_PARAMS                                                                                          \
  const int *offsets, const int *indices, long long capacity, const int *q_start, const int *kv_start,     \
      const int *kv_len, int n_heads, int n_qblocks, int key_block, int merge, int words
#define CO_ARGS                                                                                            \
  CoArgs a{offsets, indices, capacity, q_start, kv_start, kv_len, n_heads, n_qblocks, key_block, merge, words};

extern "C" __global__ void __launch_bounds__(CO_WARPS * 32)
sift_coalesce_count(CO_PARAMS, int* __restrict__ counts) {
  CO_ARGS
  extern __shared__ unsigned co_smem[];
  RowTiles r;
  if (!load_row(a, co_smem, r)) return;
  int n = 0, carry = 0;
  for (int base = r.top; base >= 0; base -= 32) n += chunk_tiles(a, r, base, carry).n;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) n += __shfl_xor_sync(0xffffffffu, n, o);
  if ((threadIdx.x & 31) == 0) counts[(long long)r.z * a.n_heads * a.n_qblocks + r.row] = n;
}

extern "C" __global__ void __launch_bounds__(CO_WARPS * 32)
sift_coalesce_write(CO_PARAMS, const int* __restrict__ tile_offsets, int* __restrict__ entries,
                    long long entry_capacity) {
  CO_ARGS
  extern __shared__ unsigned co_smem[];
  RowTiles r;
  if (!load_row(a, co_smem, r)) return;
  const int lane = threadIdx.x & 31;
  const int h = r.row / a.n_qblocks, m = r.row - h * a.n_qblocks;
  int* out = entries + (long long)r.z * entry_capacity
             + tile_offsets[(long long)r.z * a.n_heads * (a.n_qblocks + 1) + h * (a.n_qblocks + 1) + m];
  // Without merging, entries keep the list's own order (one per block): the lists are canonical already.
  if (!a.merge) {
    const int* off = a.offsets + (long long)r.z * a.n_heads * (a.n_qblocks + 1) + h * (a.n_qblocks + 1) + m;
    const int* idx = a.indices + (long long)r.z * a.capacity + off[0];
    for (int i = lane; i < off[1] - off[0]; i += 32) out[i] = (a.kv_start[idx[i]] << 8) | a.kv_len[idx[i]];
    return;
  }
  int pos = 0;
  for (int group = 0; group < 2; ++group) {  // 0: tiles that need a mask, 1: the rest
    int carry = 0;
    for (int base = r.top; base >= 0; base -= 32) {
      const LaneTiles t = chunk_tiles(a, r, base, carry);
      bool keep[2];
      int mine = 0;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        keep[i] = i < t.n && masked(a, t.start[i], t.len[i], r.q0) == (group == 0);
        mine += keep[i];
      }
      int incl = mine;  // inclusive prefix over lanes: lower lanes hold higher blocks, so they go first
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      int p = pos + incl - mine;
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (keep[i]) out[p++] = (t.start[i] << 8) | t.len[i];
      pos += __shfl_sync(0xffffffffu, incl, 31);
    }
  }
}
