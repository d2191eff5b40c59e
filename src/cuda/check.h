#pragma once
// One error-check family for CUDA calls and launches: the expression, file and line in gdn::Error.

#include <cuda_runtime.h>

#include <string>

#include "gdn/error.h"

namespace gdn::cuda {

inline void check(cudaError_t status, const char* expression, const char* file, int line) {
  if (status != cudaSuccess)
    throw Error(std::string(expression) + " failed at " + file + ":" + std::to_string(line) + ": " +
                cudaGetErrorString(status));
}

}  // namespace gdn::cuda

#define GDN_CUDA_CHECK(expr) ::gdn::cuda::check((expr), #expr, __FILE__, __LINE__)
#define GDN_CUDA_CHECK_LAUNCH() GDN_CUDA_CHECK(cudaGetLastError())
