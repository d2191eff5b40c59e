// Bad input gets gdn::Error naming the argument and what was expected.
#include <gtest/gtest.h>

#include <string>

#include "gdn/error.h"
#include "testing.h"

namespace gdn {
namespace {

struct Fixture {
  Problem p{.B = 1, .T = 8, .HK = 2, .HV = 4, .K = 4, .V = 3};
  ProblemData data;
  ProblemResults results;
  DeltaRuleInputs in;

  Fixture() {
    p.initial_state = true;
    data = generate(p);
    results = allocate_results(p, DType::f32);
    in = data.inputs();
  }
  void forward() { delta_rule_forward(in, results.outputs()); }
};

void expect_error(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "expected gdn::Error containing \"" << fragment << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << fragment;
  }
}

TEST(Validate, AcceptsGoodInput) {
  Fixture f;
  EXPECT_NO_THROW(f.forward());
}

TEST(Validate, WrongRank) {
  Fixture f;
  f.in.q.shape = {8, 2, 4};
  expect_error([&] { f.forward(); }, "q must have shape [B, T, HK, K] (rank 4), got rank 3");
}

TEST(Validate, WrongKeyShape) {
  Fixture f;
  f.in.k.shape = {1, 8, 2, 5};
  expect_error([&] { f.forward(); },
               "k must have shape [B, T, HK, K] = [1, 8, 2, 4], got [1, 8, 2, 5]");
}

TEST(Validate, HeadsNotMultiple) {
  Problem p{.B = 1, .T = 8, .HK = 2, .HV = 3, .K = 4, .V = 3};
  ProblemData data = generate(p);
  ProblemResults r = allocate_results(p, DType::f32);
  expect_error([&] { delta_rule_forward(data.inputs(), r.outputs()); },
               "HV (v.shape[2] = 3) must be a multiple of HK (q.shape[2] = 2)");
}

TEST(Validate, NonPositiveChunk) {
  Fixture f;
  f.in.chunk_size = 0;
  expect_error([&] { f.forward(); }, "chunk_size must be positive, got 0");
}

TEST(Validate, GateShape) {
  Fixture f;
  f.in.g.shape = {1, 8, 2};
  expect_error([&] { f.forward(); }, "g must have shape [B, T, HV] = [1, 8, 4], got [1, 8, 2]");
}

TEST(Validate, BetaShape) {
  Fixture f;
  f.in.beta.shape = {1, 8, 4, 1};
  expect_error([&] { f.forward(); }, "beta must have shape [B, T, HV] (rank 3), got rank 4");
}

TEST(Validate, MissingTensor) {
  Fixture f;
  f.in.v.data = nullptr;
  expect_error([&] { f.forward(); }, "v is required");
}

TEST(Validate, InitialStateShape) {
  Fixture f;
  f.in.initial_state.shape = {1, 4, 3, 4};
  expect_error([&] { f.forward(); },
               "initial_state must have shape [N, HV, K, V] = [1, 4, 4, 3], got [1, 4, 3, 4]");
}

TEST(Validate, UnsupportedDtype) {
  Fixture f;
  f.in.q.dtype = DType::i32;
  expect_error([&] { f.forward(); }, "q must be f64, f32, f16 or bf16, got i32");
}

TEST(Validate, MixedDtypes) {
  Fixture f;
  f.in.k.dtype = DType::bf16;
  expect_error([&] { f.forward(); }, "k must have q's dtype f32, got bf16");
}

TEST(Validate, InitialStateDtype) {
  Fixture f;
  f.in.initial_state.dtype = DType::bf16;
  expect_error([&] { f.forward(); }, "initial_state must be f32 (or f64), got bf16");
}

struct Varlen {
  HostTensor cu = HostTensor::zeros(DType::i32, {3});
  Fixture f;
  Varlen(std::int32_t a, std::int32_t b, std::int32_t c) {
    cu.as<std::int32_t>()[0] = a;
    cu.as<std::int32_t>()[1] = b;
    cu.as<std::int32_t>()[2] = c;
    f.in.cu_seqlens = cu.ref();
    f.in.initial_state = {};
  }
};

TEST(Validate, CuSeqlensNotIncreasing) {
  Varlen v(0, 5, 5);
  expect_error([&] { v.f.forward(); },
               "cu_seqlens must be strictly increasing, got cu_seqlens[2] = 5");
}

TEST(Validate, CuSeqlensNotEndingAtT) {
  Varlen v(0, 3, 7);
  expect_error([&] { v.f.forward(); }, "cu_seqlens must end at T = 8, got cu_seqlens[2] = 7");
}

TEST(Validate, CuSeqlensNotStartingAtZero) {
  Varlen v(1, 3, 8);
  expect_error([&] { v.f.forward(); }, "cu_seqlens[0] must be 0, got 1");
}

TEST(Validate, CuSeqlensWithBatch) {
  Problem p{.B = 2, .T = 8, .HK = 1, .HV = 1, .K = 4, .V = 3};
  ProblemData data = generate(p);
  ProblemResults r = allocate_results(p, DType::f32);
  HostTensor cu = HostTensor::zeros(DType::i64, {2});
  cu.as<std::int64_t>()[1] = 8;
  DeltaRuleInputs in = data.inputs();
  in.cu_seqlens = cu.ref();
  expect_error([&] { delta_rule_forward(in, r.outputs()); }, "cu_seqlens requires B = 1");
}

TEST(Validate, VarlenInitialStateCountsSequences) {
  Varlen v(0, 3, 8);
  v.f.in.initial_state = v.f.data.initial_state.ref();  // [1, ...] but N = 2
  expect_error([&] { v.f.forward(); },
               "initial_state must have shape [N, HV, K, V] = [2, 4, 4, 3]");
}

TEST(Validate, OutputShape) {
  Fixture f;
  DeltaRuleOutputs out = f.results.outputs();
  out.o.shape = {1, 8, 4, 4};
  expect_error([&] { delta_rule_forward(f.in, out); },
               "o must have shape [B, T, HV, V] = [1, 8, 4, 3]");
}

TEST(Validate, GradientsNeedDh0WithInitialState) {
  Fixture f;
  DeltaRuleGrads g = f.results.grads(f.data);
  g.dh0 = {};
  expect_error([&] { delta_rule_backward(f.in, g); }, "dh0 is required");
}

TEST(Validate, GradientOfOutputShape) {
  Fixture f;
  DeltaRuleGrads g = f.results.grads(f.data);
  g.d_o.shape = {1, 8, 4};
  expect_error([&] { delta_rule_backward(f.in, g); }, "d_o must have shape [B, T, HV, V] (rank 4)");
}

// An output written over an input (or over another output) would change what later chunks read:
// a whole alias, a partial one, and the natural in-place state update are all refused.
TEST(Validate, OutputsMustNotOverlapInputs) {
  Fixture f;
  DeltaRuleOutputs out = f.results.outputs();
  out.o.data = f.in.v.data;  // the same shape and dtype as o
  expect_error([&] { delta_rule_forward(f.in, out); },
               "o must not overlap v in memory: it is written while v is read");
  out = f.results.outputs();
  out.final_state.data = f.in.initial_state.data;
  expect_error([&] { delta_rule_forward(f.in, out); },
               "final_state must not overlap initial_state");
  out = f.results.outputs();
  out.o.data = static_cast<float*>(f.in.v.data) + 5;  // a partial overlap, never written
  expect_error([&] { delta_rule_forward(f.in, out); }, "o must not overlap v");
}

TEST(Validate, GradientsMustNotOverlapInputsOrEachOther) {
  Fixture f;
  DeltaRuleGrads g = f.results.grads(f.data);
  g.dv.data = g.d_o.data;
  expect_error([&] { delta_rule_backward(f.in, g); }, "dv must not overlap d_o in memory");
  g = f.results.grads(f.data);
  g.dk.data = g.dq.data;
  expect_error([&] { delta_rule_backward(f.in, g); },
               "dq and dk must not overlap in memory: both are written");
  g = f.results.grads(f.data);
  g.dq.data = f.in.q.data;
  expect_error([&] { delta_rule_backward(f.in, g); }, "dq must not overlap q");
}

// Tensors are cut by token only after their shapes are checked: slice_tokens and place_tokens
// reject what they cannot cut, shard_of checks the whole problem (d_o included) first.
TEST(SliceTokens, RejectsBadRanksAndRanges) {
  const HostTensor t = HostTensor::zeros(DType::f32, {2, 8, 3});
  EXPECT_EQ(slice_tokens(t, 6, 2).shape, (std::vector<std::int64_t>{2, 2, 3}));
  expect_error([&] { slice_tokens(HostTensor::zeros(DType::f32, {}), 0, 1); },
               "slice_tokens: expected a tensor of shape [B, T, ...] (rank >= 2), got rank 0");
  expect_error([&] { slice_tokens(HostTensor::zeros(DType::f32, {8}), 0, 4); }, "got rank 1 [8]");
  expect_error([&] { slice_tokens(t, 6, 4); }, "tokens [6, 6 + 4) are not within T = 8");
  expect_error([&] { slice_tokens(t, -1, 2); }, "are not within T = 8");
  expect_error([&] { slice_tokens(t, 0, -1); }, "are not within T = 8");
}

TEST(SliceTokens, PlaceRejectsPartsThatDoNotFit) {
  HostTensor whole = HostTensor::zeros(DType::f32, {2, 8, 3});
  EXPECT_NO_THROW(place_tokens(HostTensor::zeros(DType::f32, {2, 4, 3}), whole, 4));
  expect_error(
      [&] {
        place_tokens(HostTensor::zeros(DType::f32, {2, 4, 3}), whole, 5);
      },
      "does not fit whole f32 [2, 8, 3] at token 5");
  expect_error(
      [&] {
        place_tokens(HostTensor::zeros(DType::f32, {2, 4, 2}), whole, 0);
      },
      "part f32 [2, 4, 2] does not fit");
  expect_error([&] { place_tokens(HostTensor::zeros(DType::f32, {4}), whole, 0); },
               "place_tokens: part: expected a tensor of shape [B, T, ...]");
}

TEST(SliceTokens, ShardOfChecksGradientsOfOutputFirst) {
  Fixture f;
  for (const std::vector<std::int64_t>& shape :
       std::vector<std::vector<std::int64_t>>{{}, {8}, {1, 6, 4, 3}, {1, 10, 4, 3}}) {
    ProblemData data = f.data;
    data.d_o = HostTensor::zeros(DType::f32, shape);
    expect_error([&] { shard_of(data, 1, 2); }, "d_o must have shape [B, T, HV, V]");
  }
  ProblemData data = f.data;
  data.d_final_state = HostTensor::zeros(DType::f32, {1, 4, 4});
  expect_error([&] { shard_of(data, 0, 2); }, "d_final_state must have shape [N, HV, K, V]");
  data = f.data;
  data.q = HostTensor::zeros(DType::f32, {8});
  expect_error([&] { shard_of(data, 0, 2); }, "q must have shape [B, T, HK, K] (rank 4)");
  expect_error([&] { shard_of(f.data, 2, 2); }, "rank 2 must be in [0, 2)");
}

TEST(HostTensor, HugeOrNegativeSizesAreErrorsNamingTheBytes) {
  expect_error([] { HostTensor::zeros(DType::f32, {std::int64_t{1} << 50}); },
               "cannot allocate a tensor of f32 [1125899906842624]: 4503599627370496 bytes, more "
               "than this machine's memory");
  expect_error(
      [] {
        HostTensor::zeros(DType::f64, {std::int64_t{1} << 40, std::int64_t{1} << 40});
      },
      "overflows 64 bits");
  expect_error([] { HostTensor::zeros(DType::f32, {2, -1}); }, "a dimension is negative");
}

}  // namespace
}  // namespace gdn
