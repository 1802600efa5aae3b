// Launch discovery: turns the variables of torchrun, Open MPI, MPICH/Hydra or Slurm into a
// LaunchInfo, checking that they describe one consistent job.
#include "alpaca/dist/launch.h"

#include <cstdlib>
#include <optional>
#include <sstream>
#include <vector>

#include "alpaca/util/error.h"
#include "alpaca/util/text.h"

extern char** environ;

namespace alpaca::dist {
namespace {

// Every variable discovery may read, shown in error messages so the user sees what we saw.
const char* const kLaunchVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
    "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NNODES", "SLURM_STEP_NUM_NODES", "SLURM_NTASKS_PER_NODE",
    "SLURM_STEP_TASKS_PER_NODE"};

std::string show_vars(const EnvMap& env) {
  std::ostringstream os;
  bool any = false;
  for (const char* name : kLaunchVars) {
    auto it = env.find(name);
    if (it == env.end()) continue;
    os << (any ? " " : "") << name << "=" << it->second;
    any = true;
  }
  return any ? os.str() : std::string("(no launch variables set)");
}

bool has(const EnvMap& env, const char* name) { return env.count(name) > 0; }

int get_int(const EnvMap& env, const char* name, const char* launcher) {
  auto it = env.find(name);
  ALPACA_CHECK(it != env.end(), launcher << " launch: " << name << " is not set; launch variables: "
                                         << show_vars(env) << ". Set it or unset the others.");
  const std::string& s = it->second;
  const std::optional<long> v = text::parse_whole_long(s);
  ALPACA_CHECK(v && *v >= 0 && *v < (1L << 30),
               launcher << " launch: " << name << "=" << s << " is not a non-negative integer; launch variables: "
                        << show_vars(env));
  return static_cast<int>(*v);
}

int get_int_or(const EnvMap& env, const char* name, const char* launcher, int fallback) {
  return has(env, name) ? get_int(env, name, launcher) : fallback;
}

// A count of processes or nodes (WORLD_SIZE, LOCAL_WORLD_SIZE, PMI_SIZE, ...): at least 1. A
// script's $((NNODES * NPROC)) over an unset variable gives 0, which would divide by zero later.
int get_count(const EnvMap& env, const char* name, const char* launcher) {
  const int v = get_int(env, name, launcher);
  ALPACA_CHECK(v >= 1, launcher << " launch: " << name << "=" << v << " must be at least 1 (a count of processes or "
                                   "nodes); launch variables: " << show_vars(env));
  return v;
}

int get_count_or(const EnvMap& env, const char* name, const char* launcher, int fallback) {
  return has(env, name) ? get_count(env, name, launcher) : fallback;
}

// Slurm's compressed per-node task counts, e.g. "4(x2),3" = {4, 4, 3}.
std::vector<int> parse_slurm_tasks_per_node(const std::string& s, const EnvMap& env) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    int count = 0, repeat = 1;
    char x = 0, open = 0, close = 0;
    std::istringstream is(item);
    is >> count;
    bool ok = !is.fail() && count > 0;
    if (ok && is.peek() == '(') {
      is >> open >> x >> repeat >> close;
      ok = !is.fail() && x == 'x' && close == ')' && repeat > 0;
    }
    ok = ok && (is.peek() == EOF);
    ALPACA_CHECK(ok, "Slurm launch: cannot read tasks per node '" << s << "' (expected e.g. 4(x2),3); launch variables: "
                                                                 << show_vars(env));
    out.insert(out.end(), repeat, count);
  }
  return out;
}

void check_consistent(const LaunchInfo& li, const EnvMap& env) {
  const char* who = to_string(li.source);
  ALPACA_CHECK(li.world_size >= 1, who << " launch: world size " << li.world_size << " must be at least 1; launch variables: "
                                       << show_vars(env));
  ALPACA_CHECK(li.rank < li.world_size, who << " launch: rank " << li.rank << " is outside the world of " << li.world_size
                                            << " processes; launch variables: " << show_vars(env));
  ALPACA_CHECK(li.local_world_size >= 1 && li.local_world_size <= li.world_size,
               who << " launch: local world size " << li.local_world_size << " must be in [1, world size "
                   << li.world_size << "]; launch variables: " << show_vars(env));
  ALPACA_CHECK(li.local_rank < li.local_world_size, who << " launch: local rank " << li.local_rank
                                                        << " is outside the " << li.local_world_size
                                                        << " processes of this node; launch variables: " << show_vars(env));
  ALPACA_CHECK(li.num_nodes >= 1 && li.node_rank < li.num_nodes,
               who << " launch: node " << li.node_rank << " is outside the " << li.num_nodes
                   << " nodes of the job; launch variables: " << show_vars(env));
}

