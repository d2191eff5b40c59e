// Per (chunk, key head): the staging of q and k, then, for each value head of the group,
// everything that does not depend on the state (spec 3):
//   G = chunk-local cumsum(g),  L = strictly_lower(diag(beta) K K^T * exp(G_i - G_j)),
//   A = (I + L)^-1,  P = scale (Q K^T) * exp(G_i - G_j) on and below the diagonal,
// stored as G, beta and the gates (f32, params.cuh) and A, P (bf16) for the state passes and the
// gradient kernel. Full resets (g <= -128, -inf included; core/reset.h): G is scanned as H, the
// sum of the other g, and R, the resets so far; the decays come from H within a segment and are
// exactly 0 across a reset, and the G stored for the gradient kernel is H - 128 R (whose decays
// across a reset are exp(<= -128) = 0 in float32).
// K and Q are the unit rows diag(rk) k, diag(rq) q (spec 1: r = rsqrt(sum(x^2) + 1e-6), or 1
// without l2norm) of the rows k, q as they come, which stay bf16 (f16 is rounded to bf16) in qn,
// kn; every product takes the factors in f32 (K K^T = diag(rk) k k^T diag(rk), and the gates e
// rk, e rq, f rk, beta e rk), so that no unit row is rounded to bf16 (that rounding cost a
// quarter of the forward's accuracy, bench/rounding.py). k k^T and q k^T are computed once for
// the group and share their k^T fragments (mma.sync). A is inverted in 16 x 16 blocks: forward
// substitution in f32 on the diagonal blocks, then by block diagonals d = 1, 2, 3 on tensor cores
// (bf16 operands, f32 sums), A_ij = -A_ii sum_{j <= m < i} L_im A_mj, computed transposed so that
// the sum stays in registers: A_ij^T = -(sum_m A_mj^T L_im^T) A_ii^T.
#include "core/reset.h"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/mma.cuh"

namespace gdn::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kLdDiag = 16 * 16 + 16;  // floats from one diagonal block of L to the next (banks)
// A block asks L2 for the rows of the block this far on (a quarter of the 4 x 132 resident on an
// H100), which starts about 4 us later: 256 and 128 took 2-4% off chunk_prep's forwards, 512 put
// 3-5% on (bench/RESULTS.md, forty-third session).
constexpr int kPrefetchAhead = 128;

// The k and q tiles hold the inputs (In), then in place k and q as bf16.
struct PrepSmem {
  static constexpr int ks = 0;                       // [64][136]  k, then A (bf16 [64][72])
  static constexpr int qs = ks + kC * kLdH * 2;      // [64][136]  q, then P (bf16 [64][72])
  static constexpr int lb = qs + kC * kLdH * 2;      // bf16 [64][72]   L
  static constexpr int l = lb + kC * kLdH64 * 2;     // f32 [4][272]    L's diagonal blocks
  static constexpr int gates = l + 4 * kLdDiag * 4;  // f32 H[64], R[64], beta[64], rq[64], rk[64]
  static constexpr int bytes = gates + 5 * kC * 4;
};
// Four blocks a multiprocessor (16 warps) hide more of each block's latency than three did.
static_assert(4 * (PrepSmem::bytes + 1024) <= 228 * 1024, "four blocks fit in an SM");

// One exchange of a half-warp's reduce-scatter of 16 sums (kHalf = 8, 4, 2, 1 in turn): the lane
// keeps sums [0, kHalf), or [kHalf, 2 kHalf) where `upper` (its bit kHalf), adds the other lane's
// share of them, and holds the results in [0, kHalf). (A template, so that every index is a
// constant: in a loop over kHalf ptxas put the sums in local memory.)
template <int kHalf>
__device__ inline void scatter_step(float (&sum)[16], bool upper) {
#pragma unroll
  for (int v = 0; v < kHalf; ++v) {
    const float keep = upper ? sum[v + kHalf] : sum[v];
    const float give = upper ? sum[v] : sum[v + kHalf];
    sum[v] = keep + __shfl_xor_sync(0xffffffffu, give, kHalf);
  }
}

