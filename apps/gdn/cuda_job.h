#pragma once
// The op on the GPU for `gdn run --device cuda` and `gdn op --device cuda`: the problem's tensors
// go to the device, forward (and backward) run there, the results come back.

#include "gdn/problem.h"

namespace gdn::app {

struct CudaTimes {
  double forward_ms = 0, backward_ms = 0;  // CUDA events, after one warm-up call of each
};

// Results in the dtypes the CUDA path writes: o, dq, dk, dv in q's dtype, dbeta in beta's,
// dg and the states in f32. Throws gdn::Error when gdn was built without CUDA.
ProblemResults run_on_cuda(const ProblemData& data, bool backward, CudaTimes& times);

}  // namespace gdn::app
