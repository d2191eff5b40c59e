// The per-chunk gradients, parallel over (chunk of this round, key head; params.cuh says what a
// round is), from the recomputed S = h[c] and Vn, and dS = dh[c], dVn from the reverse pass (h
// and dh stored transposed). The math is chunked_backward.cpp's (spec 3):
//   dR = A^T dVn,  dV = diag(beta) dR,  D = [-dR; scale dO],
//   [dKb; dQe] = D S^T,  [dL; dP] = D Vn^T,  dKf = Vn dS^T,
//   Kb = diag(beta e) K, Qe = diag(e) Q, Kf = diag(f) K, P = (Q K^T) * decay,
//   L = strictly_lower(diag(beta) K K^T * decay),
// and every factor exp(G_a - G_b) gives t to dG_a and -t to dG_b (t = gradient * value);
// K and Q are the unit rows diag(rk) k, diag(rq) q of the tiles' rows k, q (params.cuh): a
// product with K or Q takes rk, rq on the other operand's rows or columns, or on its result's,
// in f32 (dk += dpd^T Q is dk += (diag(rq) dpd)^T q, dq += dpd K is dq += (dpd diag(rk)) k, ...);
// dg is the reverse cumulative sum of dG. A block loops over the value heads of its key head
// (one Q, K tile for all): dv, dg, dbeta per value head; dq, dk summed over them in registers,
// then back through the l2norm (spec 1).
//
// Warp w owns rows 16 (w % 4) .. + 15 of every product and half of its columns (w / 4), so
// warpgroup w / 4 computes one column half of each product as wgmma (wgmma.cuh): A from
// registers (ldmatrix fragments) or, where A is itself a swizzled tile (Vn, -dR, Q, K), from
// shared memory (SS: no A registers, so independent products are issued together and waited for
// once), B from a swizzled tile read once per warpgroup (mma.sync read B once per warp, and its
// ldmatrix traffic bounded the kernel); row sums reduce over the 4 lanes of a row.
//
// Every global read is a cp.async into shared memory, issued as early as a free tile allows (one
// block per SM: 218 KiB). The first value head's in two groups: what its first products and
// their epilogue read (dS^T, Vn, dVn, S^T, A, K, rq, rk, the gates), then V, dO and Q, waited for
// only before the dv step. The next value head's during this one, each tile as soon as its last
// reader passes a barrier: Vn and dVn at the start (their second tiles), dS^T after the first
// products (each warpgroup its column half, past a barrier of its own 4 warps), S^T and dO after
// the [dKb; dQe] products (moved before the dk, dq products for this), A, V and the gates after
// those; during the last value head, the f16 input rows q, k that the l2norm's backward reads at
// the end (bf16 ones are the Q, K tiles themselves). (Plain loads of V and of q, k at their point
// of use stalled the whole block on memory latency: 8% of the kernel at T = 64k; the early loads of
// the second value head took it 833-843 -> 815-825 us.)
//
// Deterministic: no float atomics, every sum is added in an order fixed by the code, so dq dk dv
// dg dbeta are bitwise the same run to run. dG_i and db_i have partial sums from several warps:
// each warp keeps its own in shared slots that no other thread writes, and one pass adds the
// slots in a fixed order. The row terms of row i in column half h are added, in program order,
// by the one thread that owns them (lane 4 (i % 8) of warp 4 h + i / 16) into dG_rows[h][i] and
// db_rows[h][i]; the column terms -sum_i t_ij of column j in row block r are summed by shuffles
// and stored once into dG_cols[r][j]; each warp stores its part of gamma's gradient into
// extra[warp]. After a barrier, warp 0 adds dG_i = (rows[0] + rows[1]) - ((cols[0] + cols[1]) +
// (cols[2] + cols[3])), db_i = rows[0] + rows[1] and extra = extra[0] + ... + extra[7]. Cost:
// 1.5 KB more shared memory; each shared atomic became a load and a store of its owner (no
// conflicts: one thread per address), the 8 atomics per warp into one extra 3 shuffles.
#include <algorithm>

#include "core/reset.h"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/wgmma.cuh"

