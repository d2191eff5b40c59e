// What the CUDA entry points check besides their arguments: the device is a Hopper GPU (sm_90),
// and a backward handed a forward's workspace checks, on the device, that the header that
// forward wrote there describes these inputs (delta_rule.cu, "The forward workspace's header"),
// reporting a mismatch as a gdn::Error at the next call. Also: a whole forward and backward
// captured in a CUDA graph and replayed. The GPU tests skip without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/device.h"
#include "cuda_testing.h"
#include "gdn/cuda.h"
#include "gdn/delta_rule.h"
#include "gdn/error.h"
#include "gdn/problem.h"

namespace gdn {
namespace {

TEST(CudaDevice, HopperMismatchMessage) {
  EXPECT_EQ(cuda::hopper_mismatch(0, "NVIDIA H200", 9, 0), "");
  EXPECT_EQ(cuda::hopper_mismatch(1, "NVIDIA A100-SXM4-80GB", 8, 0),
            "gdn's CUDA kernels need a Hopper GPU (sm_90); device 1 is NVIDIA A100-SXM4-80GB "
            "(sm_80)");
  EXPECT_EQ(cuda::hopper_mismatch(0, "NVIDIA L40S", 8, 9),
            "gdn's CUDA kernels need a Hopper GPU (sm_90); device 0 is NVIDIA L40S (sm_89)");
  EXPECT_EQ(cuda::hopper_mismatch(3, "NVIDIA B200", 10, 0),
            "gdn's CUDA kernels need a Hopper GPU (sm_90); device 3 is NVIDIA B200 (sm_100)");
}

// On the test machine's GPU (an H200) the check passes, and once cached costs next to nothing.
TEST(CudaDevice, CheckPassesOnHopperAndIsCheap) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  int device = -1;
  GDN_CUDA_CHECK(cudaGetDevice(&device));
  EXPECT_EQ(cuda::require_hopper(), device);
  constexpr int kCalls = 100000;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) cuda::require_hopper();
  const double ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() /
      kCalls;
  std::printf("[ check    ] require_hopper: %.0f ns per call\n", ns);
  EXPECT_LT(ns, 2000.0);
}

TEST(CudaDevice, DeferredErrorMessages) {
  cuda::DeferredError e{};
  e.state = 2, e.device = 0, e.field = cuda::kTokens, e.values[0] = 128, e.values[1] = 64;
  EXPECT_NE(cuda::deferred_message(e).find("T is 128 in the forward that wrote it and 64 in the "
                                           "backward"),
            std::string::npos)
      << cuda::deferred_message(e);
  e.field = cuda::kMagic;
  EXPECT_NE(cuda::deferred_message(e).find("no forward's header"), std::string::npos);
  e.field = cuda::kHeaderFields, e.sequence = 1;
  e.values[0] = 100, e.values[1] = 28, e.values[2] = 28, e.values[3] = 100;
  EXPECT_NE(cuda::deferred_message(e).find("sequence 1 is tokens [100, 128) in the forward that "
                                           "wrote it and [28, 128) in the backward"),
            std::string::npos)
      << cuda::deferred_message(e);
  e.field = cuda::kScale;
  const float a = 0.125f, b = 0.5f;
  std::memcpy(&e.values[0], &a, 4);
  std::memcpy(&e.values[1], &b, 4);
  EXPECT_NE(cuda::deferred_message(e).find("scale is 0.125 in the forward that wrote it and 0.5"),
            std::string::npos)
      << cuda::deferred_message(e);
}

Problem base(std::int64_t T, std::int64_t HK, std::int64_t HV) {
  return hopper_problem(T, HK, HV, 13);
}

