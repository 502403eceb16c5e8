// SIFT block-sparse attention forward for Hopper (sm_90a): TMA + mbarrier ring + warp-specialised WGMMA.
//
// Query block m covers rows [q_start[m], q_start[m] + q_len[m]), q_len <= BLOCK_M, per prompt (SPEC §6 v2), shared
// by every layer and head. A row (query head h, query block m) lists its key tiles as the CSR row
//     entries[offsets[h * (M + 1) + m] .. offsets[h * (M + 1) + m + 1])
// of packed entries (first key << 8) | key count, count <= KEY_BLOCK: the row's KV blocks, runs of consecutive
// blocks re-cut into full tiles (kernels/coalesce.cu), in canonical order: first every tile that needs a mask
// (partial, count < KEY_BLOCK, or reaching past the row block's first row), then the rest, each group by first
// key descending (coalesce.cu emits exactly this order; the kernel checks it and traps on a list that breaks it).
//
// Work: a virtual tile is one row, or one part of a row cut for split-KV (parts of a long row run in different
// CTAs; each stores its unnormalised O, max and sum in a workspace and the last part to finish merges them all,
// in part order). Persistent CTAs (grid <= #SMs) take virtual tiles from a dynamic scheduler: an atomic counter
// over `tile_order` (longest first) or, without it, query blocks descending with heads fastest. The counters
// (`sched`, `arrivals`) are zero on entry and left zero on exit, so launches and graph replays need no reset.
//
// Warpgroup 0 is the producer (it gives its registers away with setmaxnreg): warp 1 schedules, staging each
// tile's list as packed (key start, key count) entries in shared memory, TILE_SLOTS tiles ahead; lane 0 of warp 0
// loads, through TMA, the tile's Q (at the block's first row, into one of two Q buffers) and each listed K and V
// block (at the block's first key, any row) into a STAGES-deep ring. With PAIR, a pipeline step gathers two 64-key
// table blocks into the two halves of a 128-key tile. Warpgroups 1 (and 2, with BLOCK_M 128) are consumers, each
// owning 64 query rows. Per step a consumer warpgroup issues
//     S = Q K^T      (wgmma m64nBNk16, A and B from shared memory, fp32 accumulators in registers)
//     O += P V       (wgmma m64nDk16, A = P from registers as bf16, B = V from shared memory, MN-major)
// with the QK^T of step j+1 issued before the softmax of step j finishes (intra-warpgroup overlap; with OVERLAP
// across tiles too: the next tile's first QK^T goes with this tile's last PV), and an fp32 online softmax in
// the log2 domain (scores pre-scaled by scale*log2(e), ex2.approx). Masked steps keep key <= min(row, the key's
// block end): causality, and keys past a partial block's end (which TMA reads from the
// next segment) never enter the softmax. Rows of the tile past q_len (the next segment's) or past L are
// computed and not stored; the output is written through (row, head) strides, e.g. straight into [L, H, D].
//
// No CUDA headers, so NVRTC needs none: bf16 is raw 16-bit, conversions are PTX; the one #include is
// kernels/split_row.cuh, shared with decode.cu.
// Compile-time parameters (macros): HEAD_DIM in {64, 128}, BLOCK_N in {64, 128} (keys per step), STAGES >= 1,
// PAIR (BLOCK_N 128 over 64-key table blocks), BLOCK_M in {64, 128}, TILE_SLOTS, OVERLAP. Grid: min(#tiles,
// #SMs x CTAs per SM), 128 x (1 + BLOCK_M / 64) threads; dynamic shared memory:
// sift_cli.cuda.attention.attention_smem_bytes. Diagnostic builds only (experiments, never the backend): ABLATE_*
// remove a stage (wrong results, timing only), TRACE records clock stamps.

#include "split_row.cuh"

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef STAGES
#define STAGES 2
#endif
// BLOCK_M: query rows per tile, 64 per consumer warpgroup. 128: two consumer warpgroups in pingpong, one CTA per
// SM. 64: one consumer warpgroup, two CTAs per SM (the other CTA's GEMMs overlap this one's softmax, prologue and
// epilogue), which lets query blocks follow 64-token tile rows exactly.
#ifndef BLOCK_M
#define BLOCK_M 128
#endif
#if (BLOCK_M != 64 && BLOCK_M != 128)
#error "BLOCK_M must be 64 or 128"
#endif
#define CONSUMER_WGS (BLOCK_M / 64)
#define NUM_THREADS (128 * (1 + CONSUMER_WGS))
#define CONSUMERS (128 * CONSUMER_WGS)
#define MIN_CTAS (3 - CONSUMER_WGS)  // CTAs per SM the registers are budgeted for
// Registers per thread after setmaxnreg: the producer gives what it does not need to its CTA's consumers
// (40 + 2 x 232 = 3 x 168 with one CTA per SM; 40 + 216 = 2 x 128 with two).
#define PRODUCER_REGS 40
#define CONSUMER_REGS (BLOCK_M == 128 ? 232 : 216)

#if (HEAD_DIM != 64 && HEAD_DIM != 128)
#error "HEAD_DIM must be 64 or 128"
#endif
#if (BLOCK_N != 64 && BLOCK_N != 128)
#error "BLOCK_N must be 64 or 128"
#endif
// PAIR: the table's KV blocks are 64 keys wide and each pipeline step gathers two of them (any rows) into one
// 128-key tile, so 64-token sparsity runs at the 128-wide tile's efficiency.
#ifndef PAIR
#define PAIR 0
#endif
#if PAIR && BLOCK_N != 128
#error "PAIR gathers two 64-key blocks into a 128-key tile: BLOCK_N must be 128"
#endif
// TILE_SLOTS: tiles the scheduler stages ahead of the consumers (each slot holds one tile's list).
#ifndef TILE_SLOTS
#define TILE_SLOTS 3
#endif
// OVERLAP: a consumer warpgroup issues the next tile's first Q K^T together with this tile's last P V and runs its
// softmax while that P V is in flight, then stores this tile (instead of a bubble of one Q K^T and one softmax per
// tile). Taken when both tiles have at least two pipeline steps. On where it measured no slower (H200, 16K tokens,
// against the kernel without it in one process, two runs: 128-row tiles 0.99-1.09x on sparse layouts and
// 0.97-1.07x dense; 64-row tiles with 64-key steps 0.99-1.05x); 64-row tiles with 128-key steps keep the plain
// order (0.93-1.09x with it).
#ifndef OVERLAP
#define OVERLAP (BLOCK_M == 128 || BLOCK_N == 64)
#endif
#define KEY_BLOCK (PAIR ? BLOCK_N / 2 : BLOCK_N)  // width of the table's KV blocks
#define PER_STEP (PAIR ? 2 : 1)                   // list entries per pipeline step

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

// Same size and alignment as CUtensorMap (cuda.h), filled on the host by cuTensorMapEncodeTiled.
struct __align__(64) TmaDesc { u64 opaque[16]; };

#define Q_BYTES (BLOCK_M * HEAD_DIM * 2)
#define KV_BYTES (BLOCK_N * HEAD_DIM * 2)
#define CHUNK_Q (BLOCK_M * 128)   // one 64-column (128-byte) slab of the Q tile
#define CHUNK_KV (BLOCK_N * 128)  // one 64-column slab of a K or V tile