namespace gdn::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// The B operands are swizzled tiles (1024-byte aligned), the A-only ones padded ldmatrix tiles.
struct GradSmem {
  static constexpr int q = 0;                       // bf16 [64][128] swizzled  Q
  static constexpr int k = q + kC * kD * 2;         // bf16 [64][128] swizzled  K
  static constexpr int st = k + kC * kD * 2;        // bf16 [128][128] swizzled dS^T, then x
  static constexpr int h = st + kD * kD * 2;        // bf16 [128][128] swizzled S^T
  static constexpr int vn = h + kD * kD * 2;        // bf16 [2][64][128] swizzled Vn
  static constexpr int dvn = vn + 2 * kC * kD * 2;  // bf16 [2][64][128] swizzled dVn, then -dR
  static constexpr int a = dvn + 2 * kC * kD * 2;   // bf16 [64][72]  A, then diag(rq) dP * decay
  static constexpr int d_o = a + kC * kLdH64 * 2;   // bf16 [64][136] dO
  static constexpr int dls = d_o + kC * kLdH * 2;   // bf16 [64][72]  (F + F^T) diag(rk)
  static constexpr int v = dls + kC * kLdH64 * 2;   // In [64][136]   V, then dP * decay diag(rk)
  static constexpr int vec = v + kC * kLdH * 2;     // f32 [4][64] G, beta, g (value head % 2)
  static constexpr int rows = vec + 4 * kC * 4;     // f32 [2][2][64] dG, db row sums (half, row)
  static constexpr int cols = rows + 4 * kC * 4;    // f32 [4][64] dG column sums (block, column)
  static constexpr int extra = cols + 4 * kC * 4;   // f32 [8] gamma's gradient (warp)
  static constexpr int dots = extra + kWarps * 4;   // f32 [2][2][64] (q or k, half, row)
  static constexpr int r = dots + 4 * kC * 4;       // f32 [2][64] rq, rk (0 on padded rows)
  // + 1024: the dynamic shared memory is aligned up to 1024 bytes (align_1024).
  static constexpr int bytes = r + 2 * kC * 4 + 1024;
};
// dS^T's tile takes, in the last value head once done with dS^T, the input rows x = q, k
// (In [2][64][128]) for the l2norm's backward of f16 inputs (bf16 ones are the Q, K tiles).
static_assert(GradSmem::bytes + sizeof(int) <= 227 * 1024,
              "one block (and its static chunk slot) fits in a Hopper SM's shared memory");

// Sums v over the 4 lanes that share a row.
__device__ inline float row_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
// Sums v over the 8 lanes that share a column (the two rows of a lane are summed by the caller).
__device__ inline float col_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  return v + __shfl_xor_sync(0xffffffffu, v, 16);
}

// One pass of a warp's 16-bit output rows (its 16 rows r0 + g, + 8 and 32 of its columns) stored
// 16 bytes at a time: pair(nt, e) packs its values of n-tile nt (4 pass .. 4 pass + 3), elements
// e, e + 1 (e = 0: row r0 + g, e = 2: row r0 + g + 8) into the warp's 1 KB `stage` ([16][16] u32,
// its 16-byte pieces swizzled: no bank conflicts); then each lane copies two pieces to row(i) +
// 32 pass, rows i < len. (4-byte stores from the accumulators, 16 a thread a pass, stalled on the
// memory pipe's queue: 2-3% of the kernel's stall samples.)
template <typename Pair, typename Row>
__device__ inline void store_pass(std::uint32_t* stage, int pass, int r0, int len, Pair pair,
                                  Row row) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = 2 * (lane % 4);
#pragma unroll
  for (int nt = 4 * pass; nt < 4 * pass + 4; ++nt)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int sr = g + 8 * (e / 2);
      stage[sr * 16 + 4 * ((nt % 4) ^ (sr / 2 % 4)) + c / 2] = pair(nt, e);
    }
  __syncwarp();
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int r = lane / 4 + 8 * k, piece = lane % 4;
    if (r0 + r < len)
      *reinterpret_cast<uint4*>(row(r0 + r) + 32 * pass + 8 * piece) =
          *reinterpret_cast<const uint4*>(stage + r * 16 + 4 * (piece ^ (r / 2 % 4)));
  }
  __syncwarp();
}

