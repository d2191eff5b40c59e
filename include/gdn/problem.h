#pragma once
// One problem description feeds the tests, the benchmarks and the tool: shapes, dtype, options,
// and inputs generated from a seed in model-realistic ranges.

#include <cstdint>
#include <vector>

#include "gdn/delta_rule.h"
#include "gdn/tensor.h"

namespace gdn {

struct Problem {
  std::int64_t B = 1, T = 4096, HK = 16, HV = 32, K = 128, V = 128;
  std::vector<std::int64_t> seqlens;  // non-empty: B = 1, T = their sum, packed via cu_seqlens
  DType dtype = DType::f32;  // q, k, v, beta storage; g and states are f32 (f64 when this is)
  int chunk_size = 64;
  bool use_qk_l2norm = true;
  bool initial_state = false;
  bool final_state_grad = false;  // generate d_final_state
  std::uint64_t seed = 0;

  std::int64_t sequences() const;  // N
};

// Host tensors of a problem. q, k are unit-norm unless use_qk_l2norm (then raw Gaussians);
// v, d_o ~ N(0, 1); beta ~ U(0, 1); g = -exp(per-head rate + noise), clamped to [-20, -1e-4];
// initial_state, d_final_state ~ N(0, 0.1^2).
struct ProblemData {
  HostTensor q, k, v, g, beta, initial_state, cu_seqlens, d_o, d_final_state;
  double scale = 0;
  bool use_qk_l2norm = true;
  int chunk_size = 64;

  DeltaRuleInputs inputs() const;
};

// The inputs' checks (validate) and, when given, d_o [B, T, HV, V] and d_final_state
// [N, HV, K, V]; gdn::Error naming the tensor otherwise. shard_of runs it before slicing.
DeltaRuleShape validate(const ProblemData& data);

ProblemData generate(const Problem& problem);

// Output and gradient buffers of the problem's shapes, in `dtype`, viewed by outputs() / grads().
struct ProblemResults {
  HostTensor o, final_state, dq, dk, dv, dg, dbeta, dh0;

  DeltaRuleOutputs outputs();
  DeltaRuleGrads grads(ProblemData& data);
};

ProblemResults allocate_results(const Problem& problem, DType dtype);
ProblemResults allocate_results(const ProblemData& data, DType dtype);  // shaped like data

// Context parallelism: rank r's shard of P (T divisible by P, else gdn::Error): q, k, v, g, beta
// and d_o hold tokens [r T/P, (r+1) T/P) of every batch row; cu_seqlens and states stay global.
ProblemData shard_of(const ProblemData& data, int rank, int ranks);
// Puts a shard's results in place: token tensors copied, state tensors added (each state row is
// non-zero on one rank only).
void gather_shard(const ProblemResults& shard, int rank, ProblemResults& whole);

// Relative Frobenius error ||x - ref|| / ||ref|| of two tensors of equal numel (any float dtypes).
double relative_error(const TensorRef& x, const TensorRef& ref);

}  // namespace gdn
