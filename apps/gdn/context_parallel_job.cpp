#include "context_parallel_job.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "cp/cost_model.h"
#include "cp/shard.h"

namespace gdn::app {
namespace {

constexpr HostTensor ProblemResults::*kFields[] = {
    &ProblemResults::o,     &ProblemResults::final_state, &ProblemResults::dq,
    &ProblemResults::dk,    &ProblemResults::dv,          &ProblemResults::dg,
    &ProblemResults::dbeta, &ProblemResults::dh0};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ProblemResults gather(Communicator& comm, const ProblemData& data, ProblemResults& mine) {
  std::vector<ProblemResults> shards(static_cast<std::size_t>(comm.size()), mine);
  for (auto field : kFields) {
    const std::vector<std::byte>& bytes = (mine.*field).bytes;
    std::vector<std::byte> all(bytes.size() * shards.size());
    comm.all_gather(bytes.data(), all.data(), bytes.size());
    for (std::size_t r = 0; r < shards.size(); ++r)
      std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(r * bytes.size()), bytes.size(),
                  (shards[r].*field).bytes.begin());
  }
  ProblemResults whole = allocate_results(data, mine.o.dtype);
  for (auto field : kFields)  // each in the dtype of this rank's (the CUDA path mixes them)
    if (!(whole.*field).bytes.empty())
      whole.*field = HostTensor::zeros((mine.*field).dtype, (whole.*field).shape);
  for (int r = 0; r < comm.size(); ++r) gather_shard(shards[static_cast<std::size_t>(r)], r, whole);
  return whole;
}

double slowest(Communicator& comm, double value) {
  std::vector<double> all(static_cast<std::size_t>(comm.size()));
  comm.all_gather(&value, all.data(), sizeof(double));
  return *std::max_element(all.begin(), all.end());
}

HostTensor gather_tokens(Communicator& comm, const HostTensor& part, std::int64_t T) {
  std::vector<std::byte> all(part.bytes.size() * static_cast<std::size_t>(comm.size()));
  comm.all_gather(part.bytes.data(), all.data(), part.bytes.size());
  std::vector<std::int64_t> shape = part.shape;
  shape[1] = T;
  HostTensor whole = HostTensor::zeros(part.dtype, shape);
  HostTensor block = part;
  for (int r = 0; r < comm.size(); ++r) {
    std::copy_n(
        all.begin() + static_cast<std::ptrdiff_t>(part.bytes.size() * static_cast<std::size_t>(r)),
        part.bytes.size(), block.bytes.begin());
    place_tokens(block, whole, r * part.shape[1]);
  }
  return whole;
}

ProblemResults run_context_parallel(Communicator& comm, const ProblemData& data,
                                    const CpOptions& options, bool backward, CpStats& stats) {
  ProblemData shard = shard_of(data, comm.rank(), comm.size());
  ProblemResults mine = allocate_results(shard, DType::f32);
  CpDeltaRule op(comm, options);
  const std::size_t sent_before = comm.bytes_sent();
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  op.forward(shard.inputs(), mine.outputs());
  const double forward = seconds_since(start);
  if (backward) op.backward(shard.inputs(), mine.grads(shard));
  const double total = seconds_since(start);
  const auto sent = static_cast<double>(comm.bytes_sent() - sent_before);
  stats = {slowest(comm, forward), slowest(comm, total),
           static_cast<std::size_t>(slowest(comm, sent)), op.strategy()};
  return gather(comm, data, mine);
}

Strategy automatic_choice(const Problem& problem, int ranks, int ranks_on_host, Memory memory,
                          int threads, bool training) {
  const std::int64_t N = problem.sequences();
  cp::ShardPlan plan;
  plan.ranks = ranks;
  plan.ranks_on_host = ranks_on_host;
  plan.shape = {problem.B, problem.T / ranks, problem.HK, problem.HV, problem.K, problem.V, N};
  plan.global_sequences = N;
  plan.chains = problem.seqlens.empty() ? problem.B : 1;
  return cp::choose_strategy(plan, memory, training, threads);
}

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* value = std::getenv(name); value && std::atoi(value) > 1) return true;
  return false;
}

}  // namespace gdn::app
