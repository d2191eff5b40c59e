// The device checks of the public CUDA entry points (cuda/device.h).
#include "cuda/device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cuda/check.h"
#include "gdn/cuda.h"
#include "gdn/error.h"

namespace gdn {
namespace cuda {

std::string hopper_mismatch(int device, const std::string& name, int major, int minor) {
  if (major == 9 && minor == 0) return {};
  return "gdn's CUDA kernels need a Hopper GPU (sm_90); device " + std::to_string(device) + " is " +
         name + " (sm_" + std::to_string(major) + std::to_string(minor) + ")";
}

int require_hopper() {
  int device = 0;
  GDN_CUDA_CHECK(cudaGetDevice(&device));
  // Devices this thread found to be Hopper GPUs: no lock on the way of every call.
  thread_local std::uint64_t verified = 0;
  const bool small = device >= 0 && device < 64;
  if (small && (verified >> device & 1u)) return device;
  static std::mutex mutex;
  static std::map<int, std::string> verdicts;  // device -> "" or the error
  std::string verdict;
  {
    const std::lock_guard lock(mutex);
    auto it = verdicts.find(device);
    if (it == verdicts.end()) {
      int major = 0, minor = 0;
      GDN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
      GDN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
      std::string name = "an unnamed device";
      cudaDeviceProp prop{};
      // The name only for the message (the properties take milliseconds).
      if (!hopper_mismatch(device, name, major, minor).empty()) {
        if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
          name = prop.name;
        else
          (void)cudaGetLastError();
      }
      it = verdicts.emplace(device, hopper_mismatch(device, name, major, minor)).first;
    }
    verdict = it->second;
  }
  if (!verdict.empty()) throw Error(verdict);
  if (small) verified |= std::uint64_t{1} << device;
  return device;
}

int device_of(const void* p) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  GDN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  cudaPointerAttributes where{};
  const cudaError_t status = cudaPointerGetAttributes(&where, p);
  GDN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // not an address the driver knows
    return -1;
  }
  return where.type == cudaMemoryTypeDevice ? where.device : -1;
}

DeferredError* deferred_errors() {
  static DeferredError* const box = [] {
    // A stream capture in the thread's default (global) mode forbids allocations that it cannot
    // record: this one is not part of any call's work, so allocate it in relaxed mode.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    GDN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    void* p = nullptr;
    // Under unified addressing (every 64-bit platform CUDA supports) the host address of
    // mapped, portable pinned memory is valid on every device.
    const cudaError_t status =
        cudaHostAlloc(&p, sizeof(DeferredError), cudaHostAllocMapped | cudaHostAllocPortable);
    GDN_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    GDN_CUDA_CHECK(status);
    std::memset(p, 0, sizeof(DeferredError));
    return static_cast<DeferredError*>(p);  // kept for the process's life
  }();
  return box;
}

namespace {

const char* const kFieldNames[kHeaderFields] = {
    "the header's magic number",
    "the device",
    "B",
    "T",
    "HK",
    "HV",
    "K",
    "V",
    "chunk_size",
    "the number of sequences",
    "the number of chunk slots (with cu_seqlens: both calls must give cu_seqlens_host, or "
    "neither)",
    "the number of segments per sequence (the forward and the backward must agree on "
    "save_for_backward)",
    "the segment length in chunks (the forward and the backward must agree on "
    "save_for_backward)",
    "the number of transfer parts per segment (the forward and the backward must agree on "
    "save_for_backward)",
    "use_qk_l2norm",
    "whether initial_state is given",
    "whether cu_seqlens is given",
    "whether cu_seqlens is i64",
    "whether the per-chunk states were saved (the backward has save_for_backward, the forward "
    "did not)",
    "whether a carried state enters",
    "whether a carried state leaves",
    "q's dtype",
    "beta's dtype",
    "scale",
};

std::string value_of(int field, int value) {
  if (field == kDtype) return value == 1 ? "bf16" : value == 2 ? "f16" : std::to_string(value);
  if (field == kBetaDtype)
    return value == 0 ? "f32" : value == 1 ? "bf16" : value == 2 ? "f16" : std::to_string(value);
  if (field == kScale) {
    float scale = 0;
    std::memcpy(&scale, &value, sizeof scale);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(scale));
    return buf;
  }
  return std::to_string(value);
}

}  // namespace

std::string deferred_message(const DeferredError& e) {
  std::string what = "a backward enqueued earlier on device " + std::to_string(e.device) +
                     " was handed a forward_workspace that does not belong to its inputs: ";
  if (e.field == kMagic) {
    what +=
        "it holds no forward's header (it must be the workspace of a delta_rule_forward_cuda of "
        "these inputs, as that forward left it)";
  } else if (e.field >= 0 && e.field < kHeaderFields) {
    what += std::string(kFieldNames[e.field]) + " is " + value_of(e.field, e.values[0]) +
            " in the forward that wrote it and " + value_of(e.field, e.values[1]) +
            " in the backward";
  } else {
    auto tokens = [](int begin, int len) {  // appends: GCC 12 misreads "[" + std::string
      std::string t = "[";
      t += std::to_string(begin);
      t += ", ";
      t += std::to_string(begin + len);
      t += ")";
      return t;
    };
    what += "cu_seqlens differ: sequence " + std::to_string(e.sequence) + " is tokens " +
            tokens(e.values[0], e.values[1]) + " in the forward that wrote it and " +
            tokens(e.values[2], e.values[3]) + " in the backward";
  }
  return what + ". That backward computed nothing and set its gradients to NaN";
}

void raise_deferred_errors() {
  volatile DeferredError* box = deferred_errors();
  if (box->state != 2) return;
  std::atomic_thread_fence(std::memory_order_acquire);
  DeferredError e{};
  e.device = box->device;
  e.field = box->field;
  e.sequence = box->sequence;
  for (int i = 0; i < 4; ++i) e.values[i] = box->values[i];
  box->state = 0;
  throw Error(deferred_message(e));
}

}  // namespace cuda

void cuda_check_deferred_errors() {
  cuda::raise_deferred_errors();
}

}  // namespace gdn