// ----------------------------------------------------------------------------------------------------------
// PTX helpers
// ----------------------------------------------------------------------------------------------------------
__device__ __forceinline__ u32 smem_addr(const void* p) {
  u32 r;
  asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n.reg .pred p;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_LOOP;\n}\n"
      ::"r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDesc* map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
      ::"r"(dst), "l"((u64)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
}
__device__ __forceinline__ void prefetch_tma_desc(const TmaDesc* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"((u64)map) : "memory");
}

// The loader's half of one pipeline step, for K or for V: wait until the ring slot is free, then load the step's
// keys into it through TMA (with PAIR, the block at key k0 into the tile's first half, the one at k1 into its
// second half; without, k1 is unused).
__device__ __forceinline__ void load_kv_step(u32 dst, const TmaDesc* map, u32 empty, u32 full, u32 phase, int k0,
                                             int k1, int head) {
  mbar_wait(empty, phase ^ 1);
  mbar_expect_tx(full, KV_BYTES);
#pragma unroll
  for (int c = 0; c < HEAD_DIM / 64; ++c) {
    tma_load_3d(dst + c * CHUNK_KV, map, full, c * 64, k0, head);
#if PAIR
    tma_load_3d(dst + c * CHUNK_KV + KEY_BLOCK * 128, map, full, c * 64, k1, head);
#endif
  }
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

// Keep the compiler from moving register reads/writes across wgmma issue/wait points.
template <int N>
__device__ __forceinline__ void fence_regs(float* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_regs_u(u32* r) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Named barriers 1 and 2 order the two consumer warpgroups' GEMM issue (FA3's "pingpong"): a warpgroup waits
// for its turn, issues its wgmmas, then hands the turn to the other, so one's softmax overlaps the other's GEMMs.
#ifndef PINGPONG
#define PINGPONG (CONSUMER_WGS == 2)
#endif
#if PINGPONG && CONSUMER_WGS != 2
#error "PINGPONG takes turns between two consumer warpgroups (BLOCK_M 128)"
#endif
__device__ __forceinline__ void sched_wait(int cw) {
#if PINGPONG
  asm volatile("bar.sync %0, 256;" ::"r"(1 + cw) : "memory");
#endif
}
__device__ __forceinline__ void sched_pass(int cw) {
#if PINGPONG
  asm volatile("bar.arrive %0, 256;" ::"r"(2 - cw) : "memory");
#endif
}

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
  u32 r;  // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half, b in the lower half
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Within each quad of lanes (c = lane & 3): afterwards x[k] is what lane k of the quad held in x[c]. Two
// butterfly stages of register selects and shuffles; indices stay static, so nothing goes to local memory.
__device__ __forceinline__ void quad_transpose(u32 (&x)[4], int c) {
  const bool b0 = c & 1, b1 = c & 2;
#pragma unroll
  for (int j = 0; j < 4; j += 2) {  // partner c ^ 1 trades the entries of pairs (j, j + 1)
    const u32 recv = __shfl_xor_sync(0xffffffffu, b0 ? x[j] : x[j + 1], 1);
    if (b0) x[j] = recv; else x[j + 1] = recv;
  }
#pragma unroll
  for (int j = 0; j < 2; ++j) {  // partner c ^ 2 trades the entries of pairs (j, j + 2)
    const u32 recv = __shfl_xor_sync(0xffffffffu, b1 ? x[j] : x[j + 2], 2);
    if (b1) x[j] = recv; else x[j + 2] = recv;
  }
}

__device__ __forceinline__ void st_global_v4(void* p, const u32 (&x)[4]) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(x[0]), "r"(x[1]), "r"(x[2]), "r"(x[3])
               : "memory");
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63).
__device__ __forceinline__ u64 make_desc(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFF) >> 4) | ((u64)((lbo & 0x3FFFF) >> 4) << 16) |
         ((u64)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// ----------------------------------------------------------------------------------------------------------
// wgmma wrappers (generated: accumulator layout of m64nNk16, N/2 fp32 registers per thread)
// ----------------------------------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_ss_n64(float* d, u64 da, u64 db, int scale_d) {
  asm volatile(
    "{\n.reg .pred p;\n"
    "setp.ne.b32 p, %34, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" "}, "
    "%32, %33, p, 1, 1, 0, 0;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
    : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_ss_n128(float* d, u64 da, u64 db, int scale_d) {
  asm volatile(
    "{\n.reg .pred p;\n"
    "setp.ne.b32 p, %66, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" ", "
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" ", "
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" "}, "
    "%64, %65, p, 1, 1, 0, 0;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
    : "l"(da), "l"(db), "r"(scale_d));
}

__device__ __forceinline__ void wgmma_rs_n64(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
  asm volatile(
    "{\n.reg .pred p;\n"
    "setp.ne.b32 p, %37, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" "}, "
    "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

__device__ __forceinline__ void wgmma_rs_n128(float* d, u32 a0, u32 a1, u32 a2, u32 a3, u64 db) {
  asm volatile(
    "{\n.reg .pred p;\n"
    "setp.ne.b32 p, %69, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
    "{" "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15" ", "
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" ", "
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47" ", "
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63" "}, "
    "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
    : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db), "r"(1));
}

#if BLOCK_N == 64
#define WGMMA_QK wgmma_ss_n64
#else
#define WGMMA_QK wgmma_ss_n128
#endif
#if HEAD_DIM == 64
#define WGMMA_PV wgmma_rs_n64
#else
#define WGMMA_PV wgmma_rs_n128
#endif

// V is the B operand of P V in MN-major form (the head dim is contiguous): 8-key core groups are 1024 bytes
// apart (stride byte offset), 64-wide head-dim slabs CHUNK_KV bytes apart (leading byte offset).
// Attention-feature variants (sift_cli/attention/features.py), compiled only for the layers that have them, so
// the plain kernel is the same code: SOFTCAP 1 caps the scaled scores at SOFTCAP_VALUE (c tanh(s / c), before
// the mask); WINDOW w > 0 keeps keys key > row - w on every step (a sliding window). Sinks need no variant: the
// host rescales the output through the LSE.
#ifndef SOFTCAP
#define SOFTCAP 0
#endif
#if SOFTCAP && !defined(SOFTCAP_VALUE)
#error "SOFTCAP needs SOFTCAP_VALUE"
#endif
#ifndef WINDOW
#define WINDOW 0
#endif
#ifndef ABLATE_SOFTMAX
#define ABLATE_SOFTMAX 0
#endif
#ifndef ABLATE_PV
#define ABLATE_PV 0
#endif
#ifndef ABLATE_STORE  // timing ablation only (nothing written): no normalisation, no output or LSE stores
#define ABLATE_STORE 0
#endif
#ifndef ABLATE_SAME_KV  // timing ablation only (wrong results): every step loads the first K/V block of its head
#define ABLATE_SAME_KV 0
#endif
// Diagnostics (experiments/kernel_tile_trace.py; the clock reads perturb the kernel a little): TRACE 1 records
// per-tile timestamps in sift_trace, TRACE 2 sums the consumers' waits by kind in sift_wait.
#ifndef TRACE
#define TRACE 0
#endif
#define TRACE_CAP (1 << 16)  // per-tile records kept
#if TRACE
__device__ __forceinline__ unsigned long long trace_clock() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned long long trace_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned trace_smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
#endif
#if TRACE == 1
__device__ unsigned long long sift_trace[TRACE_CAP * 8];
__device__ unsigned int sift_trace_n;
// One record: meta (block, SM, flags, masked steps, steps), global time, then four clock64 stamps.
__device__ __forceinline__ void trace_put(unsigned long long meta, unsigned long long g, unsigned long long c0,
                                          unsigned long long c1, unsigned long long c2, unsigned long long c3) {
  const unsigned i = atomicAdd(&sift_trace_n, 1u);
  if (i >= TRACE_CAP) return;
  unsigned long long* r = sift_trace + 8ull * i;
  r[0] = meta;
  r[1] = g;
  r[2] = c0;
  r[3] = c1;
  r[4] = c2;
  r[5] = c3;
}
#endif
#if TRACE == 2
// Cycles each consumer thread waits, by kind (TW_* below), summed per warpgroup over the launch into sift_wait.
__device__ unsigned long long sift_wait[2 * 9];
#define TW_PARAM , unsigned* tw
#define TW_ARG , tw
#ifndef TRACE_WAITS  // the kinds timed (a bit mask): each costs a register the consumers may not have to spare
#define TRACE_WAITS 0xFF
#endif
#define TW_TIME(kind, ...)                                                     \
  do {                                                                         \
    const unsigned _tw0 = ((TRACE_WAITS >> (kind)) & 1) ? (unsigned)trace_clock() : 0u; \
    __VA_ARGS__;                                                               \
    if ((TRACE_WAITS >> (kind)) & 1) tw[kind] += (unsigned)trace_clock() - _tw0; \
  } while (0)
#else
#define TW_PARAM
#define TW_ARG
#define TW_TIME(kind, ...) __VA_ARGS__
#endif
// wait kinds: K tile landed, pingpong turn, V tile landed, S GEMM, P V GEMM, Q landed, tile staged, epilogue
#define TW_K 0
#define TW_TURN 1
#define TW_V 2
#define TW_S 3
#define TW_PV 4
#define TW_Q 5
#define TW_TILE 6
#define TW_STORE 7
#ifndef V_LBO
#define V_LBO CHUNK_KV
#endif
#ifndef V_SBO
#define V_SBO 1024
#endif

// S = Q K^T for one 64-row warpgroup slice: HEAD_DIM / 16 k-steps; K-major 128B-swizzled operands advance by
// 32 bytes inside a 128-byte row and by one slab every 4 steps.
__device__ __forceinline__ void issue_qk(float* s, u32 q_base, u32 k_base) {
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
    u64 da = make_desc(q_base + (kk >> 2) * CHUNK_Q + (kk & 3) * 32, 16, 1024);
    u64 db = make_desc(k_base + (kk >> 2) * CHUNK_KV + (kk & 3) * 32, 16, 1024);
    WGMMA_QK(s, da, db, kk > 0 ? 1 : 0);
  }
}

