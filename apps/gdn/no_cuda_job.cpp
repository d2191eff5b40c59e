#include "cuda_job.h"
#include "gdn/error.h"

namespace gdn::app {

namespace {
[[noreturn]] void no_cuda() {
  throw Error("--device cuda: gdn was built without CUDA (configure with nvcc found, GDN_CUDA=ON)");
}
}  // namespace

void require_cuda_gpu() {
  no_cuda();
}
ProblemResults run_on_cuda(const ProblemData&, bool, CudaTimes&) {
  no_cuda();
}
ProblemResults run_cp_on_cuda(const ProblemData&, int, Communicator*, const CpOptions&, bool, int,
                              Timeout, CpStats&) {
  no_cuda();
}
bool one_gpu_per_rank(int) {
  return false;
}

}  // namespace gdn::app