template <typename In>
__global__ void __launch_bounds__(kThreads) grad_chunk_kernel(Params p) {
  // Beside the chains (Params::beside) this launch starts once every state_backward block is
  // running (launch.cuh: each lets the next launch once started): its blocks wait for their
  // chunk's flags, not for state_backward's end.
  if (p.beside)
    launch_dependents();
  else
    begin_dependent();  // launch.cuh
  // The chunk at `place` in this round's dh and dVn (params.cuh: rounds).
  // A chunk's key heads are consecutive blocks (as in chunk_prep): the 32-byte sectors of g, rq,
  // rk, dg and dbeta that their blocks share, a few bytes each, meet in L2. The places run over
  // y, then z (a grid's y holds at most 65535), so that both are block indices, which the
  // compiler reads again where it needs them instead of holding them in registers.
  // Beside the chains, the last places first: the chains store them first.
  const int order = blockIdx.z * gridDim.y + blockIdx.y, hk = blockIdx.x, tid = threadIdx.x;
  if (order >= p.round_slots) return;
  const int place = p.beside ? p.round_slots - 1 - order : order;
  const RoundChunk at = p.round_chunks[static_cast<long long>(p.round) * p.round_slots + place];
  // The chunk's slot, read from shared memory at each use: held in a register, live through every
  // product at 255 registers a thread, it cost the kernel 3-7% (bench/RESULTS.md, seventeenth
  // session); the block index it was before the rounds the compiler recomputed for free.
  __shared__ int shared_cid;
  if (tid == 0) {
    shared_cid = at.cid;
    if (p.beside && at.info.len > 0)  // the chunk's dh and dVn, of each value head of the group
      for (int hv = hk * (p.HV / p.HK); hv < (hk + 1) * (p.HV / p.HK); ++hv)
        while (load_acquire(p.ready + slot(p, place, hv)) == 0) __nanosleep(64);
  }
  __syncthreads();
  auto chunk = [&] { return *static_cast<volatile int*>(&shared_cid); };
  const int warp = tid / 32, lane = tid % 32, g = lane / 4, c = 2 * (lane % 4);
  const int r0 = 16 * (warp % 4), half = uniform(warp / 4);  // rows r0.., columns of this half
  const int i_lo = r0 + g, i_hi = i_lo + 8;                  // this lane's rows
  const ChunkInfo info = at.info;
  if (info.len == 0) return;
  const int group = p.HV / p.HK, len = info.len;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align_1024(smem_raw);
  bf16* qs = reinterpret_cast<bf16*>(smem + GradSmem::q);
  bf16* ks = reinterpret_cast<bf16*>(smem + GradSmem::k);
  bf16* st = reinterpret_cast<bf16*>(smem + GradSmem::st);
  bf16* hs = reinterpret_cast<bf16*>(smem + GradSmem::h);
  bf16* vn_tiles = reinterpret_cast<bf16*>(smem + GradSmem::vn);  // value head j in tile j % 2
  bf16* dvn_tiles = reinterpret_cast<bf16*>(smem + GradSmem::dvn);
  bf16* ab = reinterpret_cast<bf16*>(smem + GradSmem::a);
  bf16* dpd = ab;  // diag(rq) dP * decay
  // dP * decay diag(rk), in V's tile (V is done with once db has its terms)
  bf16* dpk = reinterpret_cast<bf16*>(smem + GradSmem::v);
  bf16* dos = reinterpret_cast<bf16*>(smem + GradSmem::d_o);
  bf16* dls = reinterpret_cast<bf16*>(smem + GradSmem::dls);
  In* vs = reinterpret_cast<In*>(smem + GradSmem::v);
  In* xs = reinterpret_cast<In*>(st);  // [2][64][128] q, k rows (the end)
  float* rs = reinterpret_cast<float*>(smem + GradSmem::r);
  const float* rq = rs;
  const float* rk = rs + kC;
  float* dots = reinterpret_cast<float*>(smem + GradSmem::dots);

  const long long row = qk_row(p, info.b, info.t0, hk);
  // The column half of this warpgroup in the 64-row tiles Q, K, dVn (B = X, MN-major) and in the
  // 128-row tiles dS^T, S^T; and the 32 rows of Vn, K as B = X^T (K-major) of the 64-wide
  // products.
  auto half64 = [&](const bf16* tile) { return tile + half * kC * 64; };
  auto half128 = [&](const bf16* tile) { return tile + half * kD * 64; };
  auto rows32 = [&](const bf16* tile) { return tile + 32 * half * 64; };
  auto col = [&](int nt, int e) { return 8 * nt + c + e % 2; };  // column within the tile range
  auto row_of = [&](int e) { return r0 + g + 8 * (e / 2); };
  auto pair = [](const bf16* base) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(base));
  };
  auto qk_pair = [&](const bf16* tile, int i, int j) { return pair(swizzled_at(tile, kC, i, j)); };

  // The copies of the group's value head j, each issued once the tile it fills is free (no
  // commit): Vn and dVn into their tiles j % 2; dS^T; S^T and dO; A, V, G, beta and g (into
  // the slot j % 2, the scan of value head j - 1 reads g in the other).
  auto issue_vn = [&](int j) {
    const int hv = hk * group + j;
    issue_rows_swizzled<kD, kC, kThreads>(vn_tiles + (j % 2) * kC * kD,
                                          p.vn + slot(p, place, hv) * kC * kD, kD, kC);
    issue_rows_swizzled<kD, kC, kThreads>(dvn_tiles + (j % 2) * kC * kD,
                                          p.dvn + slot(p, place, hv) * kC * kD, kD, kC);
  };
  auto issue_state = [&](bf16* tile, const bf16* src, int j) {  // dS^T (dh) or S^T (h)
    issue_rows_swizzled<kD, kD, kThreads>(tile, src + slot(p, place, hk * group + j) * kD * kD, kD,
                                          kD);
  };
  // dO and V as two lambdas: one taking the tensor as an argument spilled 12 bytes more (ptxas).
  auto issue_do = [&](int j) {
    const long long vrow = v_row(p, info.b, info.t0, hk * group + j);
    issue_rows<kD, kC, kThreads>(dos, kLdH, static_cast<const In*>(p.d_o) + vrow * kD, p.HV * kD,
                                 len);
  };
  auto issue_v = [&](int j) {
    const long long vrow = v_row(p, info.b, info.t0, hk * group + j);
    issue_rows<kD, kC, kThreads>(vs, kLdH, static_cast<const In*>(p.v) + vrow * kD, p.HV * kD, len);
  };
  auto issue_a = [&](int j) {  // A and the gates
    const int hv = hk * group + j;
    const long long s = slot(p, chunk(), hv), vrow = v_row(p, info.b, info.t0, hv);
    issue_rows<kC, kC, kThreads>(ab, kLdH64, p.A + s * kC * kC, kC, kC);
    float* vec = reinterpret_cast<float*>(smem + GradSmem::vec);
    if (tid < 16)
      cp_async16(vec + 4 * tid, p.G + s * kC + 4 * tid, true);
    else if (tid < 32)
      cp_async16(vec + kC + 4 * (tid - 16), p.bt + s * kC + 4 * (tid - 16), true);
    else if (tid < 32 + len)
      cp_async4(vec + (2 + j % 2) * kC + tid - 32,
                p.g + vrow + static_cast<long long>(tid - 32) * p.HV);
  };

  // f16 dO to bf16, in place, by the copying thread once its copies landed.
  auto convert_do = [&]() {
    if constexpr (!std::is_same_v<In, bf16>) {
      for (int idx = tid; idx < kC * 16; idx += kThreads) {
        const int r = idx / 16, part = idx % 16;
        In* raw = reinterpret_cast<In*>(dos + r * kLdH + part * 8);
        for (int e = 0; e < 8; ++e)
          dos[r * kLdH + part * 8 + e] = from_float<bf16>(to_float(raw[e]));
      }
    }
  };

  Acc dq[8] = {}, dk[8] = {};  // the group's sums
  for (int gi = 0; gi < group; ++gi) {
    const int hv = hk * group + gi;
    // The per-head slots' addresses, made here, not held through the loop: recomputed where they
    // are used, they hold no registers (the bf16 kernel's spills 44 -> 0 bytes; bench/RESULTS.md).
    float* G = reinterpret_cast<float*>(smem + GradSmem::vec);
    float* beta = G + kC;
    float* g_raw = G + (2 + gi % 2) * kC;  // core/reset.h: a reset's g gets no gradient
    float* dG_rows = reinterpret_cast<float*>(smem + GradSmem::rows);
    float* db_rows = dG_rows + 2 * kC;
    float* dG_cols = reinterpret_cast<float*>(smem + GradSmem::cols);
    float* extra = reinterpret_cast<float*>(smem + GradSmem::extra);
    float* dG = dG_rows + half * kC;  // this warp's row slots (written only by the row's owner)
    float* db = db_rows + half * kC;
    const long long vrow = v_row(p, info.b, info.t0, hv);
    bf16* vn = vn_tiles + (gi % 2) * kC * kD;
    bf16* dvn = dvn_tiles + (gi % 2) * kC * kD;
    // Later value heads' tiles are prefetched by the one before, each as soon as its tile is free.
    // The first's come in two groups: what its first products and their epilogue read (dS^T, Vn,
    // dVn, S^T, A, K, rq, rk, gates), then V, dO and Q, waited for before the dv step.
    if (gi == 0) {
      issue_state(st, p.dh, 0);
      issue_vn(0);
      issue_state(hs, p.h, 0);
      issue_a(0);
      issue_rows_swizzled<kD, kC, kThreads>(ks, p.kn + row * kD, p.HK * kD, len);
      if (tid < 2 * kC) {
        if (tid % kC < len)
          cp_async4(rs + tid, (tid < kC ? p.rq : p.rk) + row + (tid % kC) * p.HK);
        else
          rs[tid] = 0.0f;
      }
      cp_async_commit();
      issue_v(0);
      issue_do(0);
      issue_rows_swizzled<kD, kC, kThreads>(qs, p.qn + row * kD, p.HK * kD, len);
      cp_async_commit();
    }
    const bool prefetch = gi + 1 < group;
    if (prefetch) {
      issue_vn(gi + 1);
      cp_async_commit();
    }
    if (tid < 2 * kC) {  // dG_cols and extra are stored whole, not added to
      dG_rows[tid] = 0.0f;
      db_rows[tid] = 0.0f;
    }
    // All but the next value head's Vn, dVn (and the first's V, dO, Q).
    if (gi == 0 && prefetch)
      cp_async_wait<2>();
    else if (gi == 0 || prefetch)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    if (gi > 0) convert_do();
    fence_proxy_async();  // the landed tiles, before wgmma reads them
    __syncthreads();
    const float g_last = G[kC - 1], gamma = exp_ftz(g_last);
    auto e_of = [&](int i) { return exp_ftz(G[i]); };

    // dKf = Vn dS^T and dR = A^T dVn (columns of this half), issued together with, for the
    // gradient of gamma, sum(S * dS): this warpgroup's part, the sum over this column half of the
    // S^T and dS^T tiles, is the trace of X Y^T, X = [X0 X1] and Y = [Y0 Y1] the half's rows 0 ..
    // and 64 .. side by side (k-tiles 4 .. 7 of a K-major tile of 64 rows are the next 64 rows)
    // (on the tensor cores: summed from the tiles by every thread, it issued 250 instructions a
    // thread, 6% of a value head's). So each warpgroup reads only its column half of dS^T, and
    // the next value head's may replace it once that warpgroup is done (a barrier of 4 warps).
    Acc dkf[8], dr[8], tr[8];
    {
      std::uint32_t a[4][4];
      load_a_km(a, ab, kLdH64, r0);
      wgmma_fence();
      wgmma_kn(dkf, SmemA<8>{vn}, half128(st), kD, false);
      wgmma_nk(tr, SmemA<8>{half128(hs), kC}, half128(st), false, kC);
      wgmma_commit();
      wgmma_kn(dr, a, half64(dvn), kC, false);
      wgmma_commit();
    }

    // The trace's terms on this warp's rows; dk += diag(f) dKf; dG_i -= f_i sum_j K_ij dKf_ij.
    {
      wgmma_wait<1>();
      fence_acc(dkf);
      fence_acc(tr);
      float diag = 0;  // lane (g, c) holds (r0 + g, r0 + g) where c or c + 1 is g
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (8 * nt + c + e % 2 == r0 + g + 8 * (e / 2)) diag += tr[nt][e];
      diag = warp_sum(diag);
      if (lane == 0) extra[warp] = gamma * diag;
      const float f_lo = exp_ftz(g_last - G[i_lo]), f_hi = exp_ftz(g_last - G[i_hi]);
      float lo = 0, hi = 0;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int j = 64 * half + 8 * nt + c;
        const float2 k_lo = qk_pair(ks, i_lo, j), k_hi = qk_pair(ks, i_hi, j);
        lo += k_lo.x * dkf[nt][0] + k_lo.y * dkf[nt][1];
        hi += k_hi.x * dkf[nt][2] + k_hi.y * dkf[nt][3];
        dk[nt][0] += f_lo * dkf[nt][0], dk[nt][1] += f_lo * dkf[nt][1];
        dk[nt][2] += f_hi * dkf[nt][2], dk[nt][3] += f_hi * dkf[nt][3];
      }
      lo = row_sum(lo) * f_lo * rk[i_lo];
      hi = row_sum(hi) * f_hi * rk[i_hi];
      if (lane % 4 == 0) {
        dG[i_lo] -= lo;
        dG[i_hi] -= hi;
      }
      // The f_i terms of exp(G_last) go to dG_{len-1} at the end: summed over the warp's rows
      // (every lane of a row holds its sum; col_sum adds the 8 rows of lanes 0, 4, .., 28).
      const float mine = col_sum((i_lo < len ? lo : 0.0f) + (i_hi < len ? hi : 0.0f));
      if (lane == 0) extra[warp] += mine;
    }
    if (gi == 0) {  // V, dO and Q
      if (prefetch)
        cp_async_wait<1>();
      else
        cp_async_wait<0>();
      convert_do();
      fence_proxy_async();
    }
    // This warpgroup's column half of dS^T is done: the next value head's takes its place,
    // copied by this warpgroup (the first value head's V, dO and Q wait for the whole block).
    if (gi == 0)
      __syncthreads();
    else
      named_barrier(1 + half, 128);
    if (prefetch) {
      issue_rows_swizzled<64, kD, 128>(st + half * kD * 64,
                                       p.dh + slot(p, place, hv + 1) * kD * kD + 64 * half, kD, kD);
      cp_async_commit();
    } else if (!std::is_same_v<In, bf16> && p.l2norm) {  // f16 rows of the l2norm's backward:
      // q into column half 0's bytes, k into half 1's
      issue_rows<kD, kC, 128>(xs + half * kC * kD, kD,
                              static_cast<const In*>(half ? p.k : p.q) + row * kD, p.HK * kD, len);
      cp_async_commit();
    }

    // dv = diag(beta) dR; db_i += V_i . dR_i; then -dR replaces dVn.
    wgmma_wait<0>();
    fence_acc(dr);
    {
      In* dv = static_cast<In*>(p.dv) + vrow * kD;
      // dv through the warp's 1 KB of dls's tile (free until dL); db's row terms V_i . dR_i summed
      // as V's pairs are read, by n-tile, then element (V kept in registers for a sum after the
      // stores held 32 of them).
      std::uint32_t* stage = reinterpret_cast<std::uint32_t*>(dls) + warp * 256;
      float lo = 0, hi = 0;
#pragma unroll
      for (int pass = 0; pass < 2; ++pass)
        store_pass(
            stage, pass, r0, len,
            [&](int nt, int e) {
              const int i = row_of(e), j = 64 * half + col(nt, e);
              const float2 x =
                  unpack2<In>(*reinterpret_cast<const std::uint32_t*>(vs + i * kLdH + j));
              float& sum = e < 2 ? lo : hi;
              sum += x.x * dr[nt][e];
              sum += x.y * dr[nt][e + 1];
              return pack2<In>(beta[i] * dr[nt][e], beta[i] * dr[nt][e + 1]);
            },
            [&](int i) { return dv + static_cast<long long>(i) * p.HV * kD + 64 * half; });
      lo = row_sum(lo);
      hi = row_sum(hi);
      if (lane % 4 == 0) db[i_lo] += lo, db[i_hi] += hi;
    }
    __syncthreads();  // every warp is done with dVn and A
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        *reinterpret_cast<std::uint32_t*>(swizzled_at(dvn, kC, row_of(e), 64 * half + col(nt, e))) =
            pack_bf16(-dr[nt][e], -dr[nt][e + 1]);
    fence_proxy_async();  // -dR is an SS operand (the async proxy) below
    bf16* ndr = dvn;      // -dR

    auto decay = [&](int i, int j) { return j <= i ? exp_ftz(G[i] - G[j]) : 0.0f; };

    // dP = scale dO Vn^T and P = (Q K^T) * decay: dP * decay goes to its tiles at once, t = dP * P
    // to dG_i (row sums) and -dG_j (column sums); the decays are kept for dL's terms.
    // Both products of the 32 columns of this half in flight at once (Q K^T SS: no A registers).
    Acc x1[4], x2[4];
    {
      std::uint32_t a[8][4];
      load_a_mk(a, dos, kLdH, r0);
      wgmma_fence();
      wgmma_nk(x1, a, rows32(vn), false, kC);
      wgmma_nk(x2, SmemA<8>{qs}, rows32(ks), false, kC);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(x1);
      fence_acc(x2);
    }
    float colsum[4][2] = {}, dec[4][4];
    {
      float lo = 0, hi = 0;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row_of(e), j = 32 * half + col(nt, e);
          const float d = decay(i, j), dp = p.scale * x1[nt][e];
          dec[nt][e] = d;
          const float t = dp * x2[nt][e] * d * rq[i] * rk[j];
          x1[nt][e] = dp * d;
          (e < 2 ? lo : hi) += t;
          colsum[nt][e % 2] += t;
        }
      lo = row_sum(lo);
      hi = row_sum(hi);
      if (lane % 4 == 0) dG[i_lo] += lo, dG[i_hi] += hi;
    }
    // A and V are done with (the barriers after dR): dP * decay takes their tiles. (Written here,
    // not after dL's terms, its accumulators die before dL's and K K^T's are born: with the
    // decays kept, the bf16 kernel's spills fell from 136 to 44 bytes and it took 12% less time.)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int i = row_of(e), j = 32 * half + col(nt, e);
        *reinterpret_cast<std::uint32_t*>(dpd + i * kLdH64 + j) =
            pack_bf16(rq[i] * x1[nt][e], rq[i] * x1[nt][e + 1]);
        *reinterpret_cast<std::uint32_t*>(dpk + i * kLdH64 + j) =
            pack_bf16(x1[nt][e] * rk[j], x1[nt][e + 1] * rk[j + 1]);
      }
    __syncthreads();  // -dR is complete

    // dL = -dR Vn^T and K K^T: dl = strictly_lower(dL * decay), m2 = dl * K K^T, F = diag(beta) dl;
    // t = beta_i m2 goes to dG like the P terms, m2 to db.
    Acc dl[4];
    {
      Acc kk[4];
      wgmma_fence();
      wgmma_nk(dl, SmemA<8>{ndr}, rows32(vn), false, kC);
      wgmma_nk(kk, SmemA<8>{ks}, rows32(ks), false, kC);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(dl);
      fence_acc(kk);
      float lo_t = 0, hi_t = 0, lo_m = 0, hi_m = 0;
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row_of(e), j = 32 * half + col(nt, e);
          const float d = j < i ? dec[nt][e] : 0.0f;
          const float l = dl[nt][e] * d, m2 = l * kk[nt][e] * rk[i] * rk[j];
          dl[nt][e] = beta[i] * l;  // F
          (e < 2 ? lo_t : hi_t) += beta[i] * m2;
          (e < 2 ? lo_m : hi_m) += m2;
          colsum[nt][e % 2] += beta[i] * m2;
        }
        // dls = (F + F^T) diag(rk), F strictly lower: F_ij rk_j below the diagonal and F_ij rk_i
        // at (j, i) above it, each written once by the owner of (i, j), j <= i (0 on the diagonal);
        // the previous value head's reads of dls ended at its last barrier.
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row_of(e), j = 32 * half + col(nt, e);
          if (j <= i) {
            dls[i * kLdH64 + j] = from_float<bf16>(dl[nt][e] * rk[j]);
            dls[j * kLdH64 + i] = from_float<bf16>(dl[nt][e] * rk[i]);
          }
        }
      lo_t = row_sum(lo_t), hi_t = row_sum(hi_t), lo_m = row_sum(lo_m), hi_m = row_sum(hi_m);
      if (lane % 4 == 0) {
        dG[i_lo] += lo_t, dG[i_hi] += hi_t;
        db[i_lo] += lo_m, db[i_hi] += hi_m;
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float sum = col_sum(colsum[nt][e]);  // column j over this warp's 16 rows
          if (g == 0) dG_cols[(warp % 4) * kC + 32 * half + 8 * nt + c + e] = sum;
        }
    }
    // [dKb; dQe] = [-dR; scale dO] S^T: dk += diag(beta e) dKb, dq += diag(e) dQe, and their
    // K . dKb, Q . dQe terms to db and dG.
    const float e_lo = e_of(i_lo), e_hi = e_of(i_hi);
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const bf16* x_src = which ? qs : ks;
      Acc x[8];
      if (which) {
        std::uint32_t a[8][4];
        load_a_mk(a, dos, kLdH, r0);
        wgmma_kn_wait(x, a, half128(hs), kD, false);
      } else {
        wgmma_kn_wait(x, SmemA<8>{ndr}, half128(hs), kD, false);
      }
      const float scale = which ? p.scale : 1.0f;
      float lo = 0, hi = 0;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int j = 64 * half + 8 * nt + c;
        const float2 w_lo = qk_pair(x_src, i_lo, j), w_hi = qk_pair(x_src, i_hi, j);