// O += P V: BLOCK_N / 16 k-steps of 16 keys (2048 bytes of V each); P from registers.
__device__ __forceinline__ void issue_pv(float* o, const u32* p, u32 v_base) {
#if ABLATE_PV  // timing ablation only (wrong results): no P V GEMM
  return;
#endif
#pragma unroll
  for (int t = 0; t < BLOCK_N / 16; ++t) {
    u64 db = make_desc(v_base + t * 2048, V_LBO, V_SBO);
    WGMMA_PV(o, p[4 * t + 0], p[4 * t + 1], p[4 * t + 2], p[4 * t + 3], db);
  }
}

// The keys of one pipeline step: tile columns 0..63 hold keys k0a.., columns 64..127 keys k0b.. (the same block
// continued when BLOCK_N = 128 without PAIR); keys past enda / endb are not in the step's blocks.
struct StepKeys {
  int k0a, enda, k0b, endb;
};

// Online softmax on one S block held as wgmma accumulators: s[4i + e], row = g (+8 for e >= 2),
// column = 8i + 2c + (e & 1); MASK keeps key <= min(row, the key's block end) (causality, and no key of a
// partial block's neighbour). Updates the running max (raw score units) and the thread-partial row sums,
// overwrites s with P = exp2(s * sl2 - m * sl2) and returns the rescale factors of the previous O.
template <bool MASK>
__device__ __forceinline__ void softmax_block(float* s, float& m_a, float& m_b, float& l_a, float& l_b,
                                              float& corr_a, float& corr_b, float sl2, const StepKeys& k,
                                              int row_a) {
#if ABLATE_SOFTMAX  // timing ablation only (wrong results): P = S, no max / exp / sums
  corr_a = corr_b = 1.f;
  return;
#endif
  const int c = threadIdx.x & 3;
#if SOFTCAP
  {  // raw scores s -> (c / scale) tanh(s scale / c): times scale, the capped logit (sl2 = scale log2 e)
    const float cap_in = sl2 * (1.f / ((float)(SOFTCAP_VALUE) * 1.4426950408889634f)), cap_out = 1.f / cap_in;
#pragma unroll
    for (int i = 0; i < BLOCK_N / 2; ++i) s[i] = tanh_approx(s[i] * cap_in) * cap_out;
  }
#endif
#if WINDOW
  {  // every step: keys at or before row - WINDOW leave the softmax. d = key - (row_a - WINDOW + 1), the first
     // key row_a keeps; row_a + 8 keeps keys from d = 8 on
    const int d0 = k.k0a + 2 * c - row_a + (WINDOW - 1), d1 = k.k0b + 2 * c - row_a + (WINDOW - 1);
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i) {
      const int d = (i >= 8) ? d1 + 8 * (i - 8) : d0 + 8 * i;
      if (d < 0) s[4 * i + 0] = neg_inf();
      if (d + 1 < 0) s[4 * i + 1] = neg_inf();
      if (d < 8) s[4 * i + 2] = neg_inf();
      if (d + 1 < 8) s[4 * i + 3] = neg_inf();
    }
  }
#endif
  if (MASK) {
    const int lim_a0 = min(row_a, k.enda), lim_b0 = min(row_a + 8, k.enda);
    const int lim_a1 = min(row_a, k.endb), lim_b1 = min(row_a + 8, k.endb);
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i) {
      const bool hi = i >= 8;  // compile-time after unrolling
      const int key = (hi ? k.k0b + 8 * (i - 8) : k.k0a + 8 * i) + 2 * c;
      const int lim_a = hi ? lim_a1 : lim_a0, lim_b = hi ? lim_b1 : lim_b0;
      if (key > lim_a) s[4 * i + 0] = neg_inf();
      if (key + 1 > lim_a) s[4 * i + 1] = neg_inf();
      if (key > lim_b) s[4 * i + 2] = neg_inf();
      if (key + 1 > lim_b) s[4 * i + 3] = neg_inf();
    }
  }
  float mx_a = m_a, mx_b = m_b;
