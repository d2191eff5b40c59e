// mpi_world when gdn is built without MPI (GDN_MPI=OFF).

#include "gdn/communicator.h"
#include "gdn/error.h"

namespace gdn {

std::unique_ptr<Communicator> mpi_world(Timeout) {
  throw Error("gdn was built without MPI: reconfigure with -DGDN_MPI=ON (needs an MPI library)");
}

}  // namespace gdn