#pragma unroll
        for (int e = 0; e < 4; ++e) x[nt][e] *= scale;
        lo += w_lo.x * x[nt][0] + w_lo.y * x[nt][1];
        hi += w_hi.x * x[nt][2] + w_hi.y * x[nt][3];
        Acc& out = which ? dq[nt] : dk[nt];
        const float f_lo = which ? e_lo : beta[i_lo] * e_lo,
                    f_hi = which ? e_hi : beta[i_hi] * e_hi;
        out[0] += f_lo * x[nt][0], out[1] += f_lo * x[nt][1];
        out[2] += f_hi * x[nt][2], out[3] += f_hi * x[nt][3];
      }
      const float* r = which ? rq : rk;  // the unit row's factor, for the dot with x_src
      lo = row_sum(lo) * e_lo * r[i_lo];
      hi = row_sum(hi) * e_hi * r[i_hi];
      if (lane % 4 == 0) {
        if (which) {
          dG[i_lo] += lo, dG[i_hi] += hi;
        } else {
          db[i_lo] += lo, db[i_hi] += hi;
          dG[i_lo] += beta[i_lo] * lo, dG[i_hi] += beta[i_hi] * hi;
        }
      }
    }
    __syncthreads();  // S^T and dO are done with: the next value head's come
    if (prefetch) {
      issue_state(hs, p.h, gi + 1);
      issue_do(gi + 1);
      cp_async_commit();
    }

    // dk += dpd^T Q + dls K;  dq += dpd K, with Q = diag(rq) q and K = diag(rk) k: dpd's rows
    // carry rq (dpd), its columns rk (dpk), and dls's columns rk.
    {
      std::uint32_t a1[4][4], a2[4][4], a3[4][4];  // all three in flight at once
      load_a_km(a1, dpd, kLdH64, r0);
      load_a_mk(a2, dls, kLdH64, r0);
      load_a_mk(a3, dpk, kLdH64, r0);
      wgmma_fence();
      wgmma_kn(dk, a1, half64(qs), kC, true);
      wgmma_kn(dk, a2, half64(ks), kC, true);
      wgmma_kn(dq, a3, half64(ks), kC, true);
      wgmma_commit();
      wgmma_wait<0>();
      fence_acc(dk);
      fence_acc(dq);
    }

    __syncthreads();  // A (dpd) and V (dpk) are done with: the next value head's come
    if (prefetch) {
      issue_a(gi + 1);
      issue_v(gi + 1);
      cp_async_commit();
    }
    if (warp == 0) {  // dG_{len-1} += extra; dg_j = sum_{j <= i < len} dG_i (a suffix scan)
      // The slots, added in a fixed order (the opening comment).
      auto dG_sum = [&](int i) {
        return (dG_rows[i] + dG_rows[kC + i]) -
               ((dG_cols[i] + dG_cols[kC + i]) + (dG_cols[2 * kC + i] + dG_cols[3 * kC + i]));
      };
      float gamma_grad = extra[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) gamma_grad += extra[w];
      float lo = lane < len ? dG_sum(lane) : 0.0f, hi = lane + 32 < len ? dG_sum(lane + 32) : 0.0f;
      if (lane == (len - 1) % 32) (len > 32 ? hi : lo) += gamma_grad;
      for (int offset = 1; offset < 32; offset *= 2) {
        const float a = __shfl_down_sync(0xffffffffu, lo, offset);
        const float b = __shfl_down_sync(0xffffffffu, hi, offset);
        if (lane + offset < 32) lo += a, hi += b;
      }
      lo += __shfl_sync(0xffffffffu, hi, 0);
      for (int i = lane; i < len; i += 32) {
        const long long r = v_row(p, info.b, info.t0 + i, hv);
        p.dg[r] = core::is_reset(g_raw[i]) ? 0.0f : i < 32 ? lo : hi;
        store_scalar(p.dbeta, r, p.beta_code, db_rows[i] + db_rows[kC + i]);
      }
    }
    __syncthreads();  // the next value head's tiles and dG, db wait for every warp
  }

  // dq, dk back through the l2norm (spec 1): dx <- r (dx - x_hat (x_hat . dx)), x_hat = x r,
  // with x the input rows q, k (bf16: the Q, K tiles; f16: staged in shared memory during the
  // last value head) and r = rq, rk. This lane's pairs of x are loaded once, all before the sums
  // that use them; a row's dot sums its 4 lanes, then the two halves in shared memory.
  auto x_pair = [&](int which, int i, int nt) {
    const int j = 64 * half + 8 * nt + c;
    if constexpr (std::is_same_v<In, bf16>)
      return qk_pair(which ? ks : qs, i, j);
    else
      return unpack2<In>(*reinterpret_cast<const std::uint32_t*>(xs + (which * kC + i) * kD + j));
  };
  float2 x[2][2][8];  // (q or k, row i_lo or i_hi, n-tile); padded rows are zero
  if (p.l2norm) {
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int which = 0; which < 2; ++which)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) x[which][h][nt] = x_pair(which, i_lo + 8 * h, nt);
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      const Acc* d = which ? dk : dq;
      float dot[2] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows i_lo, i_hi (r = 0 on padded rows)
        const float r = rs[which * kC + i_lo + 8 * h];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) {
          const float2 xp = x[which][h][nt];
          dot[h] += xp.x * r * d[nt][2 * h] + xp.y * r * d[nt][2 * h + 1];
        }
      }
      dot[0] = row_sum(dot[0]);
      dot[1] = row_sum(dot[1]);
      if (lane % 4 == 0) {
        dots[(2 * which + half) * kC + i_lo] = dot[0];
        dots[(2 * which + half) * kC + i_hi] = dot[1];
      }
    }
    __syncthreads();
  }
  // Stored through each warp's 1 KB of the S^T tile (free once the last value head is done).
  std::uint32_t* stage = reinterpret_cast<std::uint32_t*>(hs) + warp * 256;
