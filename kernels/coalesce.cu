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
//   sift_coalesce_count  tiles per row -> counts[layer][h * M + m], and how many need the mask (decode.cu's
//                        sift_decode_scan then makes the CSR offsets and the attention kernel's work order);
//   sift_coalesce_write  writes each row's entries at entries[layer * capacity + offsets[...]], in one walk.
// The warp marks its row's blocks in a bitmap in shared memory (words ints per warp, words >= N / 32 + 1), then
// walks only the listed blocks, from the highest down: 32 bitmap words at a time are expanded (one word per lane)
// into a descending list of their set blocks in shared memory (at most CO_LIST = 32 * 32 entries), which the warp
// takes 32 at a time. Lane i takes one listed block, finds its run's end from the nearest run top at or above it
// in the list (a ballot, carried across chunks; consecutive listed blocks of a run are consecutive entries), and
// owns the tiles whose first key lies in its block (at most two: one cut at e - j * key_block, and the run's
// bottom tile). A row costs its listed blocks, not its span: at 64K most of a row's 32-block spans hold a
// block or two.

#define CO_WARPS 4
#define CO_LIST 1024  // listed blocks staged per warp: 32 bitmap words of 32 blocks

struct CoArgs {
  const int* offsets;   // [n_layers][H][M + 1] block lists
  const int* indices;   // [n_layers][capacity]
  long long capacity;
  const int* q_start;   // [M]
  const int* kv_start;  // [N]
  const int* kv_len;    // [N]
  int n_heads, n_qblocks, key_shift, merge, words;  // key_block = 1 << key_shift
};

