#pragma once
// Communicators on device memory (see gdn/communicator.h for what a device communicator
// promises): NCCL across GPUs, and P virtual ranks sharing one GPU so that every strategy can be
// tested on a single card. Available when gdn is built with CUDA (NCCL where it was found); each
// throws gdn::Error otherwise.

#include <functional>
#include <memory>
#include <string>

#include "gdn/communicator.h"

namespace gdn {

// P virtual ranks on the current GPU: a thread per rank, each with its own stream; a message is
// a device copy ordered by events, so the ranks' kernels run concurrently where the GPU has room.
void run_on_one_gpu(int ranks, const std::function<void(Communicator&)>& fn,
                    Timeout timeout = kDefaultTimeout);

// NCCL in one process driving `ranks` GPUs of this machine (rank r on device r), a thread per
// rank; rethrows the first error any rank threw, after every rank has returned.
void run_nccl_local(int ranks, const std::function<void(Communicator&)>& fn,
                    Timeout timeout = kDefaultTimeout);

// NCCL under mpirun, one GPU per process (the local rank modulo the visible devices; MPI
// broadcasts the NCCL id). The communicator's stream is on that device, which becomes current.
std::unique_ptr<Communicator> nccl_world(Timeout timeout = kDefaultTimeout);

// A NCCL group whose processes another layer started and can broadcast bytes between
// (torch.distributed, a job launcher): one rank makes the id, every rank gets its bytes, then each
// makes its communicator on `device` (a collective call: it returns once every rank has joined,
// or throws after `timeout`).
std::string nccl_unique_id();
std::unique_ptr<Communicator> nccl_communicator(const std::string& unique_id, int rank, int ranks,
                                                int device, Timeout timeout = kDefaultTimeout);

// The communicator's GPU count in this process: run_on_one_gpu and run_nccl_local pick with it.
int visible_gpus();

}  // namespace gdn
