// The CPU side of the context-parallel seam (cp/backend.h): host memory, Eigen for the map
// algebra, and the chunked op with its summaries (cpu/summary.h) on the local problem.
#include <Eigen/Dense>

#include <cstdlib>
#include <cstring>

#include "core/layout.h"
#include "cp/backend.h"
#include "cp/shard.h"
#include "cpu/summary.h"
#include "validate.h"

namespace gdn::cp {
namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Map = Eigen::Map<Mat>;
using ConstMap = Eigen::Map<const Mat>;

// The op on the local problem: everything happens in forward_output / backward_output, except
// the maps, which run the summaries on the local inputs (their entering rows still zero).
class CpuLocalOp final : public LocalOp {
 public:
  explicit CpuLocalOp(const DeltaRuleInputs& local) : in_(local), s_(validate(local)) {}

  void forward_summaries() override {}

  // Only the segment that leaves (the last) has a map: M is its transfer matrix when it also
  // entered (the first), N its leaving state when entered with zero.
  void forward_maps(float* maps) override {
    if (!leaves_) return;
    const std::int64_t last = s_.N - 1, chain = in_.cu_seqlens.given() ? 0 : -1;
    const std::int64_t count = chains() * s_.HV;
    for (std::int64_t n = chain < 0 ? 0 : last; n <= last; ++n) {
      const std::int64_t first = (chain < 0 ? n : 0) * s_.HV;
      const bool entered = enters_ && (chain < 0 || n == 0);
      cpu::chunked_summary(in_, s_, n, entered ? maps + first * s_.K * s_.K : nullptr,
                           maps + count * s_.K * s_.K + first * s_.K * s_.V);
    }
  }

  void forward_output(const DeltaRuleOutputs& out) override { delta_rule_forward(in_, out); }

  void backward_summaries(const DeltaRuleGrads&) override {}

  // Only the segment that entered (the first) has a map: G, its entering-state gradient from
  // this shard alone (N; M^T is the caller's).
  void backward_map(const DeltaRuleGrads& grads, float* maps) override {
    if (!enters_) return;
    const std::int64_t count = chains() * s_.HV, KV = s_.K * s_.V;
    const std::int64_t end = in_.cu_seqlens.given() ? 1 : s_.N;
    const auto* d_final = static_cast<const float*>(grads.d_final_state.data);
    for (std::int64_t n = 0; n < end; ++n)
      cpu::chunked_initial_state_grad(in_, s_, n, grads.d_o, d_final + n * s_.HV * KV,
                                      maps + count * s_.K * s_.K + n * s_.HV * KV);
  }

  void backward_output(const DeltaRuleGrads& grads) override { delta_rule_backward(in_, grads); }

  bool enters_ = false, leaves_ = false;

 private:
  std::int64_t chains() const { return in_.cu_seqlens.given() ? 1 : s_.B; }

  DeltaRuleInputs in_;
  DeltaRuleShape s_;
};

class CpuBackend final : public Backend {
 public:
  Memory memory() const override { return Memory::host; }

  Buffer allocate(std::size_t bytes) override {
    return {std::shared_ptr<void>(std::calloc(bytes ? bytes : 1, 1), std::free), bytes};
  }
  void copy(void* dst, const void* src, std::size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void copy_2d(void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t width, std::size_t height) override {
    for (std::size_t r = 0; r < height; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, width);
  }
  HostTensor to_host(const TensorRef& t) override {
    HostTensor h = HostTensor::zeros(t.dtype, t.shape);
    copy(h.bytes.data(), t.data, h.bytes.size());
    return h;
  }
  Buffer load_states(const TensorRef& user) override {
    if (!user.given()) return {};
    Buffer b = allocate(static_cast<std::size_t>(user.numel()) * 4);
    core::load_row(user, 0, user.numel(), b.floats());
    return b;
  }
  void store_states(const Buffer& states, const TensorRef& user) override {
    if (user.given()) core::store_row(user, 0, user.numel(), states.floats());
  }

  void apply(const float* maps, std::int64_t count, std::int64_t K, std::int64_t V, const float* x,
             float* y) override {
    const float* N = maps + count * K * K;
    for (std::int64_t i = 0; i < count; ++i)
      Map(y + i * K * V, K, V).noalias() =
          ConstMap(maps + i * K * K, K, K) * ConstMap(x + i * K * V, K, V) +
          ConstMap(N + i * K * V, K, V);
  }
  void compose(const float* second, const float* first, std::int64_t count, std::int64_t K,
               std::int64_t V, float* out) override {
    const std::int64_t offsets = count * K * K;
    for (std::int64_t i = 0; i < count; ++i) {
      const ConstMap m2(second + i * K * K, K, K);
      Map(out + i * K * K, K, K).noalias() = m2 * ConstMap(first + i * K * K, K, K);
      Map(out + offsets + i * K * V, K, V).noalias() =
          m2 * ConstMap(first + offsets + i * K * V, K, V) +
          ConstMap(second + offsets + i * K * V, K, V);
    }
  }
  void transpose_matrices(float* maps, std::int64_t count, std::int64_t K) override {
    for (std::int64_t i = 0; i < count; ++i) Map(maps + i * K * K, K, K).transposeInPlace();
  }

  std::unique_ptr<LocalOp> local_op(const DeltaRuleInputs& local, const TensorRef&, Carried carried,
                                    bool) override {
    auto op = std::make_unique<CpuLocalOp>(local);
    op->enters_ = carried.enters;
    op->leaves_ = carried.leaves;
    return op;
  }
  void forward(const DeltaRuleInputs& in, const TensorRef&, const DeltaRuleOutputs& out) override {
    delta_rule_forward(in, out);
  }
  void backward(const DeltaRuleInputs& in, const TensorRef&, const DeltaRuleGrads& grads) override {
    delta_rule_backward(in, grads);
  }
};

}  // namespace

std::unique_ptr<Backend> cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace gdn::cp
