// The launcher-exported rank, read before any communicator exists (see log.h).
#include <cstdlib>

#include "alpaca/util/log.h"

namespace alpaca::log {

int env_rank() {
  // torchrun first, then the MPI launchers, then Slurm: the order dist/ discovers launches in.
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    const char* v = std::getenv(name);
    if (v && *v) return std::atoi(v);
  }
  return -1;
}

}  // namespace alpaca::log