// Inclusive cumsums of the 64 values of H (warp 0) and of R (warp 1), two values per lane.
__device__ inline void chunk_cumsum(float* H, float* R) {
  if (threadIdx.x >= 64) return;
  const int lane = threadIdx.x % 32;
  float* G = threadIdx.x < 32 ? H : R;
  float lo = G[lane], hi = G[lane + 32];
  for (int offset = 1; offset < 32; offset *= 2) {
    const float a = __shfl_up_sync(0xffffffffu, lo, offset);
    const float b = __shfl_up_sync(0xffffffffu, hi, offset);
    if (lane >= offset) lo += a, hi += b;
  }
  hi += __shfl_sync(0xffffffffu, lo, 31);
  G[lane] = lo;
  G[lane + 32] = hi;
}

// ab = (I + L)^-1 (bf16, row stride kLdH64, zero above the diagonal on entry) from L's diagonal
// 16 x 16 blocks in f32 (l: block b's row r at l + b kLdDiag + 16 r) and all of L in bf16 (lb).
__device__ inline void invert_unit_lower(const float* l, const bf16* lb, bf16* ab) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < kC) {  // diagonal block b, column c: forward substitution in registers
    const int b = tid / 16, c = tid % 16, o = 16 * b;
    float col[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {  // four partial sums: a row's chain of r products in r / 4
      float sum[4] = {r == c ? 1.0f : 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < r; ++j) sum[j % 4] -= l[b * kLdDiag + 16 * r + j] * col[j];
      col[r] = (sum[0] + sum[1]) + (sum[2] + sum[3]);
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) ab[(o + r) * kLdH64 + o + c] = from_float<bf16>(col[r]);
  }
  __syncthreads();
  for (int d = 1; d < 4; ++d) {  // warp j takes block (i, j) = (j + d, j)
    const int j = warp, i = j + d;
    if (i < 4) {
      Acc y[2] = {};  // Y^T = sum_m A_mj^T L_im^T
      for (int m = j; m < i; ++m) {
        std::uint32_t a[4], b0[2], b1[2];
        ldmatrix_x4_trans(a, a_rows_km(ab, kLdH64, 16 * j, 16 * m));
        ldmatrix_x2(b0, b_rows_nk(lb, kLdH64, 16 * i, 16 * m));
        ldmatrix_x2(b1, b_rows_nk(lb, kLdH64, 16 * i + 8, 16 * m));
        mma(y[0], a, b0[0], b0[1]);
        mma(y[1], a, b1[0], b1[1]);
      }
      std::uint32_t ya[4], b0[2], b1[2];
      acc_to_a(ya, y, 0, [](int) { return -1.0f; });
      ldmatrix_x2(b0, b_rows_nk(ab, kLdH64, 16 * i, 16 * i));
      ldmatrix_x2(b1, b_rows_nk(ab, kLdH64, 16 * i + 8, 16 * i));
      Acc x[2] = {};  // A_ij^T = -Y^T A_ii^T
      mma(x[0], ya, b0[0], b0[1]);
      mma(x[1], ya, b1[0], b1[1]);
      const int r = lane / 4, c = 2 * (lane % 4);
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e)  // x(row 16 j + r + 8 (e / 2), col 16 i + 8 h + c + e % 2)
          ab[(16 * i + 8 * h + c + e % 2) * kLdH64 + 16 * j + r + 8 * (e / 2)] =
              from_float<bf16>(x[h][e]);
    }
    __syncthreads();
  }
}

// 64 rows of 64 bf16 from a padded shared tile to contiguous global memory.
__device__ inline void store_tile64(bf16* dst, const bf16* src) {
  for (int idx = threadIdx.x; idx < kC * 8; idx += kThreads) {
    const int r = idx / 8, part = idx % 8;
    *reinterpret_cast<uint4*>(dst + r * kC + part * 8) =
        *reinterpret_cast<const uint4*>(src + r * kLdH64 + part * 8);
  }
}

