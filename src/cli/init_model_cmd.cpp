// PLACEHOLDER until its module lands: replaced wholesale by the owning module's implementation.
#include "alpaca/cli/commands.h"
#include "alpaca/util/error.h"

namespace alpaca::cli {
int run_init_model(const std::vector<std::string>&) {
  ALPACA_FAIL("init-model is not part of this build yet");
}
}  // namespace alpaca::cli
