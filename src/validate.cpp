#include "validate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "core/convert.h"
#include "gdn/error.h"

namespace gdn {
namespace {

bool is_floating(DType d) {
  return d == DType::f64 || d == DType::f32 || d == DType::f16 || d == DType::bf16;
}

void require_given(const char* name, const TensorRef& t, const char* layout) {
  if (!t.given())
    throw Error(fmt::format("{} is required: expected a tensor of shape {}", name, layout));
}

void require_rank(const char* name, const TensorRef& t, std::size_t rank, const char* layout) {
  if (t.shape.size() != rank)
    throw Error(fmt::format("{} must have shape {} (rank {}), got rank {} {}", name, layout, rank,
                            t.shape.size(), t.shape_string()));
}

void require_shape(const char* name, const TensorRef& t, const std::vector<std::int64_t>& shape,
                   const char* layout) {
  require_rank(name, t, shape.size(), layout);
  if (t.shape != shape)
    throw Error(fmt::format("{} must have shape {} = [{}], got {}", name, layout,
                            fmt::join(shape, ", "), t.shape_string()));
}

void require_floating(const char* name, const TensorRef& t) {
  if (!is_floating(t.dtype))
    throw Error(fmt::format("{} must be f64, f32, f16 or bf16, got {}", name, dtype_name(t.dtype)));
}

void require_state_dtype(const char* name, const TensorRef& t) {
  if (t.dtype != DType::f32 && t.dtype != DType::f64)
    throw Error(fmt::format("{} must be f32 (or f64), got {}", name, dtype_name(t.dtype)));
}

// A floating tensor of the given shape; optional ones may be absent.
void check(const char* name, const TensorRef& t, const std::vector<std::int64_t>& shape,
           const char* layout, bool optional = false) {
  if (optional && !t.given()) return;
  require_given(name, t, layout);
  require_shape(name, t, shape, layout);
  require_floating(name, t);
}

// cu_seqlens' values (host memory): 0, strictly increasing, ending at T.
void check_offsets(const TensorRef& cu, std::int64_t N, std::int64_t T) {
  const auto at = [&](std::int64_t i) { return core::load<std::int64_t>(cu, i); };
  if (at(0) != 0) throw Error(fmt::format("cu_seqlens[0] must be 0, got {}", at(0)));
  for (std::int64_t i = 1; i <= N; ++i)
    if (at(i) <= at(i - 1))
      throw Error(
          fmt::format("cu_seqlens must be strictly increasing, got cu_seqlens[{}] = {} "
                      "after cu_seqlens[{}] = {}",
                      i, at(i), i - 1, at(i - 1)));
  if (at(N) != T)
    throw Error(fmt::format("cu_seqlens must end at T = {}, got cu_seqlens[{}] = {}", T, N, at(N)));
}

using Named = std::pair<const char*, const TensorRef*>;

// Whether two given tensors share a byte.
bool overlap(const TensorRef& a, const TensorRef& b) {
  const auto start = [](const TensorRef& t) { return reinterpret_cast<std::uintptr_t>(t.data); };
  const auto end = [&](const TensorRef& t) {
    return start(t) + static_cast<std::uintptr_t>(t.numel()) * dtype_size(t.dtype);
  };
  return a.given() && b.given() && a.numel() > 0 && b.numel() > 0 && start(a) < end(b) &&
         start(b) < end(a);
}

// Every written tensor apart from every read one and from the other written ones: a kernel that
// wrote over what it (or a later chunk) still reads would give a wrong answer, silently.
void require_apart(const std::vector<Named>& written, const std::vector<Named>& read) {
  for (std::size_t i = 0; i < written.size(); ++i) {
    for (const Named& r : read)
      if (overlap(*written[i].second, *r.second))
        throw Error(fmt::format("{} must not overlap {} in memory: it is written while {} is read",
                                written[i].first, r.first, r.first));
    for (std::size_t j = 0; j < i; ++j)
      if (overlap(*written[i].second, *written[j].second))
        throw Error(fmt::format("{} and {} must not overlap in memory: both are written",
                                written[j].first, written[i].first));
  }
}

std::vector<Named> inputs_of(const DeltaRuleInputs& in) {
  return {{"q", &in.q},
          {"k", &in.k},
          {"v", &in.v},
          {"g", &in.g},
          {"beta", &in.beta},
          {"initial_state", &in.initial_state},
          {"cu_seqlens", &in.cu_seqlens}};
}

}  // namespace

DeltaRuleShape validate(const DeltaRuleInputs& in) {
  return validate_shapes(in, true);
}

DeltaRuleShape validate_shapes(const DeltaRuleInputs& in, bool read_cu_seqlens) {
  require_given("q", in.q, "[B, T, HK, K]");
  require_rank("q", in.q, 4, "[B, T, HK, K]");
  require_floating("q", in.q);
  const std::int64_t B = in.q.shape[0], T = in.q.shape[1], HK = in.q.shape[2], K = in.q.shape[3];
  if (B < 1 || T < 1 || HK < 1 || K < 1)
    throw Error(
        fmt::format("q must have positive dimensions [B, T, HK, K], got {}", in.q.shape_string()));
  check("k", in.k, {B, T, HK, K}, "[B, T, HK, K]");
  if (in.k.dtype != in.q.dtype)
    throw Error(fmt::format("k must have q's dtype {}, got {}", dtype_name(in.q.dtype),
                            dtype_name(in.k.dtype)));

  require_given("v", in.v, "[B, T, HV, V]");
  require_rank("v", in.v, 4, "[B, T, HV, V]");
  const std::int64_t HV = in.v.shape[2], V = in.v.shape[3];
  check("v", in.v, {B, T, HV, V}, "[B, T, HV, V]");
  if (in.v.dtype != in.q.dtype)
    throw Error(fmt::format("v must have q's dtype {}, got {}", dtype_name(in.q.dtype),
                            dtype_name(in.v.dtype)));
  if (HV < 1 || V < 1)
    throw Error(
        fmt::format("v must have positive dimensions [B, T, HV, V], got {}", in.v.shape_string()));
  if (HV % HK != 0)
    throw Error(
        fmt::format("HV (v.shape[2] = {}) must be a multiple of HK (q.shape[2] = {})", HV, HK));
  check("g", in.g, {B, T, HV}, "[B, T, HV]");
  check("beta", in.beta, {B, T, HV}, "[B, T, HV]");
  if (in.chunk_size <= 0)
    throw Error(fmt::format("chunk_size must be positive, got {}", in.chunk_size));

  std::int64_t N = B;
  if (in.cu_seqlens.given()) {
    const TensorRef& cu = in.cu_seqlens;
    require_rank("cu_seqlens", cu, 1, "[N + 1]");
    if (cu.dtype != DType::i32 && cu.dtype != DType::i64)
      throw Error(fmt::format("cu_seqlens must be i32 or i64, got {}", dtype_name(cu.dtype)));
    if (B != 1)
      throw Error(
          fmt::format("cu_seqlens requires B = 1 (sequences packed along T), got B = {}", B));
    N = cu.shape[0] - 1;
    if (N < 1)
      throw Error(fmt::format("cu_seqlens must hold N + 1 >= 2 offsets, got {}", cu.shape[0]));
    if (read_cu_seqlens) check_offsets(cu, N, T);
  }
  if (in.initial_state.given()) {
    check("initial_state", in.initial_state, {N, HV, K, V}, "[N, HV, K, V]");
    require_state_dtype("initial_state", in.initial_state);
  }
  return {B, T, HK, HV, K, V, N};
}

std::vector<Sequence> sequences(const DeltaRuleInputs& in, const DeltaRuleShape& s) {
  std::vector<Sequence> out;
  if (!in.cu_seqlens.given()) {
    for (std::int64_t b = 0; b < s.B; ++b) out.push_back({b, 0, s.T});
    return out;
  }
  for (std::int64_t n = 0; n < s.N; ++n) {
    const auto begin = core::load<std::int64_t>(in.cu_seqlens, n);
    out.push_back({0, begin, core::load<std::int64_t>(in.cu_seqlens, n + 1) - begin});
  }
  return out;
}

void validate_outputs(const DeltaRuleInputs& in, const DeltaRuleShape& s,
                      const DeltaRuleOutputs& out) {
  check("o", out.o, {s.B, s.T, s.HV, s.V}, "[B, T, HV, V]");
  check("final_state", out.final_state, {s.N, s.HV, s.K, s.V}, "[N, HV, K, V]", true);
  require_apart({{"o", &out.o}, {"final_state", &out.final_state}}, inputs_of(in));
}

void validate_grad_inputs(const DeltaRuleShape& s, const TensorRef& d_o,
                          const TensorRef& d_final_state) {
  check("d_o", d_o, {s.B, s.T, s.HV, s.V}, "[B, T, HV, V]");
  check("d_final_state", d_final_state, {s.N, s.HV, s.K, s.V}, "[N, HV, K, V]", true);
}

void validate_grads(const DeltaRuleInputs& in, const DeltaRuleShape& s, const DeltaRuleGrads& gr) {
  validate_grad_inputs(s, gr.d_o, gr.d_final_state);
  check("dq", gr.dq, {s.B, s.T, s.HK, s.K}, "[B, T, HK, K]");
  check("dk", gr.dk, {s.B, s.T, s.HK, s.K}, "[B, T, HK, K]");
  check("dv", gr.dv, {s.B, s.T, s.HV, s.V}, "[B, T, HV, V]");
  check("dg", gr.dg, {s.B, s.T, s.HV}, "[B, T, HV]");
  check("dbeta", gr.dbeta, {s.B, s.T, s.HV}, "[B, T, HV]");
  if (in.initial_state.given())
    check("dh0", gr.dh0, {s.N, s.HV, s.K, s.V}, "[N, HV, K, V]");
  else if (gr.dh0.given())
    throw Error("dh0 was given but initial_state was not: dh0 exists only with an initial state");
  std::vector<Named> read = inputs_of(in);
  read.insert(read.end(), {{"d_o", &gr.d_o}, {"d_final_state", &gr.d_final_state}});
  require_apart({{"dq", &gr.dq},
                 {"dk", &gr.dk},
                 {"dv", &gr.dv},
                 {"dg", &gr.dg},
                 {"dbeta", &gr.dbeta},
                 {"dh0", &gr.dh0}},
                read);
}

}  // namespace gdn
