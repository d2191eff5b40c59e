// The CUDA delta rule against the float64 recurrence, every output and gradient, on fresh random
// inputs (skips without a GPU). bf16 inputs: about 3e-3..5e-3 relative error is expected (spec 7).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_testing.h"
#include "gdn/cuda.h"
#include "gdn/delta_rule.h"
#include "gdn/error.h"
#include "gdn/problem.h"

namespace gdn {
namespace {

constexpr double kOutputTolerance = 8e-3;
constexpr double kGradTolerance = 1.5e-2;

// With reuse_forward, the backward reads the forward's workspace instead of recomputing it; with
// save, that forward also saved the per-chunk states and Vn.
// host_offsets = false: cu_seqlens only on the device (the workspace sized from shapes alone).
void check_problem(const Problem& p, bool reuse_forward = false, bool save = false,
                   bool host_offsets = true) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ProblemData data = generate(p);
  ProblemResults ref = allocate_results(p, DType::f64);
  delta_rule_forward(data.inputs(), ref.outputs(), Method::recurrent);
  delta_rule_backward(data.inputs(), ref.grads(data), Method::recurrent);

  DeviceTensor q(data.q), k(data.k), v(data.v), g(data.g), beta(data.beta), h0(data.initial_state),
      cu(data.cu_seqlens), d_o(data.d_o), dht(data.d_final_state);
  DeltaRuleInputs in = data.inputs();
  in.q = q.ref, in.k = k.ref, in.v = v.ref, in.g = g.ref, in.beta = beta.ref;
  in.initial_state = h0.ref, in.cu_seqlens = cu.ref;
  const DType dt = data.q.dtype;
  DeviceTensor o(dt, ref.o.shape), ht(DType::f32, ref.final_state.shape);
  DeviceTensor dq(dt, ref.dq.shape), dk(dt, ref.dk.shape), dv(dt, ref.dv.shape),
      dg(DType::f32, ref.dg.shape), dbeta(data.beta.dtype, ref.dbeta.shape);
  DeviceTensor dh0;
  if (p.initial_state) dh0.make(DType::f32, ref.dh0.shape, nullptr);

  CudaContext ctx;
  ctx.cu_seqlens_host =
      data.cu_seqlens.bytes.empty() || !host_offsets ? TensorRef{} : data.cu_seqlens.ref();
  const std::size_t forward_bytes =
      delta_rule_forward_cuda_workspace(in, ctx.cu_seqlens_host, save);
  const std::size_t backward_bytes =
      delta_rule_backward_cuda_workspace(in, ctx.cu_seqlens_host, reuse_forward, save);
  void* forward_workspace = nullptr;
  void* backward_workspace = nullptr;
  GDN_CUDA_CHECK(cudaMalloc(&forward_workspace, forward_bytes));
  GDN_CUDA_CHECK(cudaMalloc(&backward_workspace, std::max(forward_bytes, backward_bytes)));
  ctx.workspace = forward_workspace;
  ctx.workspace_bytes = forward_bytes;
  ctx.save_for_backward = save;
  delta_rule_forward_cuda(in, {o.ref, ht.ref}, ctx);
  ctx.workspace = backward_workspace;
  ctx.workspace_bytes = std::max(forward_bytes, backward_bytes);
  if (reuse_forward) {
    ctx.forward_workspace = forward_workspace;
    ctx.forward_workspace_bytes = forward_bytes;
  }
  DeltaRuleGrads gr{d_o.ref, dht.ref, dq.ref, dk.ref, dv.ref, dg.ref, dbeta.ref, dh0.ref};
  delta_rule_backward_cuda(in, gr, ctx);
  GDN_CUDA_CHECK(cudaDeviceSynchronize());
  GDN_CUDA_CHECK(cudaFree(forward_workspace));
  GDN_CUDA_CHECK(cudaFree(backward_workspace));

