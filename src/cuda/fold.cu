// The serial composition of the segment summaries (spec 4; state_pass.cuh), one block per
// (value head, sequence, slice of 8, 16 or 32 columns of the state: segments.h fold_tiles), with
// affine.cuh's steps. Segment k of sequence n is z = z0 + k (z0 = n seg_count); last is its final
// segment. Forward, the state entering segment k + 1 is S(k + 1) = M_k S(k) + N_k; backward, the
// gradient leaving segment k - 1 is dS(k - 1) = M_k^T dS(k) + D_k, each M_k in seg_parts factors
// (segments.h), a step each. The summary passes store N_0 (from h0) in seg_state[z0 + 1] and, for
// a last segment summarized, D_last (from dS_T) in seg_dstate[z0 + last - 1].
//
//   states:       seg_state[z0 + k + 1] for k < last, from seg_state[z0 + 1]; when n enters with
//                 a carried state (in its h0 row), from h0 with the step k = 0 first.
//   grad_states:  seg_dstate[z0 + k - 1] for k >= 1, from seg_dstate[z0 + last - 1]; when n
//                 leaves (its carried gradient in its dht row), from dS_T with the step k = last.
//   map_offset:   for a leaving n, N of its rank map: the state leaving its last segment.
//   map_transfer: for a leaving n, M of its rank map: M_last ... M_0 when n enters, else 0.
//   grad_offset:  for an entering n, G of its backward map: the gradient entering segment 0.
#include "cuda/affine.cuh"
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/segments.h"
#include "cuda/state_pass.cuh"

