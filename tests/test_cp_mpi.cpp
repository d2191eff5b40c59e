// Context parallelism across the processes of mpirun (ctest runs 3 and 4): every strategy, with
// initial state, GQA and varlen, equals the single-rank result that each process also computes.
// Prints "N passed, M failed"; exits non-zero on any failure.

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/convert.h"
#include "gdn/context_parallel.h"
#include "gdn/error.h"
#include "gdn/problem.h"

namespace {

using namespace gdn;

// Relative Frobenius error of this rank's token rows and of the states summed over ranks.
double worst_error(Communicator& comm, const ProblemResults& mine, const ProblemResults& single) {
  const int P = comm.size(), r = comm.rank();
  double worst = 0;
  const auto compare = [&](const HostTensor& x, const HostTensor& whole, std::int64_t first) {
    double diff = 0, norm = 0;
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const double ref = core::load<double>(whole.ref(), first + i);
      diff += std::pow(core::load<double>(x.ref(), i) - ref, 2);
      norm += ref * ref;
    }
    worst = std::max(worst, std::sqrt(diff / std::max(norm, 1e-300)));
  };
  for (auto [x, whole] : {std::pair{&mine.o, &single.o},
                          {&mine.dq, &single.dq},
                          {&mine.dk, &single.dk},
                          {&mine.dv, &single.dv},
                          {&mine.dg, &single.dg},
                          {&mine.dbeta, &single.dbeta}})
    compare(*x, *whole, r * x->numel());  // B = 1: the shard is one block
  for (auto [x, whole] :
       {std::pair{&mine.final_state, &single.final_state}, {&mine.dh0, &single.dh0}}) {
    if (x->bytes.empty()) continue;
    std::vector<float> all(static_cast<std::size_t>(x->numel() * P));
    comm.all_gather(x->bytes.data(), all.data(), x->bytes.size());
    HostTensor sum = HostTensor::zeros(DType::f32, x->shape);
    for (int p = 0; p < P; ++p)
      for (std::int64_t i = 0; i < x->numel(); ++i)
        sum.as<float>()[i] += all[static_cast<std::size_t>(p * x->numel() + i)];
    compare(sum, *whole, 0);
  }
  return worst;
}

}  // namespace

int main() {
  auto comm = mpi_world();
  const int P = comm->size();
  Problem problem{.B = 1, .T = 24 * P, .HK = P, .HV = 2 * P, .K = 16, .V = 8};
  problem.chunk_size = 16;
  problem.initial_state = true;
  problem.final_state_grad = true;
  int passed = 0, failed = 0;
  for (bool varlen : {false, true}) {
    problem.seqlens =
        varlen ? std::vector<std::int64_t>{5, 24 * P - 20, 15} : std::vector<std::int64_t>{};
    ProblemData data = generate(problem);
    ProblemResults single = allocate_results(data, DType::f32);
    delta_rule_forward(data.inputs(), single.outputs());
    delta_rule_backward(data.inputs(), single.grads(data));
    ProblemData shard = shard_of(data, comm->rank(), P);
    for (Strategy strategy : all_strategies()) {
      ProblemResults mine = allocate_results(shard, DType::f32);
      CpDeltaRule op(*comm, {strategy});
      op.forward(shard.inputs(), mine.outputs());
      op.backward(shard.inputs(), mine.grads(shard));
      const double error = worst_error(*comm, mine, single);
      const bool ok = error <= 1e-5;
      (ok ? passed : failed) += 1;
      if (comm->rank() == 0 || !ok)
        std::printf("rank %d: %-18s varlen=%d P=%d  max relative error %.2e  %s\n", comm->rank(),
                    std::string(strategy_name(strategy)).c_str(), varlen, P, error,
                    ok ? "ok" : "FAILED");
    }
  }
  if (comm->rank() == 0) std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
