#include "gdn/problem.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include "core/convert.h"
#include "gdn/error.h"
#include "validate.h"

namespace gdn {
namespace {

using Rng = std::mt19937_64;

HostTensor normal(DType dtype, std::vector<std::int64_t> shape, double sigma, Rng& rng) {
  HostTensor t = HostTensor::zeros(dtype, std::move(shape));
  std::normal_distribution<double> dist(0.0, sigma);
  const TensorRef r = t.ref();
  for (std::int64_t i = 0; i < t.numel(); ++i) core::store(r, i, dist(rng));
  return t;
}

// Rows of length `dim` scaled to unit norm (q, k when the kernel does not normalize them).
void normalize_rows(HostTensor& t, std::int64_t dim) {
  const TensorRef r = t.ref();
  for (std::int64_t row = 0; row < t.numel() / dim; ++row) {
    double sum = 0;
    for (std::int64_t i = 0; i < dim; ++i) sum += std::pow(core::load<double>(r, row * dim + i), 2);
    const double inv = 1.0 / std::sqrt(sum + 1e-6);
    for (std::int64_t i = 0; i < dim; ++i)
      core::store(r, row * dim + i, core::load<double>(r, row * dim + i) * inv);
  }
}

}  // namespace

std::int64_t Problem::sequences() const {
  return seqlens.empty() ? B : static_cast<std::int64_t>(seqlens.size());
}

ProblemData generate(const Problem& p) {
  std::int64_t B = p.B, T = p.T;
  if (!p.seqlens.empty()) {
    B = 1;
    T = std::accumulate(p.seqlens.begin(), p.seqlens.end(), std::int64_t{0});
  }
  Rng rng(p.seed);
  ProblemData d;
  d.use_qk_l2norm = p.use_qk_l2norm;
  d.chunk_size = p.chunk_size;
  d.q = normal(p.dtype, {B, T, p.HK, p.K}, 1.0, rng);
  d.k = normal(p.dtype, {B, T, p.HK, p.K}, 1.0, rng);
  if (!p.use_qk_l2norm) {
    normalize_rows(d.q, p.K);
    normalize_rows(d.k, p.K);
  }
  d.v = normal(p.dtype, {B, T, p.HV, p.V}, 1.0, rng);

  // Per value head a log-rate in [ln 1e-3, ln 2]: slow heads carry state across many chunks.
  std::uniform_real_distribution<double> log_rate(std::log(1e-3), std::log(2.0));
  std::vector<double> rate(static_cast<std::size_t>(p.HV));
  for (double& r : rate) r = log_rate(rng);
  std::normal_distribution<double> noise(0.0, 0.5);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  d.g = HostTensor::zeros(p.dtype == DType::f64 ? DType::f64 : DType::f32, {B, T, p.HV});
  d.beta = HostTensor::zeros(p.dtype, {B, T, p.HV});
  for (std::int64_t i = 0; i < B * T * p.HV; ++i) {
    const double g = -std::exp(rate[static_cast<std::size_t>(i % p.HV)] + noise(rng));
    core::store(d.g.ref(), i, std::clamp(g, -20.0, -1e-4));
    core::store(d.beta.ref(), i, unit(rng));
  }
  const std::int64_t N = p.sequences();
  const DType state = p.dtype == DType::f64 ? DType::f64 : DType::f32;
  if (p.initial_state) d.initial_state = normal(state, {N, p.HV, p.K, p.V}, 0.1, rng);
  if (!p.seqlens.empty()) {
    d.cu_seqlens = HostTensor::zeros(DType::i64, {N + 1});
    std::partial_sum(p.seqlens.begin(), p.seqlens.end(), d.cu_seqlens.as<std::int64_t>() + 1);
  }
  d.d_o = normal(p.dtype, {B, T, p.HV, p.V}, 1.0, rng);
  if (p.final_state_grad) d.d_final_state = normal(state, {N, p.HV, p.K, p.V}, 0.1, rng);
  return d;
}

DeltaRuleInputs ProblemData::inputs() const {
  DeltaRuleInputs in;
  in.q = q.ref();
  in.k = k.ref();
  in.v = v.ref();
  in.g = g.ref();
  in.beta = beta.ref();
  if (!initial_state.bytes.empty()) in.initial_state = initial_state.ref();
  if (!cu_seqlens.bytes.empty()) in.cu_seqlens = cu_seqlens.ref();
  in.scale = scale;
  in.use_qk_l2norm = use_qk_l2norm;
  in.chunk_size = chunk_size;
  return in;
}

namespace {

ProblemResults allocate(std::int64_t B, std::int64_t T, std::int64_t HK, std::int64_t HV,
                        std::int64_t K, std::int64_t V, std::int64_t N, bool initial_state,
                        DType dtype) {
  const DType state = dtype == DType::f64 ? DType::f64 : DType::f32;
  ProblemResults r;
  r.o = HostTensor::zeros(dtype, {B, T, HV, V});
  r.final_state = HostTensor::zeros(state, {N, HV, K, V});
  r.dq = HostTensor::zeros(dtype, {B, T, HK, K});
  r.dk = HostTensor::zeros(dtype, {B, T, HK, K});
  r.dv = HostTensor::zeros(dtype, {B, T, HV, V});
  r.dg = HostTensor::zeros(dtype, {B, T, HV});
  r.dbeta = HostTensor::zeros(dtype, {B, T, HV});
  if (initial_state) r.dh0 = HostTensor::zeros(state, {N, HV, K, V});
  return r;
}

}  // namespace

ProblemResults allocate_results(const Problem& p, DType dtype) {
  std::int64_t B = p.B, T = p.T;
  if (!p.seqlens.empty()) {
    B = 1;
    T = std::accumulate(p.seqlens.begin(), p.seqlens.end(), std::int64_t{0});
  }
  return allocate(B, T, p.HK, p.HV, p.K, p.V, p.sequences(), p.initial_state, dtype);
}

ProblemResults allocate_results(const ProblemData& d, DType dtype) {
  const std::int64_t N = d.cu_seqlens.bytes.empty() ? d.q.shape[0] : d.cu_seqlens.shape[0] - 1;
  return allocate(d.q.shape[0], d.q.shape[1], d.q.shape[2], d.v.shape[2], d.q.shape[3],
                  d.v.shape[3], N, !d.initial_state.bytes.empty(), dtype);
}

DeltaRuleShape validate(const ProblemData& d) {
  const DeltaRuleShape s = validate(d.inputs());
  if (!d.d_o.bytes.empty() || !d.d_final_state.bytes.empty()) {
    const TensorRef d_final_state =
        d.d_final_state.bytes.empty() ? TensorRef{} : d.d_final_state.ref();
    validate_grad_inputs(s, d.d_o.bytes.empty() ? TensorRef{} : d.d_o.ref(), d_final_state);
  }
  return s;
}

ProblemData shard_of(const ProblemData& d, int rank, int ranks) {
  const std::int64_t T = validate(d).T;
  if (ranks < 1 || T % ranks != 0)
    throw Error("T = " + std::to_string(T) + " must be divisible by the ranks (" +
                std::to_string(ranks) + ")");
  if (rank < 0 || rank >= ranks)
    throw Error("rank " + std::to_string(rank) + " must be in [0, " + std::to_string(ranks) + ")");
  const std::int64_t Tl = T / ranks, first = rank * Tl;
  ProblemData s = d;
  s.q = slice_tokens(d.q, first, Tl);
  s.k = slice_tokens(d.k, first, Tl);
  s.v = slice_tokens(d.v, first, Tl);
  s.g = slice_tokens(d.g, first, Tl);
  s.beta = slice_tokens(d.beta, first, Tl);
  s.d_o = slice_tokens(d.d_o, first, Tl);
  return s;
}

void gather_shard(const ProblemResults& shard, int rank, ProblemResults& whole) {
  const std::int64_t Tl = shard.o.shape[1], first = rank * Tl;
  for (auto [from, to] : {std::pair{&shard.o, &whole.o},
                          {&shard.dq, &whole.dq},
                          {&shard.dk, &whole.dk},
                          {&shard.dv, &whole.dv},
                          {&shard.dg, &whole.dg},
                          {&shard.dbeta, &whole.dbeta}})
    place_tokens(*from, *to, first);
  for (auto [from, to] :
       {std::pair{&shard.final_state, &whole.final_state}, {&shard.dh0, &whole.dh0}}) {
    if (from->bytes.empty()) continue;
    for (std::int64_t i = 0; i < from->numel(); ++i)
      core::store(to->ref(), i,
                  core::load<double>(to->ref(), i) + core::load<double>(from->ref(), i));
  }
}

DeltaRuleOutputs ProblemResults::outputs() {
  return {o.ref(), final_state.ref()};
}

DeltaRuleGrads ProblemResults::grads(ProblemData& data) {
  DeltaRuleGrads g;
  g.d_o = data.d_o.ref();
  if (!data.d_final_state.bytes.empty()) g.d_final_state = data.d_final_state.ref();
  g.dq = dq.ref();
  g.dk = dk.ref();
  g.dv = dv.ref();
  g.dg = dg.ref();
  g.dbeta = dbeta.ref();
  if (!dh0.bytes.empty()) g.dh0 = dh0.ref();
  return g;
}

double relative_error(const TensorRef& x, const TensorRef& ref) {
  if (x.numel() != ref.numel())
    throw Error("relative_error: tensors of " + x.shape_string() + " and " + ref.shape_string());
  double diff = 0, norm = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double r = core::load<double>(ref, i), d = core::load<double>(x, i) - r;
    diff += d * d;
    norm += r * r;
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

}  // namespace gdn
