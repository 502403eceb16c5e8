// SIFT block-sparse attention forward for Hopper (sm_90a): TMA + mbarrier ring + warp-specialised WGMMA.
//
// A CTA computes (query head h, query block m) tiles of BLOCK_M = 128 rows, one after another (persistent).
// Warpgroup 0 is the producer (one thread issues TMA loads, the warpgroup gives its registers away with setmaxnreg); warpgroups 1 and 2 are
// consumers, each owning 64 query rows. The KV-block loop of both roles walks the CSR row
//     indices[offsets[h * (M + 1) + m] .. offsets[h * (M + 1) + m + 1])       (descending block ids)
// so producer and consumers agree on the order. Per KV block a consumer warpgroup issues
//     S = Q K^T      (wgmma m64nBNk16, A and B from shared memory, fp32 accumulators in registers)
//     O += P V       (wgmma m64nDk16, A = P from registers as bf16, B = V from shared memory, MN-major)
// with the QK^T of block j+1 issued before the softmax of block j finishes (intra-warpgroup overlap), an
// fp32 online softmax in the log2 domain (scores pre-scaled by scale*log2(e), ex2.approx), and causal
// masking only on blocks whose last key lies past the warpgroup's first query row. Keys past L are zero
// filled by TMA and always masked by causality; query rows past L are computed on zero Q and not stored.
//
// Written without any #include so NVRTC needs no CUDA headers: bf16 is raw 16-bit, conversions are PTX.
// Compile-time parameters (macros): HEAD_DIM in {64, 128}, BLOCK_N in {64, 128}, STAGES >= 1.
// Grid: #tiles or #SMs (persistent), 384 threads; dynamic shared memory: sift_cli.kernels.attention_smem_bytes.

#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 128
#endif
#ifndef STAGES
#define STAGES 2
#endif
#define BLOCK_M 128
#define NUM_THREADS 384

#if (HEAD_DIM != 64 && HEAD_DIM != 128)
#error "HEAD_DIM must be 64 or 128"
#endif
#if (BLOCK_N != 64 && BLOCK_N != 128)
#error "BLOCK_N must be 64 or 128"
#endif

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
#define PINGPONG 1
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
#ifndef ABLATE_SOFTMAX
#define ABLATE_SOFTMAX 0
#endif
#ifndef ABLATE_PV
#define ABLATE_PV 0
#endif
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