#pragma unroll
  for (int which = 0; which < 2; ++which) {
    const Acc* d = which ? dk : dq;
    In* out = static_cast<In*>(which ? p.dk : p.dq);
    float dot[2], r[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i = i_lo + 8 * h;
      dot[h] = p.l2norm ? dots[2 * which * kC + i] + dots[(2 * which + 1) * kC + i] : 0.0f;
      r[h] = p.l2norm ? rs[which * kC + i] : 1.0f;
    }
#pragma unroll
    for (int pass = 0; pass < 2; ++pass)
      store_pass(
          stage, pass, r0, len,
          [&](int nt, int e) {
            const int h = e / 2;
            float d0 = d[nt][e], d1 = d[nt][e + 1];
            if (p.l2norm) {
              const float2 xp = x[which][h][nt];
              d0 = r[h] * (d0 - xp.x * r[h] * dot[h]);
              d1 = r[h] * (d1 - xp.y * r[h] * dot[h]);
            }
            return pack2<In>(d0, d1);
          },
          [&](int i) { return out + (row + static_cast<long long>(i) * p.HK) * kD + 64 * half; });
  }
}

}  // namespace

template <typename In>
void launch_grad_chunk(const Params& p, cudaStream_t stream) {
  auto kernel = grad_chunk_kernel<In>;
  GDN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, GradSmem::bytes));
  const int places = std::min(p.round_slots, 65535);
  launch_dependent(kernel, dim3(p.HK, places, (p.round_slots + places - 1) / places), kThreads,
                   GradSmem::bytes, stream, p);
}

template void launch_grad_chunk<bf16>(const Params&, cudaStream_t);
template void launch_grad_chunk<__half>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
