// The NCCL communicators when gdn is built without NCCL (GDN_NCCL=OFF).

#include "gdn/error.h"
#include "gdn/gpu_communicator.h"

namespace gdn {

namespace {
[[noreturn]] void no_nccl() {
  throw Error(
      "gdn was built without NCCL: reconfigure with -DGDN_NCCL=ON (needs nccl.h and libnccl)");
}
}  // namespace

void run_nccl_local(int, const std::function<void(Communicator&)>&, Timeout) {
  no_nccl();
}
std::unique_ptr<Communicator> nccl_world(Timeout) {
  no_nccl();
}
std::string nccl_unique_id() {
  no_nccl();
}
std::unique_ptr<Communicator> nccl_communicator(const std::string&, int, int, int, Timeout) {
  no_nccl();
}

}  // namespace gdn
