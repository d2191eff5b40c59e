// Context parallelism: every strategy over P in-process ranks equals the single-rank result on
// outputs, final state and every gradient (spec 4-5).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <random>

#include "cp/backend.h"
#include "gdn/context_parallel.h"
#include "gdn/error.h"
#include "testing.h"

namespace gdn {
namespace {

// The single-rank f32 path is within ~3e-7 of float64; CP differs from it by rounding only.
constexpr double kTolerance = 1e-5;

ProblemResults run_cp(ProblemData& data, int ranks, CpOptions options) {
  ProblemResults whole = allocate_results(data, DType::f32);
  std::mutex mutex;
  run_in_process(ranks, [&](Communicator& comm) {
    ProblemData shard = shard_of(data, comm.rank(), ranks);
    ProblemResults mine = allocate_results(shard, DType::f32);
    CpDeltaRule op(comm, options);
    op.forward(shard.inputs(), mine.outputs());
    op.backward(shard.inputs(), mine.grads(shard));
    const std::lock_guard lock(mutex);
    gather_shard(mine, comm.rank(), whole);
  });
  return whole;
}

struct Case {
  std::string name;
  Problem problem;
  bool resets = false;  // full resets over g (testing::add_resets; issue 11)
};

std::vector<Case> cases() {
  Problem plain{.B = 2, .T = 120, .HK = 4, .HV = 8, .K = 16, .V = 8};
  plain.chunk_size = 16;
  plain.seed = 1;
  Problem states = plain;
  states.initial_state = true;
  states.final_state_grad = true;
  states.seed = 2;
  Problem gqa = states;  // one key head for four value heads
  gqa.HK = 2;
  gqa.seed = 3;
  Problem varlen = states;
  varlen.seqlens = {7, 50, 3, 60};  // straddles every P in {2, 3, 4, 8}
  varlen.seed = 4;
  Problem long_varlen = states;
  long_varlen.seqlens = {100, 20};  // the first spans several ranks whole
  long_varlen.seed = 5;
  Problem resets = gqa;  // resets at shard ends for P = 2, 3, 4, 8 (shards of 60, 40, 30, 15)
  resets.seed = 6;
  Problem varlen_resets = varlen;
  varlen_resets.seed = 7;
  return {{"plain", plain},
          {"states", states},
          {"gqa", gqa},
          {"varlen", varlen},
          {"long_varlen", long_varlen},
          {"resets", resets, true},
          {"varlen_resets", varlen_resets, true}};
}

bool fits(Strategy strategy, const Problem& p, int ranks) {
  return strategy != Strategy::ulysses || (p.HK % ranks == 0 && p.HV % ranks == 0);
}

class StrategyTest : public ::testing::TestWithParam<std::tuple<Strategy, int>> {};

TEST_P(StrategyTest, EqualsSingleRank) {
  const auto [strategy, ranks] = GetParam();
  for (Case& c : cases()) {
    if (!fits(strategy, c.problem, ranks)) continue;
    ProblemData data = generate(c.problem);
    if (c.resets) {
      // Several per chunk of 16 and per shard, at shard and chunk ends and starts, at random.
      const std::vector<std::int64_t> tokens = {0,  1,  14, 15, 16, 29, 30, 31, 39,  40,
                                                45, 59, 60, 61, 75, 89, 90, 91, 105, 119};
      ASSERT_GT(testing::add_resets(data, tokens, 0.03, c.problem.seed), 0);
    }
    ProblemResults single = testing::run(c.problem, data, Method::chunked, DType::f32);
    if (c.resets && ranks == 1) {  // the single rank against float64, once per strategy
      ProblemResults oracle = testing::run(c.problem, data, Method::recurrent, DType::f64);
      testing::expect_close(single, oracle, kTolerance, c.name + " against float64");
    }
    for (bool recompute : {false, true}) {
      if (recompute && (strategy == Strategy::relay || strategy == Strategy::ulysses)) continue;
      ProblemResults cp = run_cp(data, ranks, {strategy, recompute});
      testing::expect_close(cp, single, kTolerance,
                            fmt::format("{} P={} {} recompute={}", strategy_name(strategy), ranks,
                                        c.name, recompute));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cp, StrategyTest,
    ::testing::Combine(::testing::Values(Strategy::relay, Strategy::summary_chain,
                                         Strategy::summary_allgather, Strategy::scan,
                                         Strategy::ulysses, Strategy::automatic),
                       ::testing::Values(1, 2, 3, 4, 8)),
    [](const auto& test) {
      std::string name(strategy_name(std::get<0>(test.param)));
      std::replace(name.begin(), name.end(), '-', '_');
      return fmt::format("{}_P{}", name, std::get<1>(test.param));
    });

TEST(Cp, UlyssesNeedsDivisibleHeads) {
  Problem p{.B = 1, .T = 24, .HK = 2, .HV = 4, .K = 8, .V = 8};
  ProblemData data = generate(p);
  try {
    run_cp(data, 3, {Strategy::ulysses});
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("ulysses needs HK (2) and HV (4) divisible by the ranks (3)"),
        std::string::npos)
        << e.what();
  }
}

TEST(Cp, MismatchedShardsAreRejected) {
  Problem p{.B = 1, .T = 24, .HK = 1, .HV = 1, .K = 8, .V = 8};
  try {
    run_in_process(2, [&](Communicator& comm) {
      Problem mine = p;
      mine.T = comm.rank() == 0 ? 12 : 8;
      ProblemData data = generate(mine);
      ProblemResults r = allocate_results(data, DType::f32);
      CpDeltaRule op(comm, {Strategy::relay});
      op.forward(data.inputs(), r.outputs());
    });
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("every rank must hold T / P tokens"), std::string::npos)
        << e.what();
  }
}

TEST(Cp, StrategyNames) {
  for (Strategy s : all_strategies()) EXPECT_EQ(parse_strategy(strategy_name(s)), s);
  EXPECT_EQ(parse_strategy("auto"), Strategy::automatic);
  EXPECT_THROW(parse_strategy("ring"), Error);
}

// The CPU backend's map algebra (cp/backend.h) on [count] maps of K x K and K x V.
struct MapAlgebra {
  std::int64_t count = 3, K = 5, V = 4;
  std::unique_ptr<cp::Backend> backend = cp::cpu_backend();
  std::mt19937 rng{3};