#pragma unroll
  for (int i = 0; i < BLOCK_N / 8; ++i) {
    mx_a = fmaxf(mx_a, fmaxf(s[4 * i + 0], s[4 * i + 1]));
    mx_b = fmaxf(mx_b, fmaxf(s[4 * i + 2], s[4 * i + 3]));
  }
  mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
  mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
  mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
  mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
  // A row that has seen no key yet keeps max -inf; use 0 as its offset so exp2 gives 0, not NaN.
  const float ms_a = (mx_a == neg_inf()) ? 0.f : mx_a * sl2;
  const float ms_b = (mx_b == neg_inf()) ? 0.f : mx_b * sl2;
  corr_a = ex2(m_a * sl2 - ms_a);
  corr_b = ex2(m_b * sl2 - ms_b);
  m_a = mx_a;
  m_b = mx_b;
  float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
  for (int i = 0; i < BLOCK_N / 8; ++i) {
    s[4 * i + 0] = ex2(fmaf(s[4 * i + 0], sl2, -ms_a));
    s[4 * i + 1] = ex2(fmaf(s[4 * i + 1], sl2, -ms_a));
    s[4 * i + 2] = ex2(fmaf(s[4 * i + 2], sl2, -ms_b));
    s[4 * i + 3] = ex2(fmaf(s[4 * i + 3], sl2, -ms_b));
    sum_a += s[4 * i + 0] + s[4 * i + 1];
    sum_b += s[4 * i + 2] + s[4 * i + 3];
  }
  l_a = l_a * corr_a + sum_a;
  l_b = l_b * corr_b + sum_b;
}

// P (fp32 accumulator layout) -> bf16 A-operand fragments, 4 registers per 16 keys.
__device__ __forceinline__ void convert_p(const float* s, u32* p) {
#pragma unroll
  for (int t = 0; t < BLOCK_N / 16; ++t) {
    p[4 * t + 0] = pack_bf16(s[8 * t + 0], s[8 * t + 1]);
    p[4 * t + 1] = pack_bf16(s[8 * t + 2], s[8 * t + 3]);
    p[4 * t + 2] = pack_bf16(s[8 * t + 4], s[8 * t + 5]);
    p[4 * t + 3] = pack_bf16(s[8 * t + 6], s[8 * t + 7]);
  }
}

__device__ __forceinline__ void rescale_o(float* o, float corr_a, float corr_b) {
#pragma unroll
  for (int i = 0; i < HEAD_DIM / 8; ++i) {
    o[4 * i + 0] *= corr_a;
    o[4 * i + 1] *= corr_a;
    o[4 * i + 2] *= corr_b;
    o[4 * i + 3] *= corr_b;
  }
}

// Shared-memory barriers, after the two Q buffers and the K/V rings (8 bytes each).
#define FULL_Q(i) (sBar + 8u * (i))                        // Q buffer i is loaded
#define Q_EMPTY(i) (sBar + 8u * (2 + (i)))                 // the consumers are done with Q buffer i
#define FULL_K(s) (sBar + 8u * (4 + (s)))
#define FULL_V(s) (sBar + 8u * (4 + STAGES + (s)))
#define EMPTY_K(s) (sBar + 8u * (4 + 2 * STAGES + (s)))
#define EMPTY_V(s) (sBar + 8u * (4 + 3 * STAGES + (s)))
#define TILE_FULL(i) (sBar + 8u * (4 + 4 * STAGES + (i)))  // a tile and its list are staged in slot i
#define TILE_EMPTY(i) (sBar + 8u * (4 + 4 * STAGES + TILE_SLOTS + (i)))  // loader and consumers are done with slot i
#define N_BARRIERS (4 + 4 * STAGES + 2 * TILE_SLOTS)

// A staged tile: head (-1: no more tiles), list length, how many listed blocks need the mask (a prefix of the
// list), first row and row count of its query block, which split of its row it is and of how many, and the row.
struct TileInfo {
  int h, n, n_mask, q0, qn, split, n_splits, row;
};

// All consumer threads (named barrier 3; 1 and 2 are the pingpong turns).
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 3, %0;" ::"n"(CONSUMERS) : "memory"); }

// True when block (k0, kn) needs the masked softmax in a tile whose first row is q0: partial, or its last key
// lies past q0. The same predicate orders the lists (sift_cli's builders), so these blocks are a prefix.
__device__ __forceinline__ bool needs_mask(int k0, int kn, int q0) {
  return (int)(kn < KEY_BLOCK) | (int)(k0 + KEY_BLOCK - 1 > q0);  // no short-circuit branch near wgmmas (C7513)
}

// The keys of pipeline step j of a staged list of n entries, broadcast from lane 0 (they steer control flow).
// A staged list entry packs a block's first key and key count: (start << 8) | count (count <= 128).
__device__ __forceinline__ int entry_start(int e) { return e >> 8; }
__device__ __forceinline__ int entry_count(int e) { return e & 255; }

__device__ __forceinline__ StepKeys step_keys(const int* lst, int j, int n) {
  const int a = __shfl_sync(0xffffffffu, lst[PER_STEP * j], 0);
  StepKeys k;
  k.k0a = entry_start(a);
  k.enda = k.k0a + entry_count(a) - 1;
#if PAIR
  if (2 * j + 1 < n) {
    const int b = __shfl_sync(0xffffffffu, lst[2 * j + 1], 0);
    k.k0b = entry_start(b);
    k.endb = k.k0b + entry_count(b) - 1;
  } else {  // a lone last block: the second half is loaded from the same rows and masked out entirely
    k.k0b = k.k0a;
    k.endb = k.k0a - 1;
  }
#else
  k.k0b = k.k0a + 64;
  k.endb = k.enda;
#endif
  return k;
}

// O *= corr, then O += P V from ring slot vstage once its V tile has landed (issued, not waited for).
__device__ __forceinline__ void issue_pv_step(float* o, u32* p, float corr_a, float corr_b, u32 sV, u32 sBar,
                                              int vstage, u32 vphase TW_PARAM) {
  rescale_o(o, corr_a, corr_b);
  TW_TIME(TW_V, mbar_wait(FULL_V(vstage), vphase));
  fence_regs<HEAD_DIM / 2>(o);
  fence_regs_u<BLOCK_N / 4>(p);
  wgmma_fence();
  issue_pv(o, p, sV + vstage * KV_BYTES);
  wgmma_commit();
}

// The GEMMs of one turn: S = Q K^T into s from ring slot kstage, then the previous step's P V from slot vstage,
// each once its tiles have landed; the warpgroup takes its pingpong turn before issuing.
__device__ __forceinline__ void issue_turn(float* s, float* o, u32* p, float corr_a, float corr_b, u32 q_base,
                                           u32 sK, u32 sV, u32 sBar, int kstage, u32 kphase, int vstage, u32 vphase,
                                           int cw TW_PARAM) {
  TW_TIME(TW_K, mbar_wait(FULL_K(kstage), kphase));
  TW_TIME(TW_TURN, sched_wait(cw));
  fence_regs<BLOCK_N / 2>(s);
  wgmma_fence();
  issue_qk(s, q_base, sK + kstage * KV_BYTES);
  wgmma_commit();
  issue_pv_step(o, p, corr_a, corr_b, sV, sBar, vstage, vphase TW_ARG);
}

// The ring slot after (stage, phase): the phase flips each time the ring wraps.
__device__ __forceinline__ void next_slot(int& stage, u32& phase) {
  if (++stage == STAGES) {
    stage = 0;
    phase ^= 1;
  }
}