struct RowTiles {
  int row, z, q0, top;  // top: the highest listed block (-1: empty row)
  unsigned* bm;         // the row's bitmap of listed blocks
  int* list;            // CO_LIST entries: a batch of listed blocks, descending
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
  r.list = (int*)(smem + CO_WARPS * a.words) + warp * CO_LIST;
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
// tile of the run (len ((e - s - 1) % key_block) + 1); starts descending (the cut lies above the bottom), and
// whether each needs the mask (count < key_block, or last key past the query block's first row q0).
struct LaneTiles {
  bool cut, bottom;        // which of the two tiles start in the block
  int cut_start;           // the cut's tile: [cut_start, cut_start + key_block)
  int bottom_start, bottom_len;
  bool cut_masked, bottom_masked;
};

// One chunk of up to 32 listed blocks, descending (lane i: block kb, -1 past the last); `carry` is the run end
// running into the chunk from above, updated for the next chunk. Neighbours come from the bitmap; key_block is a
// power of two, so the cuts are shifts.
__device__ __forceinline__ LaneTiles chunk_tiles(const CoArgs& a, const RowTiles& r, int kb, int& carry) {
  const int lane = threadIdx.x & 31;
  const bool listed = kb >= 0;
  bool up = false, down = false;
  int s = 0, l = 0;
  if (listed) {
    s = a.kv_start[kb], l = a.kv_len[kb];
    if (a.merge) {
      up = bit(r.bm, kb + 1);  // words > N / 32: bit N exists, and is clear
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
  const int sh = a.key_shift, B = 1 << sh;
  const int lo = s + (down ? 0 : 1), hi = s + l;  // a cut at the run's bottom key is the bottom tile itself
  LaneTiles t;
  t.cut = listed && ((e - lo) >> sh) != ((e - hi) >> sh);
  t.cut_start = e - (((e - lo) >> sh) << sh);
  t.cut_masked = t.cut_start + B - 1 > r.q0;
  t.bottom = listed && !down;
  t.bottom_start = s;
  t.bottom_len = ((e - s - 1) & (B - 1)) + 1;
  t.bottom_masked = t.bottom_len < B || s + B - 1 > r.q0;
  return t;
}

// Calls f(chunk_tiles(...)) for every chunk of the row's listed blocks, highest first (warp-uniform calls).
template <class F>
__device__ __forceinline__ void walk_listed(const CoArgs& a, const RowTiles& r, F f) {
  const int lane = threadIdx.x & 31;
  int carry = 0;
  for (int w0 = r.top >> 5; w0 >= 0; w0 -= 32) {
    const int w = w0 - lane;  // lower lanes hold higher words
    unsigned bits = w >= 0 ? r.bm[w] : 0u;
    const int c = __popc(bits);
    int incl = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (total == 0) continue;
    for (int p = incl - c; bits; ++p) {
      const int hi = 31 - __clz(bits);
      r.list[p] = (w << 5) + hi;
      bits &= ~(1u << hi);
    }
    __syncwarp();
    for (int i0 = 0; i0 < total; i0 += 32) {
      const int i = i0 + lane;
      f(chunk_tiles(a, r, i < total ? r.list[i] : -1, carry));
    }
    __syncwarp();  // the next batch rewrites the list
  }
}

// Per lane, (tiles that need the mask) + (the others) << 16; a warp's or a row's sum packs both counts (a row has
// fewer than 65,536 tiles of each kind: at most one per KV block, and decode.cu's histogram caps those at 51,200).
__device__ __forceinline__ unsigned packed_counts(const LaneTiles& t) {
  unsigned v = 0;
  if (t.cut) v += t.cut_masked ? 1u : 1u << 16;
  if (t.bottom) v += t.bottom_masked ? 1u : 1u << 16;
  return v;
}

#define CO_PARAMS                                                                                          \
  const int *offsets, const int *indices, long long capacity, const int *q_start, const int *kv_start,     \
      const int *kv_len, int n_heads, int n_qblocks, int key_shift, int merge, int words
#define CO_ARGS                                                                                            \
  CoArgs a{offsets, indices, capacity, q_start, kv_start, kv_len, n_heads, n_qblocks, key_shift, merge, words};

// counts[layer][h * M + m]: the row's tiles; masked[...]: how many of them need the mask (the write pass puts the
// others after them).
extern "C" __global__ void __launch_bounds__(CO_WARPS * 32)
sift_coalesce_count(CO_PARAMS, int* __restrict__ counts, int* __restrict__ masked) {
  CO_ARGS
  extern __shared__ unsigned co_smem[];
  RowTiles r;
  if (!load_row(a, co_smem, r)) return;
  unsigned v = 0;
  walk_listed(a, r, [&](const LaneTiles& t) { v += packed_counts(t); });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) {
    const long long i = (long long)r.z * a.n_heads * a.n_qblocks + r.row;
    counts[i] = (int)((v & 0xffffu) + (v >> 16));
    masked[i] = (int)(v & 0xffffu);
  }
}

extern "C" __global__ void __launch_bounds__(CO_WARPS * 32)
sift_coalesce_write(CO_PARAMS, const int* __restrict__ masked, const int* __restrict__ tile_offsets,
                    int* __restrict__ entries, long long entry_capacity) {
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
  // One walk: the tiles that need the mask go from out[0] on, the others from out[n_masked] on, each in walk
  // order (first key descending).
  unsigned pos = 0;  // packed (masked written) + (others written) << 16, before this chunk
  const int n_masked = masked[(long long)r.z * a.n_heads * a.n_qblocks + r.row];
  walk_listed(a, r, [&](const LaneTiles& t) {
    const unsigned mine = packed_counts(t);
    unsigned incl = mine;  // inclusive prefix over lanes: lower lanes hold higher blocks, so they go first
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += y;
    }
    const unsigned p = pos + incl - mine;
    int pm = (int)(p & 0xffffu), pu = (int)(p >> 16);
    if (t.cut) {
      const int e = (t.cut_start << 8) | (1 << a.key_shift);
      if (t.cut_masked) out[pm++] = e;
      else out[n_masked + pu++] = e;
    }
    if (t.bottom) {
      const int e = (t.bottom_start << 8) | t.bottom_len;
      if (t.bottom_masked) out[pm] = e;
      else out[n_masked + pu] = e;
    }
    pos += __shfl_sync(0xffffffffu, incl, 31);
  });
}