// A problem's inputs and gradients in device memory.
struct OnDevice {
  ProblemData data;
  DeviceTensor q, k, v, g, beta, h0, cu, d_o, dht, o, ht, dq, dk, dv, dg, dbeta, dh0;
  DeltaRuleInputs in;
  explicit OnDevice(const Problem& p)
      : data(generate(p)),
        q(data.q),
        k(data.k),
        v(data.v),
        g(data.g),
        beta(data.beta),
        h0(data.initial_state),
        cu(data.cu_seqlens),
        d_o(data.d_o),
        dht(data.d_final_state) {
    in = data.inputs();
    in.q = q.ref, in.k = k.ref, in.v = v.ref, in.g = g.ref, in.beta = beta.ref;
    in.initial_state = h0.ref, in.cu_seqlens = cu.ref;
    const DType dt = data.q.dtype;
    std::vector<std::int64_t> states = {p.sequences(), p.HV, 128, 128};
    o.make(dt, data.v.shape, nullptr);
    ht.make(DType::f32, states, nullptr);
    dq.make(dt, data.q.shape, nullptr);
    dk.make(dt, data.k.shape, nullptr);
    dv.make(dt, data.v.shape, nullptr);
    dg.make(DType::f32, data.g.shape, nullptr);
    dbeta.make(data.beta.dtype, data.beta.shape, nullptr);
    if (p.initial_state) dh0.make(DType::f32, states, nullptr);
  }
  DeltaRuleOutputs outputs() const { return {o.ref, ht.ref}; }
  DeltaRuleGrads grads() const {
    return {d_o.ref, dht.ref, dq.ref, dk.ref, dv.ref, dg.ref, dbeta.ref, dh0.ref};
  }
};

// Device memory freed with the object.
struct Buffer {
  void* data = nullptr;
  std::size_t bytes = 0;
  explicit Buffer(std::size_t n) : bytes(n) {
    GDN_CUDA_CHECK(cudaMalloc(&data, n));
    GDN_CUDA_CHECK(cudaMemset(data, 0, n));
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(data); }
};

// How many of a tensor's values are NaN (f32, bf16 or f16).
std::int64_t nans(const DeviceTensor& t) {
  const HostTensor h = t.download();
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < h.numel(); ++i) {
    if (h.dtype == DType::f32) {
      float x = 0;
      std::memcpy(&x, h.bytes.data() + 4 * i, 4);
      count += std::isnan(x);
    } else {
      std::uint16_t x = 0;
      std::memcpy(&x, h.bytes.data() + 2 * i, 2);
      const bool bf16 = h.dtype == DType::bf16;
      const std::uint16_t exponent = bf16 ? 0x7F80 : 0x7C00, mantissa = bf16 ? 0x007F : 0x03FF;
      count += (x & exponent) == exponent && (x & mantissa) != 0;
    }
  }
  return count;
}

// The backward of `bwd`'s inputs handed the workspace of a saving forward of `fwd`'s (or, with
// fwd == nullptr, a workspace no forward wrote): the backward enqueues without an error, the
// deferred one comes once the device has run it, containing `expected`, and every gradient is
// NaN. Offsets on the device only (both calls size the workspace from shapes).
void expect_mismatch(const Problem* fwd, const Problem& bwd, const std::string& expected) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cuda_check_deferred_errors();  // nothing pending from before
  OnDevice b(bwd);
  const std::size_t needed = delta_rule_forward_cuda_workspace(b.in, {}, true);
  std::size_t bytes = needed;
  std::unique_ptr<OnDevice> f;
  if (fwd) {
    f = std::make_unique<OnDevice>(*fwd);
    bytes = std::max(bytes, delta_rule_forward_cuda_workspace(f->in, {}, true));
  }
  Buffer forward(bytes);
  CudaContext ctx;
  ctx.save_for_backward = true;
  if (f) {
    ctx.workspace = forward.data;
    ctx.workspace_bytes = bytes;
    delta_rule_forward_cuda(f->in, f->outputs(), ctx);
  }
  const std::size_t backward_bytes = delta_rule_backward_cuda_workspace(b.in, {}, true, true);
  Buffer backward(backward_bytes);
  ctx.workspace = backward.data;
  ctx.workspace_bytes = backward_bytes;
  ctx.forward_workspace = forward.data;
  ctx.forward_workspace_bytes = bytes;  // large enough: the size check passes
  delta_rule_backward_cuda(b.in, b.grads(), ctx);
  GDN_CUDA_CHECK(cudaDeviceSynchronize());
  try {
    cuda_check_deferred_errors();
    ADD_FAILURE() << "no error for: " << expected;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    std::printf("[ message  ] %s\n", e.what());
  }
  EXPECT_NO_THROW(cuda_check_deferred_errors());  // reported once
  for (const DeviceTensor* t : {&b.dq, &b.dk, &b.dv, &b.dg, &b.dbeta, &b.dh0}) {
    if (t->data) {
      EXPECT_EQ(nans(*t), t->ref.numel());
    }
  }
}