// One turn of the FA3 order, the part every step shares: issue S = Q K^T into s from ring slot (kstage, kphase)
// and O *= corr, O += P V from slot (vstage, vphase); hand the pingpong turn over if pass; wait for S, release its
// K slot (and this Q buffer if release_q); softmax<MASK> of S with the softmax state, keys and first row given,
// into corr and P (converted into p_next: p is still read by the P V wgmma); wait for the P V, release its V slot.
template <bool MASK>
__device__ __forceinline__ void pipelined_turn(float* s, float* o, u32* p, u32* p_next, float& m_a, float& m_b,
                                               float& l_a, float& l_b, float& corr_a, float& corr_b, float sl2,
                                               const StepKeys& keys, int row_a, u32 q_base, u32 sK, u32 sV, u32 sBar,
                                               int kstage, u32 kphase, int vstage, u32 vphase, int cw, bool pass,
                                               bool release_q, u32 q_empty TW_PARAM) {
  issue_turn(s, o, p, corr_a, corr_b, q_base, sK, sV, sBar, kstage, kphase, vstage, vphase, cw TW_ARG);
  if (pass) sched_pass(cw);
  TW_TIME(TW_S, wgmma_wait<1>());
  fence_regs<BLOCK_N / 2>(s);
  mbar_arrive(EMPTY_K(kstage));
  if (release_q) mbar_arrive(q_empty);
  softmax_block<MASK>(s, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, keys, row_a);
  convert_p(s, p_next);
  TW_TIME(TW_PV, wgmma_wait<0>());
  fence_regs<HEAD_DIM / 2>(o);
  fence_regs_u<BLOCK_N / 4>(p);
  mbar_arrive(EMPTY_V(vstage));
}

// One pipelined step j >= 1 of a consumer warpgroup (the FA3 order):
//   issue S_j = Q K_j^T;  O *= corr_{j-1};  issue O += P_{j-1} V_{j-1};  wait for S_j;  softmax(S_j) -> corr_j and
//   P_j (converted into a staging set, since the registers of P_{j-1} are still being read by the P V wgmma);
//   wait for P V;  P <- staging.
// Nothing in the softmax touches a register of an in-flight wgmma, so ptxas has no reason to hoist the wait.
// (stage, phase) name the ring slot of step j - 1 on entry and of step j on return; keys holds step j's keys
// on entry and step j + 1's on return. n: steps in the tile; n_entries: list entries.
template <bool MASK>
__device__ __forceinline__ void mainloop_step(float* s, float* o, u32* p, float& m_a, float& m_b, float& l_a,
                                              float& l_b, float& corr_a, float& corr_b, float sl2, int row_a,
                                              u32 q_base, u32 sK, u32 sV, u32 sBar, int& stage, u32& phase,
                                              StepKeys& keys, const int* lst, int j, int n, int n_entries, int cw,
                                              u32 q_empty, bool pass_last TW_PARAM) {
  const StepKeys cur = keys;
  if (j + 1 < n) keys = step_keys(lst, j + 1, n_entries);
  int nstage = stage;
  u32 nphase = phase;
  next_slot(nstage, nphase);
  u32 p_next[BLOCK_N / 4];
  // Warpgroup 1 skips its last hand-over of a tile unless the next tile's first step follows in turn (pass_last):
  // otherwise nobody would wait for it (a tile that starts afresh opens with warpgroup 1's hand-over). After the
  // tile's last Q K^T the loader may refill its Q buffer.
  pipelined_turn<MASK>(s, o, p, p_next, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, cur, row_a, q_base, sK, sV, sBar,
                       nstage, nphase, stage, phase, cw, cw == 0 || j + 1 < n || pass_last, j + 1 == n,
                       q_empty TW_ARG);
#pragma unroll
  for (int i = 0; i < BLOCK_N / 4; ++i) p[i] = p_next[i];
  stage = nstage;
  phase = nphase;
}

// The Q buffer of a consumer's next non-empty tile, once loaded: its rows for warpgroup cw and its empty barrier.
__device__ __forceinline__ void take_q(u32 sQ, u32 sBar, int cw, int& q_uses, u32& q_base, u32& q_empty TW_PARAM) {
  const int qb = q_uses & 1;
  q_base = sQ + qb * Q_BYTES + cw * 64 * 128;
  q_empty = Q_EMPTY(qb);
  TW_TIME(TW_Q, mbar_wait(FULL_Q(qb), (q_uses >> 1) & 1));
  ++q_uses;
}

// A staged tile as the consumers see it (warp-uniform values) and the slot it is staged in.
struct TileMeta {
  int h, n, n_mask, q0, q_end, split, n_splits, row_id, slot;
};

__device__ __forceinline__ TileMeta read_tile(const TileInfo* info, u32 sBar, int it, int seq_len TW_PARAM) {
  TileMeta t;
  t.slot = it % TILE_SLOTS;
  TW_TIME(TW_TILE, mbar_wait(TILE_FULL(t.slot), (it / TILE_SLOTS) & 1));
  const TileInfo ti = info[t.slot];
  t.h = __shfl_sync(0xffffffffu, ti.h, 0);
  t.n = __shfl_sync(0xffffffffu, ti.n, 0);
  t.n_mask = __shfl_sync(0xffffffffu, ti.n_mask, 0);
  t.q0 = __shfl_sync(0xffffffffu, ti.q0, 0);
  t.q_end = min(t.q0 + __shfl_sync(0xffffffffu, ti.qn, 0), seq_len);  // rows stored: [q0, q_end)
  t.split = __shfl_sync(0xffffffffu, ti.split, 0);
  t.n_splits = __shfl_sync(0xffffffffu, ti.n_splits, 0);
  t.row_id = __shfl_sync(0xffffffffu, ti.row, 0);
  return t;
}

// Where the epilogue writes.
struct Outputs {
  bf16_t* out;
  long long out_row_stride, out_head_stride;
  float* lse;
  int write_lse, seq_len;
  const int* split_slot;
  float* ws;
  int* arrivals;
  volatile int* last_flag;
};