template <typename In>
__global__ void __launch_bounds__(kThreads, 4) chunk_prep_kernel(Params p) {
  begin_dependent();  // launch.cuh
  // The key heads of a chunk are consecutive blocks, which run side by side: the 32-byte sectors
  // of g, beta (a value head's entries 4 or 2 bytes apart) and of the factors rq, rk (a key head's
  // 4 bytes apart) that they share meet in L2, instead of each block reading whole sectors from
  // memory for its 4 or 8 bytes, and writing partial ones.
  const int cid = blockIdx.x / p.HK, hk = blockIdx.x % p.HK, tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const ChunkInfo info = p.chunks[cid];
  if (info.len == 0) return;
  const int group = p.HV / p.HK, len = info.len, b = info.b, t0 = info.t0;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* ks = reinterpret_cast<bf16*>(smem + PrepSmem::ks);
  bf16* qs = reinterpret_cast<bf16*>(smem + PrepSmem::qs);
  float* L = reinterpret_cast<float*>(smem + PrepSmem::l);
  float* H = reinterpret_cast<float*>(smem + PrepSmem::gates);  // G without the resets
  float* R = H + kC;                                            // the resets up to each row
  float* beta = R + kC;
  float* rq = beta + kC;  // the l2norm's row factors (0 on padded rows)
  float* rk = rq + kC;

  // g and beta of row tid, loaded a value head ahead; padded rows: g = 0 (G keeps its last
  // value) and beta = 0.
  float g_next = 0.0f, beta_next = 0.0f;
  auto fetch = [&](int hv) {
    if (tid < len) {
      const long long r = v_row(p, b, t0 + tid, hv);
      g_next = p.g[r];
      beta_next = load_scalar(p.beta, r, p.beta_code);
    }
  };
  fetch(hk * group);

  // f16 q, k to bf16, in place and to qn_copy, kn_copy (rows < len; bf16 ones are read where
  // they are); r = rsqrt(sum x^2 + 1e-6) with l2norm (spec 1), else 1, to rq, rk and to shared
  // memory; padded rows stay zero. Half a warp per row and 8 elements (16 bytes) a lane: a thread
  // takes piece tid % 16 of rows tid / 16 + 8 j of q and of k, 16 partial sums, which the half-warp
  // reduces and scatters at once: at each of the four exchanges a lane keeps half of its sums
  // (those of its side of the exchange) and adds the other lane's halves of them, so that lane
  // `part` ends with the whole sum of row (w, j) = (part / 8, part % 8), the same tree of additions
  // as a butterfly, in 15 shuffles instead of 64. (A butterfly left every sum on every lane, and
  // 16 predicated copies of the factor's store cost 430 instructions a warp: a tenth of a block's.)
  const long long row = qk_row(p, b, t0, hk);
  issue_rows<kD, kC, kThreads>(ks, kLdH, static_cast<const In*>(p.k) + row * kD, p.HK * kD, len);
  issue_rows<kD, kC, kThreads>(qs, kLdH, static_cast<const In*>(p.q) + row * kD, p.HK * kD, len);
  cp_async_commit();
  {  // the q, k rows, g and beta of the block kPrefetchAhead blocks on, into L2 (common.cuh)
    const int ahead = blockIdx.x + kPrefetchAhead, hk2 = ahead % p.HK, r = tid % kC;
    const ChunkInfo next = ahead < gridDim.x ? p.chunks[ahead / p.HK] : ChunkInfo{};
    if (r < next.len) {
      const long long qk2 = qk_row(p, next.b, next.t0 + r, hk2);
      prefetch_l2(static_cast<const In*>(tid < kC ? p.q : p.k) + qk2 * kD, kD * sizeof(In));
      const long long v2 = v_row(p, next.b, next.t0 + r, hk2 * (p.HV / p.HK));
      if (tid < kC)
        prefetch_line(p.g + v2);
      else
        prefetch_line(static_cast<const char*>(p.beta) + v2 * (p.beta_code == 0 ? 4 : 2));
    }
  }
  cp_async_wait<0>();
  __syncthreads();
  {
    constexpr int kRows = kC / (kThreads / 16);  // rows of q (w = 0) and of k (w = 1) a thread
    static_assert(2 * kRows == 16, "a half-warp's lanes hold one sum each in the end");
    const int part = tid % 16, i0 = tid / 16;
    float sum[2 * kRows];  // sum[kRows w + j]: this piece of row i0 + 8 j of q (w = 0) or k
#pragma unroll
    for (int j = 0; j < kRows; ++j)
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const int i = i0 + 8 * j;
        bf16* x = (w ? ks : qs) + i * kLdH + part * 8;
        const uint4 raw = *reinterpret_cast<const uint4*>(x);
        const In* in = reinterpret_cast<const In*>(&raw);
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) s += to_float(in[e]) * to_float(in[e]);
        sum[kRows * w + j] = s;
        if constexpr (!std::is_same_v<In, bf16>) {
          uint4 out;
          bf16* o = reinterpret_cast<bf16*>(&out);
#pragma unroll
          for (int e = 0; e < 8; ++e) o[e] = from_float<bf16>(to_float(in[e]));
          *reinterpret_cast<uint4*>(x) = out;
          if (i < len)
            *reinterpret_cast<uint4*>((w ? p.kn_copy : p.qn_copy) + (row + i * p.HK) * kD +
                                      part * 8) = out;
        }
      }
    scatter_step<8>(sum, part & 8);
    scatter_step<4>(sum, part & 4);
    scatter_step<2>(sum, part & 2);
    scatter_step<1>(sum, part & 1);
    const int w = part / kRows, i = i0 + 8 * (part % kRows);
    const float r = p.l2norm ? rsqrtf(sum[0] + 1e-6f) : 1.0f;
    (w ? rk : rq)[i] = i < len ? r : 0.0f;
    if (i < len) (w ? p.rk : p.rq)[row + i * p.HK] = r;
  }
  __syncthreads();

  // k k^T and q k^T for rows 16 warp .. 16 warp + 15, kept for every value head.
  Acc kk[8] = {}, qk[8] = {};