TEST(CudaForwardWorkspace, OtherLength) {
  const Problem fwd = base(128, 1, 2);
  expect_mismatch(&fwd, base(64, 1, 2), "T is 128 in the forward that wrote it and 64 in the");
}
TEST(CudaForwardWorkspace, OtherHeads) {
  const Problem fwd = base(64, 2, 4);
  expect_mismatch(&fwd, base(64, 1, 2), "HK is 2 in the forward that wrote it and 1 in the");
}
TEST(CudaForwardWorkspace, OtherL2norm) {
  Problem fwd = base(100, 1, 2);
  fwd.use_qk_l2norm = false;
  expect_mismatch(&fwd, base(100, 1, 2), "use_qk_l2norm is 0 in the forward");
}
TEST(CudaForwardWorkspace, NoInitialStateInTheForward) {
  Problem fwd = base(100, 1, 2);
  fwd.initial_state = false;
  expect_mismatch(&fwd, base(100, 1, 2), "whether initial_state is given is 0 in the forward");
}
TEST(CudaForwardWorkspace, OtherOffsets) {
  Problem fwd = base(0, 1, 2), bwd = base(0, 1, 2);
  fwd.seqlens = {100, 28}, fwd.T = 128;
  bwd.seqlens = {28, 100}, bwd.T = 128;
  expect_mismatch(&fwd, bwd,
                  "sequence 0 is tokens [0, 100) in the forward that wrote it and [0, 28) in the "
                  "backward");
}
TEST(CudaForwardWorkspace, NeverWritten) {
  expect_mismatch(nullptr, base(64, 1, 2), "no forward's header");
}

// The next forward or backward throws the deferred error too; after it a matching pair runs.
TEST(CudaForwardWorkspace, TheNextCallThrowsThenAMatchingPairRuns) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  cuda_check_deferred_errors();
  OnDevice a(base(128, 1, 2)), b(base(64, 1, 2));
  const std::size_t fwd_bytes = delta_rule_forward_cuda_workspace(a.in, {}, true);
  const std::size_t bwd_bytes = delta_rule_backward_cuda_workspace(a.in, {}, true, true);
  Buffer forward(fwd_bytes), backward(bwd_bytes);
  CudaContext ctx;
  ctx.save_for_backward = true;
  ctx.workspace = forward.data, ctx.workspace_bytes = fwd_bytes;
  delta_rule_forward_cuda(a.in, a.outputs(), ctx);
  CudaContext back = ctx;
  back.workspace = backward.data, back.workspace_bytes = bwd_bytes;
  back.forward_workspace = forward.data, back.forward_workspace_bytes = fwd_bytes;
  delta_rule_backward_cuda(b.in, b.grads(), back);  // a's forward, b's backward
  GDN_CUDA_CHECK(cudaDeviceSynchronize());
  try {
    delta_rule_forward_cuda(a.in, a.outputs(), ctx);
    ADD_FAILURE() << "the next forward did not report the mismatch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("T is 128"), std::string::npos) << e.what();
  }
  delta_rule_forward_cuda(a.in, a.outputs(), ctx);
  delta_rule_backward_cuda(a.in, a.grads(), back);
  GDN_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_NO_THROW(cuda_check_deferred_errors());
  for (const DeviceTensor* t : {&a.dq, &a.dk, &a.dv, &a.dg, &a.dbeta, &a.dh0})
    EXPECT_EQ(nans(*t), 0);
}

