// The float32 chunked path against the float64 recurrence, on outputs, final state and every
// gradient, across awkward lengths, chunk sizes, GQA groups, K != V, options and varlen.
#include <gtest/gtest.h>

#include <fmt/format.h>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "testing.h"

namespace gdn {
namespace {

using testing::expect_close;
using testing::run;

constexpr double kF32Tolerance = 1e-5;

std::string describe(const Problem& p) {
  return fmt::format("B={} T={} HK={} HV={} K={} V={} C={} l2norm={} h0={} dht={} seqlens={}", p.B,
                     p.T, p.HK, p.HV, p.K, p.V, p.chunk_size, p.use_qk_l2norm, p.initial_state,
                     p.final_state_grad, p.seqlens.size());
}

void check_against_recurrence(const Problem& p, double tol = kF32Tolerance) {
  ProblemData data = generate(p);
  ProblemResults chunked = run(p, data, Method::chunked, DType::f32);
  ProblemResults oracle = run(p, data, Method::recurrent, DType::f64);
  expect_close(chunked, oracle, tol, describe(p));
}

struct LengthCase {
  std::int64_t T;
  int chunk;
};

class Lengths : public ::testing::TestWithParam<LengthCase> {};

TEST_P(Lengths, MatchesRecurrence) {
  Problem p{.B = 2, .T = GetParam().T, .HK = 2, .HV = 4, .K = 16, .V = 24};
  p.chunk_size = GetParam().chunk;
  p.initial_state = true;
  p.final_state_grad = true;
  p.seed = static_cast<std::uint64_t>(GetParam().T * 131 + GetParam().chunk);
  check_against_recurrence(p);
}

INSTANTIATE_TEST_SUITE_P(
    Chunked, Lengths,
    ::testing::Values(LengthCase{1, 64}, LengthCase{63, 64}, LengthCase{64, 64}, LengthCase{65, 64},
                      LengthCase{300, 64}, LengthCase{1025, 64}, LengthCase{300, 16},
                      LengthCase{300, 32}, LengthCase{300, 128}, LengthCase{65, 1},
                      LengthCase{65, 7}),
    [](const auto& test) { return fmt::format("T{}_C{}", test.param.T, test.param.chunk); });

struct OptionCase {
  std::int64_t HK, HV;
  bool l2norm, h0, dht;
};

class Options : public ::testing::TestWithParam<OptionCase> {};

TEST_P(Options, MatchesRecurrence) {
  const OptionCase& c = GetParam();
  Problem p{.B = 1, .T = 130, .HK = c.HK, .HV = c.HV, .K = 32, .V = 16};
  p.use_qk_l2norm = c.l2norm;
  p.initial_state = c.h0;
  p.final_state_grad = c.dht;
  p.seed = 7;
  check_against_recurrence(p);
}

INSTANTIATE_TEST_SUITE_P(Chunked, Options,
                         ::testing::Values(OptionCase{2, 2, true, false, false},
                                           OptionCase{2, 4, false, true, false},
                                           OptionCase{1, 4, true, true, true},
                                           OptionCase{3, 6, false, false, true},
                                           OptionCase{1, 1, false, true, true}),
                         [](const auto& test) {
                           const OptionCase& c = test.param;
                           return fmt::format("HK{}_HV{}_l2{}_h0{}_dht{}", c.HK, c.HV,
                                              int(c.l2norm), int(c.h0), int(c.dht));
                         });

TEST(Chunked, VarlenMatchesRecurrence) {
  Problem p{.HK = 2, .HV = 4, .K = 16, .V = 16};
  p.seqlens = {1, 63, 64, 65, 130, 7};
  p.initial_state = true;
  p.final_state_grad = true;
  p.seed = 11;
  check_against_recurrence(p);
}

// A packed batch equals its sequences run one by one.
TEST(Chunked, VarlenEqualsSeparateRuns) {
  Problem packed{.HK = 1, .HV = 2, .K = 16, .V = 8};
  packed.seqlens = {70, 5, 64};
  packed.initial_state = true;
  packed.final_state_grad = true;
  packed.seed = 3;
  ProblemData data = generate(packed);
  ProblemResults whole = run(packed, data, Method::chunked, DType::f32);

  std::int64_t begin = 0;
  for (std::size_t n = 0; n < packed.seqlens.size(); ++n) {
    const std::int64_t len = packed.seqlens[n];
    Problem one = packed;
    one.seqlens.clear();
    one.T = len;
    ProblemData part = generate(one);  // right shapes; contents replaced by the packed slice
    const auto copy_rows = [&](HostTensor& dst, const HostTensor& src, std::int64_t row_elems,
                               std::int64_t first_row) {
      const std::size_t bytes = static_cast<std::size_t>(row_elems) * dtype_size(src.dtype);
      std::copy_n(src.bytes.begin() + static_cast<std::ptrdiff_t>(first_row * bytes),
                  dst.bytes.size(), dst.bytes.begin());
    };
    copy_rows(part.q, data.q, one.HK * one.K, begin);
    copy_rows(part.k, data.k, one.HK * one.K, begin);
    copy_rows(part.v, data.v, one.HV * one.V, begin);
    copy_rows(part.g, data.g, one.HV, begin);
    copy_rows(part.beta, data.beta, one.HV, begin);
    copy_rows(part.d_o, data.d_o, one.HV * one.V, begin);
    const std::int64_t state = one.HV * one.K * one.V;
    copy_rows(part.initial_state, data.initial_state, state, static_cast<std::int64_t>(n));
    copy_rows(part.d_final_state, data.d_final_state, state, static_cast<std::int64_t>(n));
    ProblemResults alone = run(one, part, Method::chunked, DType::f32);

    ProblemResults slice = allocate_results(one, DType::f32);
    copy_rows(slice.o, whole.o, one.HV * one.V, begin);
    copy_rows(slice.final_state, whole.final_state, state, static_cast<std::int64_t>(n));
    copy_rows(slice.dq, whole.dq, one.HK * one.K, begin);
    copy_rows(slice.dk, whole.dk, one.HK * one.K, begin);
    copy_rows(slice.dv, whole.dv, one.HV * one.V, begin);
    copy_rows(slice.dg, whole.dg, one.HV, begin);
    copy_rows(slice.dbeta, whole.dbeta, one.HV, begin);
    copy_rows(slice.dh0, whole.dh0, state, static_cast<std::int64_t>(n));
    testing::expect_close(slice, alone, 1e-6, fmt::format("sequence {}", n));
    begin += len;
  }
}

// The bar: f32 chunked within 1e-5 of float64 at T = 4096 on outputs and all gradients.
TEST(Chunked, LongSequenceWithin1e5) {
  Problem p{.B = 1, .T = 4096, .HK = 1, .HV = 2, .K = 64, .V = 64};
  p.initial_state = true;
  p.final_state_grad = true;
  p.seed = 4096;
  check_against_recurrence(p);
}

// Fast gates drive the decays and the state through float32's denormal range, which the chunked
// passes flush to zero (cpu/flush_denormals.h): g = -1.5 on every token of half the heads makes
// exp(G) fall from e^-1.5 to e^-96 = 2e-42 across a 64-token chunk. The results stay within the
// float32 tolerance of the float64 recurrence, and the caller's floating-point mode (MXCSR) is the
// same after a forward and a backward: the flush lives on the op's threads only while it runs.
TEST(Chunked, DenormalRangeWithinToleranceAndCallersModeKept) {
  Problem p{.B = 1, .T = 640, .HK = 2, .HV = 4, .K = 32, .V = 32};
  p.initial_state = true;
  p.final_state_grad = true;
  p.seed = 17;
  ProblemData data = generate(p);
  for (std::int64_t t = 0; t < p.T; ++t)
    for (std::int64_t hv = 0; hv < p.HV; hv += 2) core::store(data.g.ref(), t * p.HV + hv, -1.5);
#if defined(__SSE__)
  const unsigned mode = _mm_getcsr();
#endif
  ProblemResults chunked = run(p, data, Method::chunked, DType::f32);
#if defined(__SSE__)
  EXPECT_EQ(_mm_getcsr(), mode);
#endif
  ProblemResults oracle = run(p, data, Method::recurrent, DType::f64);
  expect_close(chunked, oracle, kF32Tolerance, describe(p));
}

TEST(Chunked, Bf16InputsCloseToRecurrence) {
  Problem p{.B = 1, .T = 200, .HK = 2, .HV = 4, .K = 32, .V = 32};
  p.dtype = DType::bf16;
  p.initial_state = true;
  p.seed = 5;
  // Same bf16-stored inputs on both sides: only float32 compute separates them.
  check_against_recurrence(p);
}

// A chunk larger than T is one chunk of T: the same results, and memory that does not grow with
// the chunk size (its c x c blocks would take exabytes).
TEST(Chunked, ChunkLargerThanTEqualsChunkT) {
  Problem p{.B = 2, .T = 40, .HK = 1, .HV = 2, .K = 8, .V = 4};
  p.chunk_size = 40;
  ProblemData data = generate(p);
  ProblemResults expected = run(p, data, Method::chunked, DType::f32);
  data.chunk_size = 1'000'000'000;
  ProblemResults huge = run(p, data, Method::chunked, DType::f32);
  expect_close(huge, expected, 0, "chunk 1e9");
}

// Full resets (issue 11): g = -inf, -1e38, -1e37, -200 among ordinary gates, several in one
// chunk, at the first and the last token of chunks, at random (rate), on fresh inputs. The
// chunked path must match the recurrence to its usual 1e-5 on every output and gradient, and a
// reset's dg must be exactly 0, as in the recurrence (core/reset.h).
struct ResetCase {
  std::string name;
  Problem problem;
  std::vector<std::int64_t> tokens;
  double rate;
};

class Resets : public ::testing::TestWithParam<ResetCase> {};

TEST_P(Resets, MatchRecurrence) {
  const ResetCase& c = GetParam();
  ProblemData data = generate(c.problem);
  const std::int64_t resets = testing::add_resets(data, c.tokens, c.rate, c.problem.seed + 1);
  ASSERT_GT(resets, 0);
  ProblemResults chunked = run(c.problem, data, Method::chunked, DType::f32);
  ProblemResults oracle = run(c.problem, data, Method::recurrent, DType::f64);
  expect_close(chunked, oracle, kF32Tolerance, describe(c.problem));
  const TensorRef g = data.g.ref(), dg = chunked.dg.ref(), dg64 = oracle.dg.ref();
  std::int64_t zeros = 0;
  for (std::int64_t i = 0; i < g.numel(); ++i) {
    if (core::load<double>(g, i) > -128) continue;
    // exp(g) is 0 in float64 below -745; above, the recurrence's dg is exp(g) times O(1).
    EXPECT_LE(std::abs(core::load<double>(dg64, i)), 1e-80) << "recurrence, gate " << i;
    EXPECT_EQ(core::load<double>(dg, i), 0.0) << "chunked, gate " << i;
    ++zeros;
  }
  EXPECT_EQ(zeros, resets);
}

std::vector<ResetCase> reset_cases() {
  // Chunks of 64: resets at both ends of the first three chunks, and five in the second.
  const std::vector<std::int64_t> ends = {0, 63, 64, 70, 71, 72, 100, 127, 128, 191, 299};
  Problem batch{.B = 2, .T = 300, .HK = 2, .HV = 4, .K = 16, .V = 24};
  batch.initial_state = true;
  batch.final_state_grad = true;
  batch.seed = 21;
  Problem small_chunks = batch;  // chunks of 16: 15, 16 and 63, 64 are chunk ends and starts
  small_chunks.chunk_size = 16;
  small_chunks.seed = 22;
  Problem one = batch;  // chunks of one token: every reset is a whole chunk
  one.B = 1, one.T = 65, one.chunk_size = 1, one.seed = 23;
  Problem plain{.B = 1, .T = 200, .HK = 3, .HV = 6, .K = 32, .V = 16};
  plain.use_qk_l2norm = false;  // no initial state: the state starts at 0 anyway
  plain.seed = 24;
  Problem varlen{.HK = 2, .HV = 4, .K = 16, .V = 16};
  varlen.seqlens = {1, 63, 64, 65, 130, 7};  // starts 0 1 64 128 193 323
  varlen.initial_state = true;
  varlen.final_state_grad = true;
  varlen.seed = 25;
  Problem dense = batch;  // most gates resets: segments of one or two tokens
  dense.B = 1, dense.seed = 26;
  Problem long_run = batch;  // a long sequence, resets rare: the 1e-5 bar of LongSequenceWithin1e5
  long_run.B = 1, long_run.T = 4096, long_run.HK = 1, long_run.HV = 2, long_run.K = 64;
  long_run.V = 64, long_run.seed = 27;
  return {
      {"batch", batch, ends, 0.01},
      {"chunk16", small_chunks, {0, 15, 16, 17, 20, 31, 63, 64, 65, 200}, 0.02},
      {"chunk1", one, {0, 1, 2, 40, 64}, 0.1},
      {"no_h0_no_l2norm", plain, ends, 0.03},
      {"varlen", varlen, {0, 1, 2, 63, 64, 127, 128, 129, 191, 192, 193, 256, 322, 323, 329}, 0.02},
      {"dense", dense, {}, 0.6},
      {"long", long_run, {0, 63, 64, 1000, 1001, 4095}, 0.002}};
}

INSTANTIATE_TEST_SUITE_P(Chunked, Resets, ::testing::ValuesIn(reset_cases()),
                         [](const auto& test) { return test.param.name; });

// A NaN or inf input at token t (spec 7): the recurrence makes the outputs of tokens >= t
// non-finite; the chunked path may also make those of t's chunk before t, but not those of
// earlier chunks, and leaves every output and gradient of the other sequences as they were.
TEST(Chunked, NonFiniteInputStaysInItsChunkAndAfter) {
  Problem p{.HK = 1, .HV = 2, .K = 16, .V = 8};
  p.seqlens = {50, 100};
  p.T = 150;
  p.chunk_size = 16;
  p.initial_state = true;
  p.final_state_grad = true;
  p.seed = 31;
  ProblemData clean = generate(p);
  ProblemResults reference = run(p, clean, Method::chunked, DType::f32);
  const std::int64_t t = 50 + 37, chunk_start = 50 + 32;  // sequence 1's third chunk
  for (const char* field : {"q", "k", "v", "g", "beta"})
    for (double bad : {std::nan(""), HUGE_VAL}) {
      if (std::string(field) == "g" && bad > 0) continue;  // g <= 0; and g = -inf is a reset
      ProblemData data = clean;
      HostTensor& x = testing::input_named(data, field);
      core::store(x.ref(), t * (x.numel() / p.T), bad);  // head 0 of token t
      ProblemResults got = run(p, data, Method::chunked, DType::f32);
      const std::string what = fmt::format("{} = {}", field, bad);
      EXPECT_FALSE(std::isfinite(core::load<double>(got.o.ref(), t * p.HV * p.V))) << what;
      // The first `rows` rows of each token tensor (and state row 0) are unchanged.
      auto same = [&](HostTensor ProblemResults::*field_of, std::int64_t rows, std::int64_t of) {
        const HostTensor &a = got.*field_of, &b = reference.*field_of;
        const std::size_t bytes = a.bytes.size() / static_cast<std::size_t>(of) * rows;
        EXPECT_TRUE(std::equal(a.bytes.begin(), a.bytes.begin() + bytes, b.bytes.begin())) << what;
      };
      same(&ProblemResults::o, chunk_start, p.T);
      for (auto grad : {&ProblemResults::dq, &ProblemResults::dk, &ProblemResults::dv,
                        &ProblemResults::dg, &ProblemResults::dbeta})
        same(grad, 50, p.T);
      same(&ProblemResults::final_state, 1, 2);
      same(&ProblemResults::dh0, 1, 2);
    }
}

}  // namespace
}  // namespace gdn