#pragma unroll
  for (int kp = 0; kp < 4; ++kp) {
    std::uint32_t ak[2][4], aq[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      ldmatrix_x4(ak[j], a_rows_mk(ks, kLdH, 16 * warp, 32 * kp + 16 * j));
      ldmatrix_x4(aq[j], a_rows_mk(qs, kLdH, 16 * warp, 32 * kp + 16 * j));
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      std::uint32_t bk[4];
      ldmatrix_x4(bk, b_rows_nk(ks, kLdH, 8 * nt, 32 * kp));
      mma(kk[nt], ak[0], bk[0], bk[1]);
      mma(kk[nt], ak[1], bk[2], bk[3]);
      mma(qk[nt], aq[0], bk[0], bk[1]);
      mma(qk[nt], aq[1], bk[2], bk[3]);
    }
  }
  __syncthreads();  // every warp is done with K and Q: their tiles take A, P and L
  bf16* ab = ks;
  bf16* pb = qs;
  bf16* lb = reinterpret_cast<bf16*>(smem + PrepSmem::lb);
  // invert_unit_lower writes only on and below the diagonal blocks: the rest stays zero.
  for (int idx = tid; idx < kC * 8; idx += kThreads)
    *reinterpret_cast<uint4*>(ab + idx / 8 * kLdH64 + idx % 8 * 8) = uint4{0, 0, 0, 0};

  for (int gi = 0; gi < group; ++gi) {
    const int hv = hk * group + gi;
    const long long s = slot(p, cid, hv);
    if (tid < kC) {  // a NaN g is no reset: it spreads like any NaN (spec 7)
      const bool reset = core::is_reset(g_next);
      H[tid] = reset ? 0.0f : g_next;
      R[tid] = reset ? 1.0f : 0.0f;
      beta[tid] = beta_next;
    }
    if (gi + 1 < group) fetch(hv + 1);
    __syncthreads();  // also: the previous head is done with L, P and A
    chunk_cumsum(H, R);
    __syncthreads();
    // exp(G_i - G_j) for j <= i: exp(H_i - H_j) without a reset in (j, i], else 0.
    auto decay = [&](int i, int j) {
      return j <= i && R[i] == R[j] ? exp_ftz(H[i] - H[j]) : 0.0f;  // mask before exp
    };
    if (tid < kC) {
      const float e = R[tid] == 0.0f ? exp_ftz(H[tid]) : 0.0f;
      p.G[s * kC + tid] = H[tid] - core::kResetLogDecay * R[tid];
      p.bt[s * kC + tid] = beta[tid];
      float* gates = p.gates + s * kGates * kC + tid;
      gates[kGateE * kC] = e;
      gates[kGateEK * kC] = e * rk[tid];
      gates[kGateEQ * kC] = e * rq[tid];
      gates[kGateFK * kC] = decay(kC - 1, tid) * rk[tid];
      gates[kGateBEK * kC] = beta[tid] * e * rk[tid];
    }
    {  // this lane's rows i (2), column pairs j, j + 1 (8); the decays masked before the exp
      const int c = 2 * (lane % 4);
      int i[2];
      float Hi[2], Ri[2], bi[2], qi[2];  // bi = beta_i rk_i, qi = scale rq_i
      for (int h = 0; h < 2; ++h) {
        i[h] = 16 * warp + lane / 4 + 8 * h;
        Hi[h] = H[i[h]], Ri[h] = R[i[h]], bi[h] = beta[i[h]] * rk[i[h]];
        qi[h] = p.scale * rq[i[h]];
      }
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        const int j = 8 * nt + c;
        const float2 Hj = *reinterpret_cast<const float2*>(H + j);
        const float2 Rj = *reinterpret_cast<const float2*>(R + j);
        const float2 kj = *reinterpret_cast<const float2*>(rk + j);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float l[2], q[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float hj = e ? Hj.y : Hj.x, rj = e ? Rj.y : Rj.x;
            const bool on = j + e <= i[h] && Ri[h] == rj;
            const float d = exp_ftz(on ? Hi[h] - hj : -INFINITY) * (e ? kj.y : kj.x);
            l[e] = j + e < i[h] ? bi[h] * kk[nt][2 * h + e] * d : 0.0f;
            q[e] = qi[h] * qk[nt][2 * h + e] * d;
          }
          if (nt / 2 == warp)  // rows i are in diagonal block `warp`: its f32 copy
            *reinterpret_cast<float2*>(L + warp * kLdDiag + 16 * (i[h] % 16) + 8 * (nt % 2) + c) =
                make_float2(l[0], l[1]);
          *reinterpret_cast<__nv_bfloat162*>(lb + i[h] * kLdH64 + j) =
              __floats2bfloat162_rn(l[0], l[1]);
          *reinterpret_cast<__nv_bfloat162*>(pb + i[h] * kLdH64 + j) =
              __floats2bfloat162_rn(q[0], q[1]);
        }
      }
    }
    __syncthreads();
    store_tile64(p.P + s * kC * kC, pb);
    invert_unit_lower(L, lb, ab);
    store_tile64(p.A + s * kC * kC, ab);
  }
}

}  // namespace

template <typename In>
void launch_chunk_prep(const Params& p, cudaStream_t stream) {
  GDN_CUDA_CHECK(cudaFuncSetAttribute(
      chunk_prep_kernel<In>, cudaFuncAttributeMaxDynamicSharedMemorySize, PrepSmem::bytes));
  launch_dependent(chunk_prep_kernel<In>, dim3(p.NC * p.HK), kThreads, PrepSmem::bytes, stream, p);
}

template void launch_chunk_prep<bf16>(const Params&, cudaStream_t);
template void launch_chunk_prep<__half>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