// Online softmax on one S block held as wgmma accumulators: s[4i + e], row = g (+8 for e >= 2),
// column = 8i + 2c + (e & 1). Updates the running max (raw score units) and the thread-partial row sums,
// overwrites s with P = exp2(s * sl2 - m * sl2) and returns the rescale factors of the previous O.
template <bool MASK>
__device__ __forceinline__ void softmax_block(float* s, float& m_a, float& m_b, float& l_a, float& l_b,
                                              float& corr_a, float& corr_b, float sl2, int key0, int row_a) {
#if ABLATE_SOFTMAX  // timing ablation only (wrong results): P = S, no max / exp / sums
  corr_a = corr_b = 1.f;
  return;
#endif
  const int c = threadIdx.x & 3;
  if (MASK) {
#pragma unroll
    for (int i = 0; i < BLOCK_N / 8; ++i) {
      const int key = key0 + 8 * i + 2 * c;
      if (key > row_a) s[4 * i + 0] = neg_inf();
      if (key + 1 > row_a) s[4 * i + 1] = neg_inf();
      if (key > row_a + 8) s[4 * i + 2] = neg_inf();
      if (key + 1 > row_a + 8) s[4 * i + 3] = neg_inf();
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

#define FULL_K(s) (sBar + 8u * (1 + (s)))
#define FULL_V(s) (sBar + 8u * (1 + STAGES + (s)))
#define EMPTY_K(s) (sBar + 8u * (1 + 2 * STAGES + (s)))
#define EMPTY_V(s) (sBar + 8u * (1 + 3 * STAGES + (s)))

// One pipelined step j >= 1 of a consumer warpgroup (the FA3 order):
//   issue S_j = Q K_j^T;  O *= corr_{j-1};  issue O += P_{j-1} V_{j-1};  wait for S_j;  softmax(S_j) -> corr_j and
//   P_j (converted into a staging set, since the registers of P_{j-1} are still being read by the P V wgmma);
//   wait for P V;  P <- staging.
// Nothing in the softmax touches a register of an in-flight wgmma, so ptxas has no reason to hoist the wait.
// (stage, phase) name the ring slot of block j - 1 on entry and of block j on return.
template <bool MASK>
__device__ __forceinline__ void mainloop_step(float* s, float* o, u32* p, float& m_a, float& m_b, float& l_a,
                                              float& l_b, float& corr_a, float& corr_b, float sl2, int row_a,
                                              u32 q_base, u32 sK, u32 sV, u32 sBar, int& stage, u32& phase,
                                              int& kb_next, const int* __restrict__ indices, int start, int j, int n,
                                              int cw, u32 bar_q_empty) {
  const int kb = kb_next;
  if (j + 1 < n) kb_next = __shfl_sync(0xffffffffu, indices[start + j + 1], 0);
  int nstage = stage + 1;
  u32 nphase = phase;
  if (nstage == STAGES) {
    nstage = 0;
    nphase ^= 1;
  }
  mbar_wait(FULL_K(nstage), nphase);
  sched_wait(cw);
  fence_regs<BLOCK_N / 2>(s);
  wgmma_fence();
  issue_qk(s, q_base, sK + nstage * KV_BYTES);
  wgmma_commit();
  rescale_o(o, corr_a, corr_b);
  mbar_wait(FULL_V(stage), phase);
  fence_regs<HEAD_DIM / 2>(o);
  fence_regs_u<BLOCK_N / 4>(p);
  wgmma_fence();
  issue_pv(o, p, sV + stage * KV_BYTES);
  wgmma_commit();
  if (cw == 0 || j + 1 < n) sched_pass(cw);  // warpgroup 1 skips its last hand-over: nobody would wait for it
  wgmma_wait<1>();
  fence_regs<BLOCK_N / 2>(s);
  mbar_arrive(EMPTY_K(nstage));
  if (j + 1 == n) mbar_arrive(bar_q_empty);  // the tile's last Q K^T is done: the producer may load the next Q
  softmax_block<MASK>(s, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, kb * BLOCK_N, row_a);
  u32 p_next[BLOCK_N / 4];
  convert_p(s, p_next);
  wgmma_wait<0>();
  fence_regs<HEAD_DIM / 2>(o);
  fence_regs_u<BLOCK_N / 4>(p);
  mbar_arrive(EMPTY_V(stage));
#pragma unroll
  for (int i = 0; i < BLOCK_N / 4; ++i) p[i] = p_next[i];
  stage = nstage;
  phase = nphase;
}

// ----------------------------------------------------------------------------------------------------------
// The kernel
// ----------------------------------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(NUM_THREADS, 1)
sift_sparse_attn_fwd(const __grid_constant__ TmaDesc tmap_q, const __grid_constant__ TmaDesc tmap_k,
                     const __grid_constant__ TmaDesc tmap_v, bf16_t* __restrict__ out, float* __restrict__ lse,
                     const int* __restrict__ offsets, const int* __restrict__ indices, int seq_len, int n_heads,
                     int group, int n_qblocks, float scale_log2, int write_lse) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const u32 base = (smem_addr(smem_raw) + 1023u) & ~1023u;  // 128B swizzle atoms need 1024-byte alignment
  const u32 sQ = base;
  const u32 sK = sQ + Q_BYTES;
  const u32 sV = sK + STAGES * KV_BYTES;
  const u32 sBar = sV + STAGES * KV_BYTES;
  const u32 bar_q = sBar;
  const u32 bar_q_empty = sBar + 8u * (1 + 4 * STAGES);

  // Tiles are (head, query block) pairs, longest causal rows first (m descending, heads fastest). A CTA walks
  // tiles blockIdx.x, blockIdx.x + gridDim.x, ...: grid = #tiles is one tile per CTA, grid = #SMs is persistent
  // (the producer then loads the next tile's Q and K/V while the consumers finish the current one).
  const int n_tiles = n_heads * n_qblocks;
  const int tid = threadIdx.x;
  // Broadcast from lane 0: ptxas then knows values are warp-uniform, so branches on them are not divergent.
  const int wg = __shfl_sync(0xffffffffu, tid >> 7, 0);

  if (tid == 0) {
    prefetch_tma_desc(&tmap_q);
    prefetch_tma_desc(&tmap_k);
    prefetch_tma_desc(&tmap_v);
    mbar_init(bar_q, 1);
    mbar_init(bar_q_empty, 256);
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(FULL_K(s), 1);
      mbar_init(FULL_V(s), 1);
      mbar_init(EMPTY_K(s), 256);
      mbar_init(EMPTY_V(s), 256);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer warpgroup ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
    if (tid == 0) {
      int stage = 0;
      u32 phase = 0, q_phase = 0;
      for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
        const int h = tile % n_heads;
        const int m = n_qblocks - 1 - tile / n_heads;
        const int hk = h / group;
        const int row_ptr = h * (n_qblocks + 1) + m;
        const int start = offsets[row_ptr];
        const int n = offsets[row_ptr + 1] - start;
        if (n <= 0) continue;
        mbar_wait(bar_q_empty, q_phase ^ 1);  // the previous tile's consumers are done with Q
        mbar_expect_tx(bar_q, Q_BYTES);
#pragma unroll
        for (int c = 0; c < HEAD_DIM / 64; ++c) tma_load_3d(sQ + c * CHUNK_Q, &tmap_q, bar_q, c * 64, m * BLOCK_M, h);
        q_phase ^= 1;
        int kb_next = indices[start];
        for (int i = 0; i < n; ++i) {
          const int kb = kb_next;
          if (i + 1 < n) kb_next = indices[start + i + 1];
          mbar_wait(EMPTY_K(stage), phase ^ 1);
          mbar_expect_tx(FULL_K(stage), KV_BYTES);
#pragma unroll
          for (int c = 0; c < HEAD_DIM / 64; ++c)
            tma_load_3d(sK + stage * KV_BYTES + c * CHUNK_KV, &tmap_k, FULL_K(stage), c * 64, kb * BLOCK_N, hk);
          mbar_wait(EMPTY_V(stage), phase ^ 1);
          mbar_expect_tx(FULL_V(stage), KV_BYTES);
#pragma unroll
          for (int c = 0; c < HEAD_DIM / 64; ++c)
            tma_load_3d(sV + stage * KV_BYTES + c * CHUNK_KV, &tmap_v, FULL_V(stage), c * 64, kb * BLOCK_N, hk);
          if (++stage == STAGES) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
  } else {
    // ---------------- consumer warpgroups ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int cw = wg - 1;  // which 64-row half of the query block
    const int t = tid & 127;
    const int warp = t >> 5, lane = t & 31;
    const int g = lane >> 2, c = lane & 3;
    const float sl2 = scale_log2;
    const u32 q_base = sQ + cw * 64 * 128;
    int stage = 0;  // ring slot of the next KV block to consume
    u32 phase = 0, q_phase = 0;

    for (int tile = blockIdx.x; tile < n_tiles; tile += gridDim.x) {
      const int h = tile % n_heads;
      const int m = n_qblocks - 1 - tile / n_heads;
      const int row_ptr = h * (n_qblocks + 1) + m;
      const int start = __shfl_sync(0xffffffffu, offsets[row_ptr], 0);
      const int n = __shfl_sync(0xffffffffu, offsets[row_ptr + 1], 0) - start;
      const int wg_row0 = m * BLOCK_M + cw * 64;
      const int row_a = wg_row0 + warp * 16 + g;  // this thread's rows: row_a and row_a + 8

      float o[HEAD_DIM / 2];
#pragma unroll
      for (int i = 0; i < HEAD_DIM / 2; ++i) o[i] = 0.f;
      float s[BLOCK_N / 2];
      u32 p[BLOCK_N / 4];
      float m_a = neg_inf(), m_b = neg_inf(), l_a = 0.f, l_b = 0.f, corr_a, corr_b;

      if (n > 0) {
        mbar_wait(bar_q, q_phase);
        q_phase ^= 1;

        // first block (normally the diagonal one)
        int kb = __shfl_sync(0xffffffffu, indices[start], 0);
        if (cw == 1) sched_pass(cw);  // warpgroup 0 goes first
        mbar_wait(FULL_K(stage), phase);
        sched_wait(cw);
        wgmma_fence();
        issue_qk(s, q_base, sK + stage * KV_BYTES);
        wgmma_commit();
        if (cw == 0 || n > 1) sched_pass(cw);
        wgmma_wait<0>();
        fence_regs<BLOCK_N / 2>(s);
        mbar_arrive(EMPTY_K(stage));
        if (n == 1) mbar_arrive(bar_q_empty);
        // Masking is decided per loop, not per block inside the pipelined body: a data-dependent branch while
        // wgmmas are in flight makes ptxas serialise them (C7520). The list is descending, so the blocks that
        // reach past this warpgroup's first row (diagonal, partial) are a prefix of it.
        const int mask_above = wg_row0 - BLOCK_N + 1;  // block kb needs the causal mask iff kb * BLOCK_N > this
        if (kb * BLOCK_N > mask_above)
          softmax_block<true>(s, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, kb * BLOCK_N, row_a);
        else
          softmax_block<false>(s, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, kb * BLOCK_N, row_a);
        convert_p(s, p);

        int j = 1;
        int kb_next = __shfl_sync(0xffffffffu, (n > 1) ? indices[start + 1] : 0, 0);
        while (j < n && kb_next * BLOCK_N > mask_above) {
          mainloop_step<true>(s, o, p, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, row_a, q_base, sK, sV, sBar, stage,
                              phase, kb_next, indices, start, j, n, cw, bar_q_empty);
          ++j;
        }
        for (; j < n; ++j)
          mainloop_step<false>(s, o, p, m_a, m_b, l_a, l_b, corr_a, corr_b, sl2, row_a, q_base, sK, sV, sBar, stage,
                               phase, kb_next, indices, start, j, n, cw, bar_q_empty);
        // last block's P V
        rescale_o(o, corr_a, corr_b);
        mbar_wait(FULL_V(stage), phase);
        fence_regs<HEAD_DIM / 2>(o);
        fence_regs_u<BLOCK_N / 4>(p);
        wgmma_fence();
        issue_pv(o, p, sV + stage * KV_BYTES);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs<HEAD_DIM / 2>(o);
        mbar_arrive(EMPTY_V(stage));
        if (++stage == STAGES) {
          stage = 0;
          phase ^= 1;
        }
      }

      // ---------------- epilogue: normalise, store O (bf16) and the natural-log LSE ----------------
      l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
      l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
      l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
      l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
      const float inv_a = (l_a > 0.f) ? 1.f / l_a : 0.f;
      const float inv_b = (l_b > 0.f) ? 1.f / l_b : 0.f;
      const int row_b = row_a + 8;
      const long long head_off = (long long)h * seq_len * HEAD_DIM;
      if (row_a < seq_len) {
        u32* dst = reinterpret_cast<u32*>(out + head_off + (long long)row_a * HEAD_DIM + 2 * c);
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 8; ++i) dst[4 * i] = pack_bf16(o[4 * i + 0] * inv_a, o[4 * i + 1] * inv_a);
      }
      if (row_b < seq_len) {
        u32* dst = reinterpret_cast<u32*>(out + head_off + (long long)row_b * HEAD_DIM + 2 * c);
#pragma unroll
        for (int i = 0; i < HEAD_DIM / 8; ++i) dst[4 * i] = pack_bf16(o[4 * i + 2] * inv_b, o[4 * i + 3] * inv_b);
      }
      if (write_lse && c == 0) {
        const float ln2 = 0.6931471805599453f;
        if (row_a < seq_len)
          lse[(long long)h * seq_len + row_a] = (l_a > 0.f) ? (m_a * sl2 + lg2(l_a)) * ln2 : neg_inf();
        if (row_b < seq_len)
          lse[(long long)h * seq_len + row_b] = (l_b > 0.f) ? (m_b * sl2 + lg2(l_b)) * ln2 : neg_inf();
      }
    }
  }
}
