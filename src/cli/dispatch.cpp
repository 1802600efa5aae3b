// Subcommand dispatch for the alpaca-train binary (see dispatch.h).
#include "alpaca/cli/dispatch.h"

#include <algorithm>
#include <iostream>
#include <map>

#include "alpaca/cli/commands.h"
#include "alpaca/cli/flag_table.h"
#include "alpaca/cli/train_args.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/dist/launcher.h"

namespace alpaca::cli {
namespace {

bool has_nproc_per_node(const std::vector<std::string>& argv) {
  return std::any_of(argv.begin(), argv.end(), [](const std::string& a) {
    return a == "--nproc_per_node" || a.rfind("--nproc_per_node=", 0) == 0 || a == "--nproc-per-node" ||
           a.rfind("--nproc-per-node=", 0) == 0;
  });
}

std::string subcommand_list() {
  std::string out;
  for (const auto& n : subcommand_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The subcommands that run on the arguments after their name (train, help and version are the
// dispatcher's own).
using Command = int (*)(const std::vector<std::string>&);
const std::map<std::string, Command>& commands() {
  static const std::map<std::string, Command> table = {
      {"init-model", run_init_model}, {"preprocess", run_preprocess},   {"merge", run_merge},
      {"consolidate", run_consolidate}, {"estimate-memory", run_estimate_memory}, {"generate", run_generate}};
  return table;
}

}  // namespace

const std::vector<std::string>& subcommand_names() {
  static const std::vector<std::string> names = {"train",    "init-model",      "preprocess", "merge",
                                                    "consolidate", "generate", "estimate-memory", "help",
                                                    "version"};
  return names;
}

int dispatch(const std::vector<std::string>& argv) {
  ALPACA_USAGE_CHECK(!argv.empty(), "no arguments: give training flags (`alpaca-train --help` lists them) or a "
                                    "subcommand: " << subcommand_list());
  const std::string& first = argv.front();
  std::vector<std::string> rest(argv.begin() + 1, argv.end());
  if (first == "--version" || first == "version") {
    std::cout << version_text();
    return 0;
  }
  if (auto it = commands().find(first); it != commands().end()) return it->second(rest);
  if (first == "help") {
    std::cout << train_help();
    return 0;
  }
  std::vector<std::string> train_argv = first == "train" ? rest : argv;
  if (first != "train" && first.rfind("-", 0) != 0) {
    std::vector<std::string> names = subcommand_names();
    std::string guess = closest_name(first, names);
    ALPACA_USAGE_FAIL("unknown subcommand '" << first << "'"
                      << (guess.empty() ? "; use one of " + subcommand_list() + ", or start with a --flag"
                                        : "; did you mean '" + guess + "'?"));
  }
  // A Kubeflow pod (PET_NPROC_PER_NODE set, not yet a worker) is a launch too: run_launcher reads it.
  if (has_nproc_per_node(train_argv) || dist::pod_launcher_options(dist::process_env()))
    return run_launcher(train_argv);
  return run_train(train_argv);
}

}  // namespace alpaca::cli