// The epilogue of one tile for this thread's rows row_a and row_a + 8: normalise and store O (bf16) and the
// natural-log LSE; or, for one part of a split row, store the part's unnormalised O, max and sum in the workspace,
// and if it is the last part to finish, merge every part in part order and store the row.
__device__ __forceinline__ void store_tile(float* o, float m_a, float m_b, float l_a, float l_b, float sl2,
                                           const TileMeta& t, int row_a, const Outputs& w) {
  const int c = threadIdx.x & 3;
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  if (t.n_splits > 1) {
    const int ra = row_a - t.q0, rb = ra + 8;       // rows inside the query block
    const long long slot0 = w.split_slot[t.row_id];  // this row's parts: workspace slots slot0 .. + n_splits - 1
    float* mine = w.ws + (slot0 + t.split) * (BLOCK_M * (HEAD_DIM + 2));
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 8; ++i) {
      *reinterpret_cast<float2*>(mine + ra * HEAD_DIM + 8 * i + 2 * c) = make_float2(o[4 * i + 0], o[4 * i + 1]);
      *reinterpret_cast<float2*>(mine + rb * HEAD_DIM + 8 * i + 2 * c) = make_float2(o[4 * i + 2], o[4 * i + 3]);
    }
    if (c == 0) {
      mine[BLOCK_M * HEAD_DIM + ra] = m_a;
      mine[BLOCK_M * HEAD_DIM + rb] = m_b;
      mine[BLOCK_M * HEAD_DIM + BLOCK_M + ra] = l_a;
      mine[BLOCK_M * HEAD_DIM + BLOCK_M + rb] = l_b;
    }
    __threadfence();
    consumers_sync();
    if (threadIdx.x == 128) {
      const int prev = atomicAdd(w.arrivals + t.row_id, 1);
      const int last = (prev == t.n_splits - 1);
      if (last) w.arrivals[t.row_id] = 0;  // ready for the next launch
      *w.last_flag = last;
    }
    consumers_sync();
    // (thread 128 writes the flag again only after every consumer has passed the first barrier of a later tile)
    if (!*w.last_flag) return;
    // Merge every part, this one's too, in part order: the result does not depend on which part came last.
    __threadfence();
    m_a = m_b = neg_inf();
    l_a = l_b = 0.f;
#pragma unroll
    for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
    for (int sp = 0; sp < t.n_splits; ++sp) {
      const float* part = w.ws + (slot0 + sp) * (BLOCK_M * (HEAD_DIM + 2));
      const float m2a = __ldcg(part + BLOCK_M * HEAD_DIM + ra), m2b = __ldcg(part + BLOCK_M * HEAD_DIM + rb);
      const float l2a = __ldcg(part + BLOCK_M * HEAD_DIM + BLOCK_M + ra);
      const float l2b = __ldcg(part + BLOCK_M * HEAD_DIM + BLOCK_M + rb);
      const float mxa = fmaxf(m_a, m2a), mxb = fmaxf(m_b, m2b);
      const float offa = (mxa == neg_inf()) ? 0.f : mxa * sl2, offb = (mxb == neg_inf()) ? 0.f : mxb * sl2;
      const float fa = ex2(m_a * sl2 - offa), f2a = ex2(m2a * sl2 - offa);
      const float fb = ex2(m_b * sl2 - offb), f2b = ex2(m2b * sl2 - offb);
#pragma unroll
      for (int i = 0; i < HEAD_DIM / 8; ++i) {
        const float2 xa = __ldcg(reinterpret_cast<const float2*>(part + ra * HEAD_DIM + 8 * i + 2 * c));
        const float2 xb = __ldcg(reinterpret_cast<const float2*>(part + rb * HEAD_DIM + 8 * i + 2 * c));
        o[4 * i + 0] = o[4 * i + 0] * fa + xa.x * f2a;
        o[4 * i + 1] = o[4 * i + 1] * fa + xa.y * f2a;
        o[4 * i + 2] = o[4 * i + 2] * fb + xb.x * f2b;
        o[4 * i + 3] = o[4 * i + 3] * fb + xb.y * f2b;
      }
      l_a = l_a * fa + l2a * f2a;
      l_b = l_b * fb + l2b * f2b;
      m_a = mxa;
      m_b = mxb;
    }
  }
#if ABLATE_STORE
  return;
#endif
  const float inv_a = (l_a > 0.f) ? 1.f / l_a : 0.f;
  const float inv_b = (l_b > 0.f) ? 1.f / l_b : 0.f;
  const int row_b = row_a + 8;
  // A thread holds columns 8i + 2c, 8i + 2c + 1 of its rows for every 8-column group i. Per 32 columns, a quad
  // transpose gives lane c all 8 columns of group 4r + c, written as one 16-byte store (the host keeps the
  // output 16-byte aligned): four times fewer stores than one per group, each warp store filling whole sectors.
  bf16_t* out_h = w.out + (long long)t.h * w.out_head_stride + 8 * c;
  bf16_t* dst_a = out_h + (long long)row_a * w.out_row_stride;
  bf16_t* dst_b = out_h + (long long)row_b * w.out_row_stride;
#pragma unroll
  for (int r = 0; r < HEAD_DIM / 32; ++r) {
    u32 xa[4], xb[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int i = 4 * r + j;
      xa[j] = pack_bf16(o[4 * i + 0] * inv_a, o[4 * i + 1] * inv_a);
      xb[j] = pack_bf16(o[4 * i + 2] * inv_b, o[4 * i + 3] * inv_b);
    }
    quad_transpose(xa, c);
    quad_transpose(xb, c);
    if (row_a < t.q_end) st_global_v4(dst_a + 32 * r, xa);
    if (row_b < t.q_end) st_global_v4(dst_b + 32 * r, xb);
  }
  if (w.write_lse && c == 0) {
    const float ln2 = 0.6931471805599453f;
    if (row_a < t.q_end)
      w.lse[(long long)t.h * w.seq_len + row_a] = (l_a > 0.f) ? (m_a * sl2 + lg2(l_a)) * ln2 : neg_inf();
    if (row_b < t.q_end)
      w.lse[(long long)t.h * w.seq_len + row_b] = (l_b > 0.f) ? (m_b * sl2 + lg2(l_b)) * ln2 : neg_inf();
  }
}

// ----------------------------------------------------------------------------------------------------------
// The kernel
// ----------------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(NUM_THREADS, MIN_CTAS)
sift_sparse_attn_fwd(const __grid_constant__ TmaDesc tmap_q, const __grid_constant__ TmaDesc tmap_k,
                     const __grid_constant__ TmaDesc tmap_v, bf16_t* __restrict__ out, long long out_row_stride,
                     long long out_head_stride, float* __restrict__ lse, const int* __restrict__ offsets,
                     const int* __restrict__ entries, const int* __restrict__ q_start,
                     const int* __restrict__ q_len, const int* __restrict__ tile_order,
                     const int* __restrict__ n_active, const int* __restrict__ split_cap, int split_max,
                     const int* __restrict__ split_slot, float* __restrict__ ws, int* __restrict__ arrivals,
                     int* __restrict__ sched, int seq_len,
                     int n_heads, int group, int n_qblocks, int list_cap, float scale_log2, int write_lse) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 raw = smem_addr(smem_raw);
  const u32 base = (raw + 1023u) & ~1023u;  // 128B swizzle atoms need 1024-byte alignment
  const u32 sQ = base;                      // two Q buffers: the next tile's Q loads while this one runs
  const u32 sK = sQ + 2 * Q_BYTES;
  const u32 sV = sK + STAGES * KV_BYTES;
  const u32 sBar = sV + STAGES * KV_BYTES;
  // Tile slots and their lists, addressed as ordinary pointers (the consumers read them with ld.shared).
  const u32 info_off = ((sBar + 8u * N_BARRIERS + 15u) & ~15u) - raw;
  TileInfo* info = reinterpret_cast<TileInfo*>(smem_raw + info_off);
  volatile int* last_flag = reinterpret_cast<volatile int*>(smem_raw + info_off + TILE_SLOTS * sizeof(TileInfo));
  int* lists = reinterpret_cast<int*>(smem_raw + info_off + TILE_SLOTS * sizeof(TileInfo) + 16);
  const int tid = threadIdx.x;
  // Broadcast from lane 0: ptxas then knows values are warp-uniform, so branches on them are not divergent.
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);
  const int warp_id = __shfl_sync(0xffffffffu, tid >> 5, 0);

  if (tid == 0) {
    prefetch_tma_desc(&tmap_q);
    prefetch_tma_desc(&tmap_k);
    prefetch_tma_desc(&tmap_v);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mbar_init(FULL_Q(i), 1);
      mbar_init(Q_EMPTY(i), CONSUMERS);
    }
