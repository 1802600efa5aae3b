// PLACEHOLDER until its module lands: replaced wholesale by the owning module's implementation.
#include "alpaca/cli/commands.h"
#include "alpaca/util/error.h"

namespace alpaca::cli {
int run_launcher(const std::vector<std::string>&) {
  ALPACA_FAIL("the built-in launcher (--nproc_per_node) is not part of this build yet");
}
}  // namespace alpaca::cli
