// The launches of the reverse chunk-serial pass (state_backward.cuh).
#include "cuda/check.h"
#include "cuda/kernels.h"
#include "cuda/launch.cuh"
#include "cuda/state_backward.cuh"

namespace gdn::cuda {
namespace {

using namespace state_pass;

template <typename In, bool kSummary>
__global__ void __launch_bounds__(kThreads, 1) state_backward_kernel(Params p) {
  begin_dependent();  // launch.cuh
  state_backward_block<In, kSummary>(p, blockIdx.x, blockIdx.y);
}

}  // namespace

template <typename In, bool kSummary>
void launch_state_backward(const Params& p, cudaStream_t stream) {
  auto kernel = state_backward_kernel<In, kSummary>;
  GDN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Ring<kBackwardStages>::smem_bytes));
  const int blocks = kSummary ? p.N * p.seg_count : p.beside ? 1 : round_blocks(p);
  launch_dependent(kernel, dim3(p.HV, blocks), kThreads, Ring<kBackwardStages>::smem_bytes, stream,
                   p);
}

template void launch_state_backward<bf16, false>(const Params&, cudaStream_t);
template void launch_state_backward<bf16, true>(const Params&, cudaStream_t);
template void launch_state_backward<__half, false>(const Params&, cudaStream_t);
template void launch_state_backward<__half, true>(const Params&, cudaStream_t);

}  // namespace gdn::cuda
