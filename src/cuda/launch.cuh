#pragma once
// Programmatic dependent launch (PDL) for the kernels of one call, which run back to back on a
// stream: launched so, a kernel's blocks may start (and be scheduled onto SMs the kernel before
// frees) before that kernel ends, which hides the launch latency between the two, a few
// microseconds a kernel boundary. Every kernel launched so calls begin_dependent() first thing,
// before any early return and any access to global memory: griddepcontrol.wait returns once the
// kernel before has completed and its writes are visible, so the order between kernels (and,
// through each kernel waiting, between any two of them) is what plain launches give. The kernel
// then lets the next one launch at once (launch_dependents): all its own blocks are resident by
// then, so the next one's waiting blocks take only SMs it does not need.
#include <cuda_runtime.h>

#include "cuda/check.h"

namespace gdn::cuda {

__device__ inline void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
__device__ inline void begin_dependent() {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  launch_dependents();
}

template <typename... Args>
void launch_dependent(void (*kernel)(Args...), dim3 grid, dim3 block, int smem, cudaStream_t stream,
                      Args... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = static_cast<std::size_t>(smem);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  GDN_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace gdn::cuda