// Nodes when only rank and local counts are known: ranks are placed node by node (torchrun,
// mpirun's default --map-by slot, srun's default block distribution).
void derive_nodes(LaunchInfo& li) {
  li.num_nodes = (li.world_size + li.local_world_size - 1) / li.local_world_size;
  li.node_rank = li.rank / li.local_world_size;
}

LaunchInfo from_torchrun(const EnvMap& env) {
  const char* who = "torchrun-style";
  ALPACA_CHECK(has(env, "RANK") && has(env, "WORLD_SIZE"),
               who << " launch needs both RANK and WORLD_SIZE; launch variables: " << show_vars(env));
  LaunchInfo li;
  li.source = LaunchSource::kTorchrun;
  li.rank = get_int(env, "RANK", who);
  li.world_size = get_count(env, "WORLD_SIZE", who);
  li.local_world_size = get_count_or(env, "LOCAL_WORLD_SIZE", who, li.world_size);
  li.local_rank = get_int_or(env, "LOCAL_RANK", who, li.rank % std::max(1, li.local_world_size));
  derive_nodes(li);
  li.node_rank = get_int_or(env, "GROUP_RANK", who, li.node_rank);
  li.num_nodes = get_count_or(env, "GROUP_WORLD_SIZE", who, std::max(li.num_nodes, li.node_rank + 1));
  if (has(env, "MASTER_ADDR")) li.master_addr = env.at("MASTER_ADDR");
  li.master_port = get_int_or(env, "MASTER_PORT", who, 0);
  ALPACA_CHECK(li.world_size == 1 || (!li.master_addr.empty() && li.master_port > 0 && li.master_port < 65536),
               who << " launch of " << li.world_size
                   << " processes needs MASTER_ADDR and MASTER_PORT (the host and port of rank 0's store); "
                      "launch variables: "
                   << show_vars(env));
  return li;
}

// An MPI launcher's variables for rank, size, local rank and local size.
struct MpiVars {
  const char* who;
  LaunchSource source;
  const char *rank, *size, *local_rank, *local_size;
  bool local_optional;  // Hydra without MPI_LOCAL* (old versions): assume one node
};

constexpr MpiVars kOpenMpiVars{"Open MPI", LaunchSource::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                               "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", false};
constexpr MpiVars kMpichVars{"MPICH/Hydra", LaunchSource::kMpich, "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID",
                             "MPI_LOCALNRANKS", true};

LaunchInfo from_mpi(const EnvMap& env, const MpiVars& v) {
  LaunchInfo li;
  li.source = v.source;
  li.rank = get_int(env, v.rank, v.who);
  li.world_size = get_count(env, v.size, v.who);
  li.local_rank = v.local_optional ? get_int_or(env, v.local_rank, v.who, li.rank) : get_int(env, v.local_rank, v.who);
  li.local_world_size =
      v.local_optional ? get_count_or(env, v.local_size, v.who, li.world_size) : get_count(env, v.local_size, v.who);
  derive_nodes(li);
  return li;
}