// A saving forward and the backward reading it, captured in one CUDA graph (offsets, if any, on
// the device only: no host read, no synchronization) and replayed twice: the same bytes as the
// calls run directly.
void capture_and_replay(const Problem& p) {
  OnDevice d(p);
  const std::size_t fwd_bytes = delta_rule_forward_cuda_workspace(d.in, {}, true);
  const std::size_t bwd_bytes = delta_rule_backward_cuda_workspace(d.in, {}, true, true);
  Buffer forward(fwd_bytes), backward(bwd_bytes);
  cudaStream_t stream = nullptr;
  GDN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CudaContext fctx;
  fctx.stream = stream;
  fctx.save_for_backward = true;
  fctx.workspace = forward.data, fctx.workspace_bytes = fwd_bytes;
  CudaContext bctx = fctx;
  bctx.workspace = backward.data, bctx.workspace_bytes = bwd_bytes;
  bctx.forward_workspace = forward.data, bctx.forward_workspace_bytes = fwd_bytes;
  auto step = [&] {
    delta_rule_forward_cuda(d.in, d.outputs(), fctx);
    delta_rule_backward_cuda(d.in, d.grads(), bctx);
  };
  auto results = [&] {
    std::vector<HostTensor> r;
    for (const DeviceTensor* t : {&d.o, &d.ht, &d.dq, &d.dk, &d.dv, &d.dg, &d.dbeta, &d.dh0})
      r.push_back(t->download());
    return r;
  };
  auto clear = [&] {
    for (const DeviceTensor* t : {&d.o, &d.ht, &d.dq, &d.dk, &d.dv, &d.dg, &d.dbeta, &d.dh0})
      GDN_CUDA_CHECK(
          cudaMemsetAsync(t->data, 0, t->ref.numel() * dtype_size(t->ref.dtype), stream));
  };
  GDN_CUDA_CHECK(cudaDeviceSynchronize());  // the inputs' copies, before the non-blocking stream

  cudaGraph_t graph = nullptr;
  GDN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  try {
    step();
  } catch (...) {
    cudaStreamEndCapture(stream, &graph);
    throw;
  }
  GDN_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  GDN_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  step();  // directly
  GDN_CUDA_CHECK(cudaStreamSynchronize(stream));
  const std::vector<HostTensor> direct = results();
  for (int replay = 0; replay < 2; ++replay) {
    clear();
    GDN_CUDA_CHECK(cudaGraphLaunch(exec, stream));
    GDN_CUDA_CHECK(cudaStreamSynchronize(stream));
    const std::vector<HostTensor> replayed = results();
    for (std::size_t i = 0; i < direct.size(); ++i)
      EXPECT_TRUE(direct[i].bytes == replayed[i].bytes) << "tensor " << i << ", replay " << replay;
  }
  EXPECT_NO_THROW(cuda_check_deferred_errors());
  GDN_CUDA_CHECK(cudaGraphExecDestroy(exec));
  GDN_CUDA_CHECK(cudaGraphDestroy(graph));
  GDN_CUDA_CHECK(cudaStreamDestroy(stream));
}

// In its own process (ctest), the capture also makes the first call that needs the mailbox,
// which allocates it in relaxed capture mode.
TEST(CudaGraph, ForwardAndBackwardCapturedAndReplayed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  Problem p = base(0, 2, 4);
  p.seqlens = {1, 63, 64, 65, 700, 130};
  for (auto n : p.seqlens) p.T += n;
  capture_and_replay(p);
}
// 32 value heads at T=4096, one sequence: the backward's chains beside grad_chunk, with the flags'
// zeroing (a memset node) and the gradient blocks that wait on them inside the graph.
TEST(CudaGraph, ChainsBesideCapturedAndReplayed) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  capture_and_replay(base(4096, 16, 32));
}

}  // namespace
}  // namespace gdn