  struct Item {
    const char* name;
    const DeviceTensor* got;
    const HostTensor* want;
    double tol;
  };
  std::vector<Item> items = {{"o", &o, &ref.o, kOutputTolerance},
                             {"final_state", &ht, &ref.final_state, kOutputTolerance},
                             {"dq", &dq, &ref.dq, kGradTolerance},
                             {"dk", &dk, &ref.dk, kGradTolerance},
                             {"dv", &dv, &ref.dv, kGradTolerance},
                             {"dg", &dg, &ref.dg, kGradTolerance},
                             {"dbeta", &dbeta, &ref.dbeta, kGradTolerance}};
  if (p.initial_state) items.push_back({"dh0", &dh0, &ref.dh0, kGradTolerance});
  std::string line;
  for (const Item& item : items) {
    const HostTensor got = item.got->download();
    const double err = relative_error(got.ref(), item.want->ref());
    line += std::string(" ") + item.name + " " + std::to_string(err);
    EXPECT_LE(err, item.tol) << item.name;
  }
  std::printf("[ errors   ] T=%lld HK=%lld HV=%lld B=%lld varlen=%d reuse=%d save=%d:%s\n",
              static_cast<long long>(p.T), static_cast<long long>(p.HK),
              static_cast<long long>(p.HV), static_cast<long long>(p.B), !p.seqlens.empty(),
              reuse_forward, save, line.c_str());
}

Problem base(std::int64_t T, std::int64_t HK, std::int64_t HV) {
  Problem p;
  p.B = 1, p.T = T, p.HK = HK, p.HV = HV, p.K = 128, p.V = 128;
  p.dtype = DType::bf16;
  p.initial_state = true;
  p.final_state_grad = true;
  p.use_qk_l2norm = true;
  p.seed = static_cast<std::uint64_t>(T * 7 + HV);
  return p;
}

class CudaDeltaRuleLength : public ::testing::TestWithParam<std::int64_t> {};
TEST_P(CudaDeltaRuleLength, GroupedHeads) {
  check_problem(base(GetParam(), 1, 2));
}
TEST_P(CudaDeltaRuleLength, SameHeads) {
  check_problem(base(GetParam(), 1, 1));
}
INSTANTIATE_TEST_SUITE_P(T, CudaDeltaRuleLength, ::testing::Values(1, 63, 64, 65, 1000, 4096));

TEST(CudaDeltaRule, BatchNoStatesNoL2norm) {
  Problem p = base(300, 2, 4);
  p.B = 2, p.initial_state = false, p.final_state_grad = false, p.use_qk_l2norm = false;
  check_problem(p);
}
TEST(CudaDeltaRule, Varlen) {
  Problem p = base(0, 1, 2);
  p.seqlens = {1, 63, 64, 65, 200, 130};
  for (auto n : p.seqlens) p.T += n;
  check_problem(p);
}

// cu_seqlens on the device only: the workspace sized from shapes alone (an upper bound on the
// chunks), the chunk table built on the device; forward, and a saving forward read by the
// backward.
TEST(CudaDeltaRule, VarlenOffsetsOnTheDeviceOnly) {
  Problem p = base(0, 2, 4);
  p.seqlens = {1, 63, 64, 65, 700, 130, 1000};
  for (auto n : p.seqlens) p.T += n;
  check_problem(p, false, false, false);
  check_problem(p, true, true, false);
  if (!have_gpu()) return;
  ProblemData data = generate(p);
  DeltaRuleInputs in = data.inputs();
  EXPECT_GE(delta_rule_forward_cuda_workspace(in, {}, true),
            delta_rule_forward_cuda_workspace(in, data.cu_seqlens.ref(), true));
}

// The backward reading the forward's workspace: one sequence in 16 segments, and varlen.
TEST(CudaDeltaRule, BackwardReusesForward) {
  check_problem(base(4096, 1, 2), true);
  Problem p = base(0, 2, 4);
  p.seqlens = {700, 63, 1000};
  for (auto n : p.seqlens) p.T += n;
  check_problem(p, true);
}
// The training path: the forward saves the per-chunk states, the backward skips recomputing them.
TEST(CudaDeltaRule, BackwardReadsSavedStates) {
  check_problem(base(4096, 1, 2), true, true);
  Problem p = base(0, 2, 4);
  p.seqlens = {700, 63, 1000};
  for (auto n : p.seqlens) p.T += n;
  p.dtype = DType::f16;
  check_problem(p, true, true);
}
TEST(CudaDeltaRule, F16) {
  Problem p = base(500, 2, 2);
  p.dtype = DType::f16;
  check_problem(p);
}

TEST(CudaDeltaRule, RejectsUnsupportedShapes) {
  Problem p = base(64, 1, 1);
  p.K = 64;
  ProblemData data = generate(p);
  EXPECT_THROW(delta_rule_forward_cuda_workspace(data.inputs()), Error);
  Problem c = base(64, 1, 1);
  c.chunk_size = 32;
  ProblemData data2 = generate(c);
  try {
    delta_rule_forward_cuda_workspace(data2.inputs());
    ADD_FAILURE() << "chunk_size 32 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunk_size"), std::string::npos) << e.what();
  }
}

TEST(CudaDeltaRule, RejectsBadForwardWorkspace) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  ProblemData data = generate(base(64, 1, 1));
  const DeltaRuleInputs in = data.inputs();
  ProblemResults r = allocate_results(base(64, 1, 1), DType::bf16);
  r.dg = HostTensor::zeros(DType::f32, r.dg.shape);
  r.dbeta = HostTensor::zeros(data.beta.dtype, r.dbeta.shape);
  r.dh0 = HostTensor::zeros(DType::f32, r.dh0.shape);
  const DeltaRuleGrads gr = r.grads(data);
  CudaContext ctx;  // nothing is launched: the buffers are checked first
  ctx.workspace = reinterpret_cast<void*>(std::uintptr_t{1} << 20);
  ctx.forward_workspace = ctx.workspace;
  ctx.workspace_bytes = ctx.forward_workspace_bytes = std::size_t{1} << 40;
  try {
    delta_rule_backward_cuda(in, gr, ctx);
    ADD_FAILURE() << "a shared workspace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("forward_workspace"), std::string::npos) << e.what();
  }
  ctx.forward_workspace = nullptr;  // saved states without the forward that saved them
  ctx.save_for_backward = true;
  try {
    delta_rule_backward_cuda(in, gr, ctx);
    ADD_FAILURE() << "save_for_backward without forward_workspace was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("save_for_backward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace gdn