namespace gdn::cuda {
namespace {

using state_pass::segment_matrix;
using state_pass::sequence_matrix;

template <Fold kFold, int kTiles>
__global__ void __launch_bounds__(affine::kThreads) fold_kernel(Params p) {
  begin_dependent();  // launch.cuh
  const int hv = blockIdx.x, n = blockIdx.y, j0 = blockIdx.z * affine::Smem<kTiles>::kSlice;
  const int chunks = p.chunk_begin[n + 1] - p.chunk_begin[n];
  const int last = (chunks + p.seg_len - 1) / p.seg_len - 1, z0 = n * p.seg_count;
  if (chunks == 0) return;
  // Transfer steps in a flat order over (segment k, part j): f = k R + j. M_k = M_k,R-1 ... M_k,0,
  // so a forward chain takes a segment's parts in rising f and a transposed one in falling f;
  // a segment's offset (and output) goes with the step of its last part taken. R is a power of
  // two, so that f's segment and part are a shift and a mask (divisions were 0.35 us a step).
  const int R = p.seg_parts, shift = __ffs(R) - 1;
  auto seg_of = [&](int f) { return f >> shift; };
  auto part_of = [&](int f) { return f & (R - 1); };
  auto M = [&](int f) -> const float* {
    return state_pass::transfer_matrix(p, z0 + seg_of(f), part_of(f), hv);
  };
  auto local = [&](int k) { return segment_matrix(p.seg_local, p, z0 + k, hv); };
  auto state = [&](int k) { return segment_matrix(p.seg_state, p, z0 + k, hv); };
  auto dlocal = [&](int k) { return segment_matrix(p.seg_dlocal, p, z0 + k, hv); };
  auto dstate = [&](int k) { return segment_matrix(p.seg_dstate, p, z0 + k, hv); };
  auto none = [](int) -> float* { return nullptr; };
  const long long map = static_cast<long long>(chain(p, n)) * p.HV + hv;
  extern __shared__ __align__(16) unsigned char smem[];
  auto& X = *reinterpret_cast<affine::Smem<kTiles>*>(smem);

  if constexpr (kFold == Fold::states) {  // k = first .. last - 1, f rising from first R
    const bool carried = enters(p, n);
    if (last < (carried ? 1 : 2)) return;
    const int first = carried ? 0 : 1;
    auto ends = [&](int u) { return part_of(u) == R - 1; };
    auto k = [&](int u) { return first + seg_of(u); };
    affine::load(X, carried ? sequence_matrix(p.h0, p, n, hv) : state(1), j0);
    affine::chain<false>(
        X, (last - first) * R, [&](int u) { return M(first * R + u); },
        [&](int u) { return !ends(u)    ? nullptr
                            : k(u) == 0 ? state(1)
                                        : local(k(u)); },
        [&](int u) { return ends(u) ? state(k(u) + 1) : nullptr; }, j0);
  } else if constexpr (kFold == Fold::grad_states) {  // k = first .. 1, f falling
    const bool carried = leaves(p, n);
    if (last < (carried ? 1 : 2)) return;
    const int first = carried ? last : last - 1;
    auto f = [&](int u) { return (first + 1) * R - 1 - u; };
    auto ends = [&](int u) { return part_of(f(u)) == 0; };
    affine::load(X, carried ? sequence_matrix(p.dht, p, n, hv) : dstate(last - 1), j0);
    affine::chain<true>(
        X, first * R, [&](int u) { return M(f(u)); },
        [&](int u) {
          return !ends(u)               ? nullptr
                 : seg_of(f(u)) == last ? dstate(last - 1)
                                        : dlocal(seg_of(f(u)));
        },
        [&](int u) { return ends(u) ? dstate(seg_of(f(u)) - 1) : nullptr; }, j0);
  } else if constexpr (kFold == Fold::map_offset) {  // k = 1 .. last, f rising from R
    if (!leaves(p, n)) return;
    affine::load(X, last == 0 ? local(0) : state(1), j0);
    const int b = affine::chain<false>(
        X, last * R, [&](int u) { return M(R + u); },
        [&](int u) { return part_of(u) == R - 1 ? local(1 + seg_of(u)) : nullptr; }, none, j0);
    affine::store(X, b, p.map_N + map * kD * kD, j0);
  } else if constexpr (kFold == Fold::map_transfer) {  // k = 0 .. last when n enters
    if (!leaves(p, n)) return;
    const bool carried = enters(p, n);
    affine::load(X, carried ? M(0) : nullptr, j0);
    const int b = affine::chain<false>(
        X, carried ? (last + 1) * R - 1 : 0, [&](int u) { return M(1 + u); }, none, none, j0);
    affine::store(X, b, p.map_M + map * kD * kD, j0);
  } else {  // grad_offset: k = last - 1 .. 0, f falling from last R - 1
    if (!enters(p, n)) return;
    auto f = [&](int u) { return last * R - 1 - u; };
    affine::load(X, last == 0 ? dlocal(0) : dstate(last - 1), j0);
    const int b = affine::chain<true>(
        X, last * R, [&](int u) { return M(f(u)); },
        [&](int u) { return part_of(f(u)) == 0 ? dlocal(seg_of(f(u))) : nullptr; }, none, j0);
    affine::store(X, b, p.map_N + map * kD * kD, j0);
  }
}

template <int kTiles>
void launch_fold_tiles(const Params& p, Fold fold, cudaStream_t stream) {
  constexpr void (*kKernels[])(Params) = {
      fold_kernel<Fold::states, kTiles>, fold_kernel<Fold::grad_states, kTiles>,
      fold_kernel<Fold::map_offset, kTiles>, fold_kernel<Fold::map_transfer, kTiles>,
      fold_kernel<Fold::grad_offset, kTiles>};
  const auto kernel = kKernels[static_cast<int>(fold)];
  constexpr int smem = affine::kSmemBytes<kTiles>;
  GDN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  launch_dependent(kernel, dim3(p.HV, p.N, kD / affine::Smem<kTiles>::kSlice), affine::kThreads,
                   smem, stream, p);
}

}  // namespace

void launch_fold(const Params& p, Fold fold, cudaStream_t stream) {
  if (p.fold_tiles == 4)
    launch_fold_tiles<4>(p, fold, stream);
  else if (p.fold_tiles == 2)
    launch_fold_tiles<2>(p, fold, stream);
  else
    launch_fold_tiles<1>(p, fold, stream);
}

}  // namespace gdn::cuda
