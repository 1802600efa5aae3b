// `alpaca-train --version`: this build's version, the git commit it was configured from (CMake
// runs `git rev-parse` at configure time; "unknown" outside a git checkout) and the LibTorch it
// was compiled against; and the CPU it runs on (with ALPACA_CPU_ISA's cap when one is set).
#include <torch/headeronly/version.h>  // defines: TORCH_VERSION_MAJOR, _MINOR, _PATCH

#include <string>

#include "alpaca/cli/dispatch.h"
#include "alpaca/util/cpu_features.h"

#ifndef ALPACA_VERSION
#define ALPACA_VERSION "unknown"
#endif
#ifndef ALPACA_GIT_COMMIT
#define ALPACA_GIT_COMMIT "unknown"
#endif

namespace alpaca::cli {

std::string version_text() {
  return std::string("alpaca-train ") + ALPACA_VERSION + "\ngit commit " + ALPACA_GIT_COMMIT + "\nLibTorch " +
         std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH) + "\nCPU " + cpu::model_name() + "\n";
}

}  // namespace alpaca::cli
