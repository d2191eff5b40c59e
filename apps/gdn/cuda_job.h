#pragma once
// The op on the GPU for `gdn run --device cuda` and `gdn op --device cuda`: the problem's tensors
// go to the device, forward (and backward) run there, the results come back.

#include <cstddef>

#include "context_parallel_job.h"
#include "gdn/communicator.h"
#include "gdn/context_parallel.h"
#include "gdn/problem.h"

namespace gdn::app {

struct CudaTimes {
  double forward_ms = 0, backward_ms = 0;  // CUDA events, after one warm-up call of each
  std::size_t bytes_sent = 0;              // context parallel: by this rank, in the timed step
};

// Throws gdn::Error saying "no CUDA GPU is visible" when the CUDA runtime finds none (or that
// gdn was built without CUDA): `--device cuda` checks it before anything else.
void require_cuda_gpu();

// Results in the dtypes the CUDA path writes: o, dq, dk, dv in q's dtype, dbeta in beta's,
// dg and the states in f32. Throws gdn::Error when gdn was built without CUDA.
ProblemResults run_on_cuda(const ProblemData& data, bool backward, CudaTimes& times);

// Context parallel on GPUs: under mpirun (world given) one GPU per process through NCCL; else
// `ranks` ranks of this process, one per GPU through NCCL when there are that many GPUs
// (one_gpu_per_rank), else virtual ranks sharing the current GPU. Each rank's shard of `data` goes
// to the device; forward (and backward) run `runs` times, the last timed by events on the rank's
// stream. `timeout` bounds each wait for a peer. Returns the whole results (on every rank) and
// the slowest rank's stats.
ProblemResults run_cp_on_cuda(const ProblemData& data, int ranks, Communicator* world,
                              const CpOptions& options, bool backward, int runs, Timeout timeout,
                              CpStats& stats);
bool one_gpu_per_rank(int ranks);

}  // namespace gdn::app