#pragma unroll
    for (int i = 0; i < TILE_SLOTS; ++i) {
      mbar_init(TILE_FULL(i), 32);
      mbar_init(TILE_EMPTY(i), CONSUMERS + 1);
    }
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(FULL_K(s), 1);
      mbar_init(FULL_V(s), 1);
      mbar_init(EMPTY_K(s), CONSUMERS);
      mbar_init(EMPTY_V(s), CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer warpgroup: warp 1 schedules, lane 0 of warp 0 loads, warps 2-3 only give
    // their registers away ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS) : "memory");
    if (warp_id == 1) {
      // Scheduler: takes tiles (blockIdx.x first, then the atomic counter) and stages each one's list of
      // (key start, key count) entries in a free slot, up to TILE_SLOTS tiles ahead of the consumers.
      const int lane = tid & 31;
      // Virtual tiles v = row * split_max + split, row = h * M + m; n_active of them are non-empty, taken in
      // tile_order (or, without one and without splits, query blocks descending with heads fastest).
      const int n_tiles = (n_active != nullptr) ? *n_active : n_heads * n_qblocks;
      const int cap = (split_cap != nullptr) ? max(1, *split_cap) : 1 << 30;
      int tile = blockIdx.x;
      for (int it = 0;; ++it) {
        const int slot = it % TILE_SLOTS;
        mbar_wait(TILE_EMPTY(slot), ((it / TILE_SLOTS) & 1) ^ 1);
        int next = 0;
        if (lane == 0 && tile < n_tiles) next = (int)gridDim.x + atomicAdd(sched, 1);  // waited for at the end
        int h = -1;
        if (tile < n_tiles) {
          int v;
          if (tile_order != nullptr) {
            v = tile_order[tile];
          } else {  // query blocks descending, heads fastest: the longest causal rows first
            v = ((tile % n_heads) * n_qblocks + (n_qblocks - 1 - tile / n_heads)) * split_max;
          }
          const int row = v / split_max, split = v - row * split_max;
          h = row / n_qblocks;
          const int m = row - h * n_qblocks;
          const int row_start = offsets[h * (n_qblocks + 1) + m];
          const int n_row = offsets[h * (n_qblocks + 1) + m + 1] - row_start;
          int n_splits, chunk;
          split_row(n_row, cap, split_max, PER_STEP, n_splits, chunk);
          const int start = row_start + split * chunk;
          const int n = max(0, min(chunk, n_row - split * chunk));
          const int q0 = q_start[m];
          int* lst = lists + slot * list_cap;
          // The blocks that need the mask must be the list's prefix (canonical order), else trap: a list in
          // another order would be computed wrong, so it fails loudly instead.
          int n_mask = 0;
          bool tail = false;  // an entry that needs no mask has been seen
          for (int i0 = 0; i0 < n; i0 += 32) {
            const int i = i0 + lane;
            bool msk = false;
            if (i < n) {
              const int e = entries[start + i];
              lst[i] = e;
              msk = needs_mask(entry_start(e), entry_count(e), q0);
            }
            const unsigned b = __ballot_sync(0xffffffffu, msk);
            const unsigned valid = __ballot_sync(0xffffffffu, i < n);
            if ((b & (b + 1u)) != 0u || (tail && b != 0u)) asm volatile("trap;");
            tail = tail || (b != valid);
            n_mask += __popc(b);
          }
          if (lane == 0) info[slot] = TileInfo{h, n, n_mask, q0, q_len[m], split, n_splits, row};
        } else if (lane == 0) {
          info[slot] = TileInfo{-1, 0, 0, 0, 0, 0, 0, 0};
        }
        __syncwarp();
        mbar_arrive(TILE_FULL(slot));  // release: the slot and its list are visible to the loader and consumers
        if (h < 0) break;
        tile = __shfl_sync(0xffffffffu, next, 0);
      }
      // Every atomic on sched[0] by this CTA is done; the last CTA out sets the counters back to zero.
      if (lane == 0) {
        __threadfence();
        if (atomicAdd(sched + 1, 1) == (int)gridDim.x - 1) {
          sched[0] = 0;
          sched[1] = 0;
        }
      }
    } else if (tid == 0) {
      // Loader: TMA loads of each staged tile's Q (into the free Q buffer) and of its K/V blocks into the ring.
      int stage = 0, q_uses = 0;
      u32 phase = 0;
      for (int it = 0;; ++it) {
        const int slot = it % TILE_SLOTS;
        mbar_wait(TILE_FULL(slot), (it / TILE_SLOTS) & 1);
        const TileInfo ti = info[slot];
        if (ti.h < 0) break;
        if (ti.n > 0) {
          const int qb = q_uses & 1;
          mbar_wait(Q_EMPTY(qb), ((q_uses >> 1) & 1) ^ 1);
          mbar_expect_tx(FULL_Q(qb), Q_BYTES);
#pragma unroll
          for (int c = 0; c < HEAD_DIM / 64; ++c)
            tma_load_3d(sQ + qb * Q_BYTES + c * CHUNK_Q, &tmap_q, FULL_Q(qb), c * 64, ti.q0, ti.h);
          ++q_uses;
          const int hk = ti.h / group;
          const int* lst = lists + slot * list_cap;
#pragma unroll 1
          for (int i = 0; i < ti.n; i += PER_STEP) {
            const int k0 = ABLATE_SAME_KV ? 0 : entry_start(lst[i]);
            // with PAIR, the step's second block (a lone last block fills both halves)
            const int k1 = ABLATE_SAME_KV ? 0 : (PAIR && i + 1 < ti.n) ? entry_start(lst[i + 1]) : k0;
            load_kv_step(sK + stage * KV_BYTES, &tmap_k, EMPTY_K(stage), FULL_K(stage), phase, k0, k1, hk);
            load_kv_step(sV + stage * KV_BYTES, &tmap_v, EMPTY_V(stage), FULL_V(stage), phase, k0, k1, hk);
            next_slot(stage, phase);
          }
        }
        mbar_arrive(TILE_EMPTY(slot));  // the loader is done with this slot's list
      }
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS) : "memory");
    const int cw = wg - 1;  // which 64-row half of the query block
    const int t = tid & 127;
    const int warp = t >> 5, lane = t & 31;
    const int g = lane >> 2;
    const float sl2 = scale_log2;
    const Outputs w{out, out_row_stride, out_head_stride, lse, write_lse, seq_len, split_slot, ws, arrivals, last_flag};
    int stage = 0, q_uses = 0;  // ring slot of the next KV block to consume; tiles that used a Q buffer
    u32 phase = 0;
    float o[HEAD_DIM / 2];
    float s[BLOCK_N / 2];
    u32 p[BLOCK_N / 4];
    float m_a, m_b, l_a, l_b, corr_a, corr_b;
    u32 q_base = 0, q_empty = 0;
    StepKeys keys;
    bool entered = false;  // the tile's first step was run at the end of the previous tile (OVERLAP)
    int it = 0;
#if TRACE == 1
    const bool tracer = (t == 0 && cw == 0);
#elif TRACE == 2
    unsigned tw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const unsigned tw_start = (unsigned)trace_clock();
