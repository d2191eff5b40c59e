#include "cuda_job.h"
#include "gdn/error.h"

namespace gdn::app {

ProblemResults run_on_cuda(const ProblemData&, bool, CudaTimes&) {
  throw Error("--device cuda: gdn was built without CUDA (configure with nvcc found, GDN_CUDA=ON)");
}

}  // namespace gdn::app
