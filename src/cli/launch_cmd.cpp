// `alpaca-train --nproc_per_node N [--nnodes M --node_rank R --master_addr A --master_port P] <train flags>`:
// torchrun's flags on our binary (or a Kubeflow pod's PET_* variables, dist::pod_launcher_options). Takes the launcher flags out of the arguments (wherever they
// are) and starts N copies of this very binary (/proc/self/exe) with the rest.
#include <unistd.h>

#include <climits>
#include <optional>
#include <string>

#include "alpaca/cli/commands.h"
#include "alpaca/cli/usage_error.h"
#include "alpaca/dist/launch.h"
#include "alpaca/dist/launcher.h"
#include "alpaca/util/error.h"
#include "alpaca/util/text.h"

namespace alpaca::cli {
namespace {

int parse_count(const std::string& flag, const std::string& value) {
  const std::optional<long> v = text::parse_whole_long(value);
  ALPACA_USAGE_CHECK(v && *v >= 0 && *v <= INT_MAX, flag << " expects a non-negative integer, got '" << value << "'");
  return static_cast<int>(*v);
}

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  ALPACA_CHECK(n > 0, "launcher: cannot find this program's path (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

// mpirun/mpiexec may start the launcher once per node (--nnodes of them); more copies than nodes
// would each start --nproc_per_node workers as a separate job, all writing one output_dir.
void check_not_nested(const dist::LauncherOptions& o, const dist::EnvMap& env) {
  for (const char* size_var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const auto it = env.find(size_var);
    if (it == env.end()) continue;
    const std::optional<long> copies = text::parse_whole_long(it->second);
    ALPACA_USAGE_CHECK(!copies || *copies <= o.nnodes,
                       "--nproc_per_node starts the ranks itself, but an MPI launcher started " << *copies
                           << " copies of it (" << size_var << "=" << it->second << ") for --nnodes " << o.nnodes
                           << ": drop mpirun and run alpaca-train --nproc_per_node " << o.nproc_per_node
                           << " once per node, or drop --nproc_per_node and use mpirun -np "
                           << static_cast<long>(o.nproc_per_node) * *copies);
  }
}

}  // namespace

int run_launcher(const std::vector<std::string>& args) {
  // A Kubeflow pod's variables (PyTorchJob, TrainJob torch runtime) first; explicit flags win.
  const dist::EnvMap env = dist::process_env();
  const auto pod = dist::pod_launcher_options(env);
  dist::LauncherOptions opts = pod.value_or(dist::LauncherOptions{});
  opts.program = self_exe();
  bool master_addr_given = pod.has_value() && !opts.master_addr.empty();
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    bool has_value = false;
    if (auto eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_value = true;
    }
    // torchrun spells them with '-' or '_'.
    std::string key = a;
    for (char& c : key)
      if (c == '-') c = '_';
    const bool launcher_flag = key == "__nproc_per_node" || key == "__nnodes" || key == "__node_rank" ||
                               key == "__master_addr" || key == "__master_port" || key == "__standalone";
    if (!launcher_flag) {
      opts.args.push_back(args[i]);
      continue;
    }
    if (key == "__standalone") continue;  // single node on a free port: our default
    if (!has_value) {
      ALPACA_USAGE_CHECK(i + 1 < args.size(), a << " needs a value");
      value = args[++i];
    }
    if (key == "__nproc_per_node") {
      opts.nproc_per_node = parse_count(a, value);
    } else if (key == "__nnodes") {
      ALPACA_USAGE_CHECK(value.find(':') == std::string::npos,
                   "--nnodes " << value << ": elastic node ranges are not supported; give a fixed node count");
      opts.nnodes = parse_count(a, value);
    } else if (key == "__node_rank") {
      opts.node_rank = parse_count(a, value);
    } else if (key == "__master_addr") {
      opts.master_addr = value;
      master_addr_given = true;
    } else if (key == "__master_port") {
      opts.master_port = parse_count(a, value);
    }
  }
  ALPACA_USAGE_CHECK(opts.nproc_per_node >= 1, "--nproc_per_node must be at least 1, got " << opts.nproc_per_node);
  ALPACA_USAGE_CHECK(opts.nnodes >= 1, "--nnodes must be at least 1, got " << opts.nnodes);
  ALPACA_USAGE_CHECK(opts.node_rank < opts.nnodes,
                     "--node_rank " << opts.node_rank << " is outside the " << opts.nnodes << " nodes (--nnodes)");
  ALPACA_USAGE_CHECK(opts.master_port < 65536, "--master_port " << opts.master_port << " is not a TCP port");
  ALPACA_USAGE_CHECK(opts.nnodes == 1 || master_addr_given,
                     "--nnodes " << opts.nnodes << " needs --master_addr: the host of node 0, reachable from every node");
  check_not_nested(opts, env);
  return dist::run_workers(opts);
}

}  // namespace alpaca::cli