  std::vector<float> random(std::int64_t size) {
    std::normal_distribution<float> normal(0.f, 0.3f);
    std::vector<float> m(static_cast<std::size_t>(size));
    for (float& x : m) x = normal(rng);
    return m;
  }
  std::vector<float> map() { return random(count * (K * K + K * V)); }
  std::vector<float> after(const std::vector<float>& second, const std::vector<float>& first) {
    std::vector<float> out(first.size());
    backend->compose(second.data(), first.data(), count, K, V, out.data());
    return out;
  }
  std::vector<float> apply(const std::vector<float>& m, const std::vector<float>& x) {
    std::vector<float> y(x.size());
    backend->apply(m.data(), count, K, V, x.data(), y.data());
    return y;
  }
};

// (M2, N2) o (M1, N1) = (M2 M1, M2 N1 + N2) is associative and applies like the two in turn.
TEST(Affine, CompositionIsAssociative) {
  MapAlgebra alg;
  const std::vector<float> a = alg.map(), b = alg.map(), c = alg.map();
  const std::vector<float> left = alg.after(alg.after(c, b), a),
                           right = alg.after(c, alg.after(b, a));
  for (std::size_t i = 0; i < left.size(); ++i) EXPECT_NEAR(left[i], right[i], 1e-5);
  const std::vector<float> x = alg.random(alg.count * alg.K * alg.V);
  const std::vector<float> once = alg.apply(alg.after(b, a), x),
                           twice = alg.apply(b, alg.apply(a, x));
  for (std::size_t i = 0; i < once.size(); ++i) EXPECT_NEAR(once[i], twice[i], 1e-5);
}

// Backward maps compose with transposed matrices: (M2 M1)^T = M1^T M2^T.
TEST(Affine, TransposeReversesComposition) {
  MapAlgebra alg;
  std::vector<float> a = alg.map(), b = alg.map();
  std::vector<float> forward = alg.after(b, a);
  for (std::vector<float>* m : {&forward, &a, &b})
    alg.backend->transpose_matrices(m->data(), alg.count, alg.K);
  const std::vector<float> backward = alg.after(a, b);
  for (std::int64_t i = 0; i < alg.count * alg.K * alg.K; ++i)
    EXPECT_NEAR(forward[static_cast<std::size_t>(i)], backward[static_cast<std::size_t>(i)], 1e-5);
}

}  // namespace
}  // namespace gdn