#endif
    TileMeta cur = read_tile(info, sBar, 0, seq_len TW_ARG);
    while (cur.h >= 0) {
#if TRACE == 1
      unsigned long long tr_g = 0, tr_c0 = 0, tr_c1 = 0, tr_c2 = 0;
      if (tracer) {
        tr_g = trace_gtime();
        tr_c0 = trace_clock();
      }
#endif
      const int* lst = lists + cur.slot * list_cap;
      const int row_a = cur.q0 + cw * 64 + warp * 16 + g;  // this thread's rows: row_a and row_a + 8
      // Steps, in list order: the masked ones first (the blocks that need a mask are the list's prefix), then
      // the unmasked ones, then, with PAIR, possibly a lone last block (its empty half is masked).
      const int n_steps = (cur.n + PER_STEP - 1) / PER_STEP;
      const int masked_end = (cur.n_mask + PER_STEP - 1) / PER_STEP;
      const int tail_start = (PAIR && (cur.n & 1) && n_steps - 1 >= masked_end) ? n_steps - 1 : n_steps;
      if (!entered) {
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
        m_a = m_b = neg_inf();
        l_a = l_b = 0.f;
        if (cur.n > 0) {
          take_q(sQ, sBar, cw, q_uses, q_base, q_empty TW_ARG);
          keys = step_keys(lst, 0, cur.n);
          if (cw == 1) sched_pass(cw);  // warpgroup 0 goes first
          TW_TIME(TW_K, mbar_wait(FULL_K(stage), phase));
          TW_TIME(TW_TURN, sched_wait(cw));
          wgmma_fence();
          issue_qk(s, q_base, sK + stage * KV_BYTES);
          wgmma_commit();
          if (cw == 0 || n_steps > 1) sched_pass(cw);
          TW_TIME(TW_S, wgmma_wait<0>());
          fence_regs<BLOCK_N / 2>(s);
          mbar_arrive(EMPTY_K(stage));
          if (n_steps == 1) mbar_arrive(q_empty);
          // Masking is decided per loop, not per step inside the pipelined body: a data-dependent branch while
          // wgmmas are in flight makes ptxas serialise them (C7520).
          if (masked_end > 0 || tail_start == 0)
            softmax_block<true>(s, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, keys, row_a);
          else
            softmax_block<false>(s, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, keys, row_a);
          convert_p(s, p);
          if (n_steps > 1) keys = step_keys(lst, 1, cur.n);
        }
      }
      // Whether the next tile's first step follows this tile's last one (both have >= 2 steps). With pingpong the
      // last step's hand-over depends on it, so the next tile is looked at before this one's steps (not just before
      // the last step: a branch choosing that step's mask lets ptxas merge the two instances' wgmma issue and
      // serialise it, C7513); with three tile slots it was staged while the tile before this one ran. Only the
      // decision stays live through the steps.
      bool overlap = false;
#if PINGPONG
      {
        const TileMeta nxt = read_tile(info, sBar, it + 1, seq_len TW_ARG);
        overlap = OVERLAP && n_steps >= 2 && nxt.h >= 0 && nxt.n > PER_STEP;
      }
#endif
      int j = 1;
      for (; j < masked_end; ++j)
        mainloop_step<true>(s, o, p, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, row_a, q_base, sK, sV, sBar, stage,
                            phase, keys, lst, j, n_steps, cur.n, cw, q_empty, overlap TW_ARG);
      for (; j < tail_start; ++j)
        mainloop_step<false>(s, o, p, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, row_a, q_base, sK, sV, sBar, stage,
                             phase, keys, lst, j, n_steps, cur.n, cw, q_empty, overlap TW_ARG);
      for (; j < n_steps; ++j)
        mainloop_step<true>(s, o, p, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, row_a, q_base, sK, sV, sBar, stage,
                            phase, keys, lst, j, n_steps, cur.n, cw, q_empty, overlap TW_ARG);
#if TRACE == 1
      if (tracer) tr_c1 = trace_clock();
#endif
      mbar_arrive(TILE_EMPTY(cur.slot));  // the list is read: the scheduler may stage a later tile here
      const TileMeta nxt = read_tile(info, sBar, it + 1, seq_len TW_ARG);  // its slot stays until the tile is done
#if !PINGPONG
      overlap = OVERLAP && n_steps >= 2 && nxt.h >= 0 && nxt.n > PER_STEP;
#endif
      float nm_a = neg_inf(), nm_b = neg_inf(), nl_a = 0.f, nl_b = 0.f;  // the next tile's softmax state
      u32 p_next[BLOCK_N / 4];
      if (overlap) {
        // The next tile's first Q K^T and this tile's last P V in one turn; the next tile's first softmax (always
        // masked: harmless on a block that needs none) runs while the P V is in flight.
        const int* nlst = lists + nxt.slot * list_cap;
        const StepKeys k0 = step_keys(nlst, 0, nxt.n);
        // this tile's last Q K^T is done: its Q is no longer read
        take_q(sQ, sBar, cw, q_uses, q_base, q_empty TW_ARG);
        int nstage = stage;
        u32 nphase = phase;
        next_slot(nstage, nphase);
        // the turn is handed over: the next tile has a second step, which follows in turn
        pipelined_turn<true>(s, o, p, p_next, nm_a, nm_b, nl_a, nl_b, corr_a, corr_b, sl2, k0,
                             nxt.q0 + cw * 64 + warp * 16 + g, q_base, sK, sV, sBar, nstage, nphase, stage, phase, cw,
                             true, false, q_empty TW_ARG);
        keys = step_keys(nlst, 1, nxt.n);
      } else if (n_steps > 0) {  // the last block's P V
        issue_pv_step(o, p, corr_a, corr_b, sV, sBar, stage, phase TW_ARG);
        TW_TIME(TW_PV, wgmma_wait<0>());
        fence_regs<HEAD_DIM / 2>(o);
        mbar_arrive(EMPTY_V(stage));
      }
      if (n_steps > 0) next_slot(stage, phase);  // the ring slot after this tile's last
#if TRACE == 1
      if (tracer) tr_c2 = trace_clock();
#endif
      TW_TIME(TW_STORE, store_tile(o, m_a, m_b, l_a, l_b, sl2, cur, row_a, w));
#if TRACE == 1
      if (tracer)
        trace_put(((unsigned long long)blockIdx.x << 40) | ((unsigned long long)trace_smid() << 32) |
                      ((unsigned long long)entered << 31) | ((unsigned long long)overlap << 30) |
                      ((unsigned long long)cur.n_mask << 15) | (unsigned long long)n_steps,
                  tr_g, tr_c0, tr_c1, tr_c2, trace_clock());
#endif
      entered = overlap;
      if (overlap) {  // the next tile goes on from its second step
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
#pragma unroll
        for (int i = 0; i < BLOCK_N / 4; ++i) p[i] = p_next[i];
        m_a = nm_a;
        m_b = nm_b;
        l_a = nl_a;
        l_b = nl_b;
      }
      cur = nxt;
      ++it;
    }
#if TRACE == 2
    if (t == 0) {
      const unsigned total = (unsigned)trace_clock() - tw_start;
#pragma unroll
      for (int k = 0; k < 8; ++k) atomicAdd(&sift_wait[9 * cw + k], (unsigned long long)tw[k]);
      atomicAdd(&sift_wait[9 * cw + 8], (unsigned long long)total);
    }
#elif TRACE == 1
    if (tracer)  // the CTA's end: flag bit 29
      trace_put(((unsigned long long)blockIdx.x << 40) | ((unsigned long long)trace_smid() << 32) | (1ull << 29),
                trace_gtime(), trace_clock(), 0, 0, 0);
#endif
  }
}