LaunchInfo from_slurm(const EnvMap& env) {
  const char* who = "Slurm";
  LaunchInfo li;
  li.source = LaunchSource::kSlurm;
  li.rank = get_int(env, "SLURM_PROCID", who);
  // The step's task count (srun) wins over the allocation's (sbatch --ntasks).
  li.world_size = has(env, "SLURM_STEP_NUM_TASKS") ? get_count(env, "SLURM_STEP_NUM_TASKS", who)
                                                   : get_count(env, "SLURM_NTASKS", who);
  li.local_rank = get_int(env, "SLURM_LOCALID", who);
  li.node_rank = get_int_or(env, "SLURM_NODEID", who, 0);
  const char* per_node_var = has(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                             : has(env, "SLURM_NTASKS_PER_NODE")    ? "SLURM_NTASKS_PER_NODE"
                                                                    : nullptr;
  if (per_node_var) {
    std::vector<int> per_node = parse_slurm_tasks_per_node(env.at(per_node_var), env);
    if (per_node.size() == 1) {
      li.local_world_size = per_node[0];
      li.num_nodes = std::max(1, li.world_size / per_node[0]);
    } else {
      ALPACA_CHECK(li.node_rank < static_cast<int>(per_node.size()),
                   "Slurm launch: SLURM_NODEID " << li.node_rank << " has no entry in " << per_node_var
                                                 << "; launch variables: " << show_vars(env));
      li.local_world_size = per_node[li.node_rank];
      li.num_nodes = static_cast<int>(per_node.size());
      int total = 0;
      for (int n : per_node) total += n;
      ALPACA_CHECK(total == li.world_size, "Slurm launch: " << per_node_var << " adds up to " << total
                                                            << " tasks but the step has " << li.world_size
                                                            << "; launch variables: " << show_vars(env));
    }
  } else {
    li.local_world_size = li.world_size;
    li.num_nodes = 1;
  }
  li.num_nodes = has(env, "SLURM_STEP_NUM_NODES") ? get_count(env, "SLURM_STEP_NUM_NODES", who)
                 : has(env, "SLURM_NNODES")        ? get_count(env, "SLURM_NNODES", who)
                                                   : li.num_nodes;
  return li;
}

}  // namespace

const char* to_string(LaunchSource source) {
  switch (source) {
    case LaunchSource::kTorchrun: return "torchrun";
    case LaunchSource::kOpenMpi: return "openmpi";
    case LaunchSource::kMpich: return "mpich";
    case LaunchSource::kSlurm: return "slurm";
    case LaunchSource::kSingle: return "single";
  }
  return "unknown";
}

// torchrun-style variables next to an MPI launcher's: a wrapper that maps OMPI_COMM_WORLD_RANK to
// RANK (the same world, the same rank), or a launcher started by mpirun once per node (torchrun,
// --nproc_per_node: a larger world). A smaller world is neither: stale RANK=0 WORLD_SIZE=1 left in
// the shell would make every mpirun rank a world of its own, all writing one output_dir.
static void check_agrees_with_mpi(const LaunchInfo& li, const EnvMap& env) {
  for (const MpiVars* v : {&kOpenMpiVars, &kMpichVars}) {
    if (!has(env, v->rank) || !has(env, v->size)) continue;
    const int mpi_rank = get_int(env, v->rank, v->who), mpi_size = get_count(env, v->size, v->who);
    const bool same = mpi_size == li.world_size && mpi_rank == li.rank;
    ALPACA_CHECK(same || li.world_size > mpi_size,
                 "torchrun-style RANK=" << li.rank << " WORLD_SIZE=" << li.world_size << " contradict " << v->who
                                        << "'s " << v->rank << "=" << mpi_rank << " " << v->size << "=" << mpi_size
                                        << ": unset RANK and WORLD_SIZE (left over from another launch?) when "
                                           "starting with mpirun, or start without mpirun; launch variables: "
                                        << show_vars(env));
  }
}

LaunchInfo discover_launch(const EnvMap& env) {
  LaunchInfo li;
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) {
    li = from_torchrun(env);
    check_agrees_with_mpi(li, env);
  } else if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) {
    li = from_mpi(env, kOpenMpiVars);
  } else if (has(env, "PMI_RANK") || has(env, "PMI_SIZE")) {
    li = from_mpi(env, kMpichVars);
  } else if (has(env, "SLURM_PROCID") && (has(env, "SLURM_STEP_NUM_TASKS") || has(env, "SLURM_NTASKS"))) {
    li = from_slurm(env);
  } else {
    // LOCAL_RANK alone (a process started by hand per GPU, or by a launcher we do not know)
    // would train a world of one in each process, all into one output_dir.
    ALPACA_CHECK(!has(env, "LOCAL_RANK") && !has(env, "LOCAL_WORLD_SIZE"),
                 "LOCAL_RANK / LOCAL_WORLD_SIZE are set but RANK and WORLD_SIZE are not: a torchrun-style launch "
                 "needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT too (or use mpirun, srun or alpaca-train "
                 "--nproc_per_node); unset LOCAL_RANK for a single process; launch variables: "
                     << show_vars(env));
    return li;  // a single process
  }
  check_consistent(li, env);
  return li;
}

EnvMap process_env() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

LaunchInfo discover_launch() { return discover_launch(process_env()); }

}  // namespace alpaca::dist
