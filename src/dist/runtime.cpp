// The process-level runtime: launch discovery, MPI init/finalize, the torchrun-style store,
// failure handling that ends the whole job, and signal handlers that name the collective.
#include "alpaca/dist/runtime.h"

#include "mpi_include.h"

#include <c10/util/Logging.h>  // defines: FLAGS_caffe2_log_level
#include <torch/csrc/distributed/c10d/HashStore.hpp>  // defines: c10d::HashStore
#include <torch/csrc/distributed/c10d/TCPStore.hpp>   // defines: c10d::TCPStore

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
#include <unistd.h>

#include "alpaca/util/error.h"
#include "alpaca/util/fault.h"
#include "runtime_internal.h"

namespace alpaca::dist {
namespace {

struct State {
  std::mutex mu;
  std::optional<LaunchInfo> launch;
  bool mpi_inited_by_us = false;
  bool finalized = false;
  int mpi_thread_level = 0;
  std::thread::id init_thread;
  c10::intrusive_ptr<c10d::Store> store;
  MPI_Comm shutdown_comm = MPI_COMM_NULL;  // private to the bounded barrier in finalize()
  std::chrono::milliseconds timeout{0};  // the largest CommOptions::timeout seen (0: none yet, use 1800 s)
};
State& state() {
  static State s;
  return s;
}

// Signal-handler view of the collective in flight (written by WaitScope, read by the handler).
char g_op[512];
volatile sig_atomic_t g_op_set = 0;
char g_rank_prefix[64] = "alpaca-train";
struct sigaction g_prev_term, g_prev_int;

void on_terminate(int sig) {
  if (g_op_set) {
    char line[700];
    int n = std::snprintf(line, sizeof line, "%s: terminated by signal %d while waiting in %s\n", g_rank_prefix, sig, g_op);
    if (n > 0) (void)!write(STDERR_FILENO, line, std::min<size_t>(n, sizeof line - 1));
  }
  sigaction(sig, sig == SIGTERM ? &g_prev_term : &g_prev_int, nullptr);
  raise(sig);
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_terminate;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  sigaction(SIGTERM, nullptr, &g_prev_term);
  sigaction(SIGINT, nullptr, &g_prev_int);
  // Leave handlers that someone else (a debugger, the MPI library) installed alone.
  if (g_prev_term.sa_handler == SIG_DFL) sigaction(SIGTERM, &sa, nullptr);
  if (g_prev_int.sa_handler == SIG_DFL) sigaction(SIGINT, &sa, nullptr);
}

// MPI_THREAD_MULTIPLE unless ALPACA_MPI_THREAD_LEVEL asks for less (for MPI libraries whose
// MULTIPLE mode is slow or broken); below MULTIPLE there is no progress thread and collectives
// must be issued and waited from the initialising thread.
int requested_thread_level() {
  const char* v = std::getenv("ALPACA_MPI_THREAD_LEVEL");
  const std::string word = v ? v : "multiple";
  if (word == "multiple") return MPI_THREAD_MULTIPLE;
  if (word == "serialized") return MPI_THREAD_SERIALIZED;
  if (word == "funneled") return MPI_THREAD_FUNNELED;
  ALPACA_FAIL("ALPACA_MPI_THREAD_LEVEL=" << word << " is not one of multiple, serialized, funneled");
}

// Where this rank sits, from MPI itself: the launch variables only give node indices for block
// placement (rank / local size), but mpirun --map-by node or srun -m cyclic place ranks round
// robin. Nodes are numbered by their lowest world rank. Collective over MPI_COMM_WORLD.
void place_on_nodes(LaunchInfo& li) {
  MPI_Comm local = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, li.rank, MPI_INFO_NULL, &local) != MPI_SUCCESS) return;
  int local_rank = 0, local_size = 1;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_size(local, &local_size);
  MPI_Comm_split(MPI_COMM_WORLD, local_rank == 0 ? 0 : MPI_UNDEFINED, li.rank, &leaders);
  int node_and_count[2] = {0, 1};
  if (leaders != MPI_COMM_NULL) {
    MPI_Comm_rank(leaders, &node_and_count[0]);
    MPI_Comm_size(leaders, &node_and_count[1]);
    MPI_Comm_free(&leaders);
  }
  MPI_Bcast(node_and_count, 2, MPI_INT, 0, local);
  MPI_Comm_free(&local);
  li.local_rank = local_rank;
  li.local_world_size = local_size;
  li.node_rank = node_and_count[0];
  li.num_nodes = node_and_count[1];
}

// The start-up roll call: every rank reports to rank 0 before the first blocking collective
// (MPI_Comm_dup, MPI_Comm_split_type), which would wait forever for a peer that died after
// MPI_Init when the launcher does not end the job. Point-to-point on MPI_COMM_WORLD (our
// collectives use duplicates of it; nothing else sends there) with nonblocking requests polled
// until li.timeout (--ddp_timeout), so rank 0 knows exactly who did not answer. Rank 0 then sends
// every rank that answered the verdict: arrived[r] for each rank. On a missing rank each rank
// that knows names it and calls MPI_Abort (from the main thread), which ends the whole job.
// Collective in spirit: every rank of MPI_COMM_WORLD calls it once, right after MPI_Init.
constexpr int kRollCallTag = 23011;  // the arrival (rank r -> 0)
constexpr int kVerdictTag = 23012;   // the verdict (0 -> rank r)

std::string rank_list(const std::vector<int>& arrived, int want) {
  std::string list;
  int count = 0;
  for (int r = 0; r < static_cast<int>(arrived.size()); ++r)
    if (arrived[r] == want) list += (count++ ? ", " : "") + std::to_string(r);
  return (count > 1 ? "ranks " : "rank ") + list;
}

void roll_call(const LaunchInfo& li) {
  const int world = li.world_size;
  if (world <= 1) return;
  const long long seconds = std::max<long long>(1, li.timeout.count() / 1000);
  const auto deadline = std::chrono::steady_clock::now() + li.timeout;
  const auto poll = [] { std::this_thread::sleep_for(std::chrono::milliseconds(2)); };
  const auto check = [](int rc, const char* op) {
    if (rc == MPI_SUCCESS) return;
    std::ostringstream msg;
    msg << "the start-up roll call failed in " << op << " (MPI error " << rc << ")";
    detail::fail_collective(msg.str());
  };
  std::vector<int> arrived(world, 0);  // (world): 1 once rank r answered (rank 0's view), then the verdict
  if (li.rank == 0) {
    arrived[0] = 1;
    std::vector<int> token(world, 0);
    std::vector<MPI_Request> recv(world, MPI_REQUEST_NULL);
    for (int r = 1; r < world; ++r)
      check(MPI_Irecv(&token[r], 1, MPI_INT, r, kRollCallTag, MPI_COMM_WORLD, &recv[r]), "MPI_Irecv");
    for (int pending = world - 1; pending > 0 && std::chrono::steady_clock::now() < deadline;) {
      for (int r = 1; r < world; ++r) {
        if (arrived[r]) continue;
        int flag = 0;
        check(MPI_Test(&recv[r], &flag, MPI_STATUS_IGNORE), "MPI_Test");
        if (flag) arrived[r] = 1, --pending;
      }
      if (pending > 0) poll();
    }
    const bool all = std::count(arrived.begin(), arrived.end(), 1) == world;
    // Tell every rank that answered (never a missing one: a send to a dead peer may block).
    std::vector<MPI_Request> sends;
    for (int r = 1; r < world; ++r) {
      if (!arrived[r]) continue;
      sends.emplace_back(MPI_REQUEST_NULL);
      check(MPI_Isend(arrived.data(), world, MPI_INT, r, kVerdictTag, MPI_COMM_WORLD, &sends.back()), "MPI_Isend");
    }
    // A failed roll call gives the verdicts a moment to leave before the abort; a good one waits
    // for them (every receiver is alive and has posted its receive).
    const auto send_deadline = all ? std::chrono::steady_clock::time_point::max()
                                   : std::chrono::steady_clock::now() + std::chrono::seconds(1);
    for (int done = 0; !done && std::chrono::steady_clock::now() < send_deadline;) {
      check(MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (!done) poll();
    }
    if (!all)
      detail::fail_collective(rank_list(arrived, 0) + " of " + std::to_string(world) +
                              " did not answer the start-up roll call within " + std::to_string(seconds) +
                              " s (--ddp_timeout): the process died after MPI_Init, hangs, or is far behind; see its "
                              "own output and the launcher's");
    return;
  }
  int token = 1;
  MPI_Request send = MPI_REQUEST_NULL, recv = MPI_REQUEST_NULL;
  check(MPI_Isend(&token, 1, MPI_INT, 0, kRollCallTag, MPI_COMM_WORLD, &send), "MPI_Isend");
  check(MPI_Irecv(arrived.data(), world, MPI_INT, 0, kVerdictTag, MPI_COMM_WORLD, &recv), "MPI_Irecv");
  // Rank 0 answers at its own deadline, which may be a little after ours.
  const auto grace = deadline + std::chrono::seconds(5);
  for (int flag = 0; !flag;) {
    check(MPI_Test(&recv, &flag, MPI_STATUS_IGNORE), "MPI_Test");
    if (flag) break;
    if (std::chrono::steady_clock::now() > grace)
      detail::fail_collective("rank 0 did not answer the start-up roll call within " + std::to_string(seconds) +
                              " s (--ddp_timeout) + 5 s: it died after MPI_Init, hangs, or is far behind; see its own "
                              "output and the launcher's");
    poll();
  }
  check(MPI_Wait(&send, MPI_STATUS_IGNORE), "MPI_Wait");  // rank 0 received it: it sent the verdict after
  if (std::count(arrived.begin(), arrived.end(), 1) != world)
    detail::fail_collective(rank_list(arrived, 0) + " of " + std::to_string(world) +
                            " did not answer the start-up roll call within " + std::to_string(seconds) +
                            " s (--ddp_timeout), says rank 0; see that rank's own output and the launcher's");
}

void init_mpi(State& s) {
  int already = 0;
  MPI_Initialized(&already);
  if (already) {  // someone else (a test harness, an embedding program) owns MPI
    MPI_Query_thread(&s.mpi_thread_level);
  } else {
    int rc = MPI_Init_thread(nullptr, nullptr, requested_thread_level(), &s.mpi_thread_level);
    ALPACA_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed (code " << rc
                                                                    << "); check the MPI installation and the launcher");
    s.mpi_inited_by_us = true;
  }
  ALPACA_CHECK(s.mpi_thread_level >= MPI_THREAD_FUNNELED,
               "the MPI library offers only MPI_THREAD_SINGLE; alpaca-train needs at least MPI_THREAD_FUNNELED");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  // A peer that dies before the first collective (tests/ckpt/test_checkpoint_faults.cpp).
  if (const auto victim = util::fault_int("dist.exit_after_init", -1); victim && *victim == rank) ::_exit(3);
  LaunchInfo& li = *s.launch;
  ALPACA_CHECK(rank == li.rank && size == li.world_size,
               "MPI reports rank " << rank << " of " << size << " but the " << to_string(li.source)
                                   << " launch variables say rank " << li.rank << " of " << li.world_size
                                   << "; was the binary started by a different MPI than it was built with?");
  roll_call(li);  // before the first blocking collective (the dup below)
  MPI_Comm_dup(MPI_COMM_WORLD, &s.shutdown_comm);
  place_on_nodes(li);
}

// MPI_Finalize waits for every rank; a bounded barrier first turns "a peer never arrives" into a
// warning and an exit without MPI_Finalize (the MPI launcher then ends the job) instead of a hang.
bool shutdown_barrier(State& s) {
  if (s.shutdown_comm == MPI_COMM_NULL) return true;
  MPI_Request req;
  if (MPI_Ibarrier(s.shutdown_comm, &req) != MPI_SUCCESS) return false;
  auto deadline = std::chrono::steady_clock::now() + (s.timeout.count() > 0 ? s.timeout : std::chrono::seconds(1800));
  for (int flag = 0;;) {
    if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
    if (flag) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

void finalize_at_exit() { finalize(/*clean=*/true); }

void finalize_store(State& s, bool clean) {
  if (!s.store) return;
  const LaunchInfo& li = *s.launch;
  if (clean && li.world_size > 1) {
    // Rank 0 hosts the store: it must outlive every other rank's last request.
    try {
      if (s.store->add("alpaca/finalize/arrived", 1) == li.world_size)
        s.store->set("alpaca/finalize/done", std::vector<uint8_t>{1});
      s.store->wait({"alpaca/finalize/done"});
      if (li.rank != 0) {
        s.store->add("alpaca/finalize/left", 1);
      } else {
        auto deadline = std::chrono::steady_clock::now() + s.store->getTimeout();
        while (s.store->add("alpaca/finalize/left", 0) < li.world_size - 1 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    } catch (const std::exception& e) {
      std::cerr << g_rank_prefix << ": warning: the store barrier at shutdown failed: " << detail::short_what(e) << "\n";
    }
  }
  s.store.reset();
}

}  // namespace

Backend parse_backend(const std::string& word) {
  if (word == "auto") return Backend::kAuto;
  if (word == "mpi") return Backend::kMpi;
  if (word == "store") return Backend::kStore;
  if (word == "gloo") return Backend::kGloo;
  if (word == "nccl") return Backend::kNccl;
  ALPACA_FAIL("unknown communicator backend '" << word << "'; use one of auto, mpi, gloo, store, nccl");
}

const char* to_string(Backend backend) {
  switch (backend) {
    case Backend::kAuto: return "auto";
    case Backend::kMpi: return "mpi";
    case Backend::kStore: return "store";
    case Backend::kGloo: return "gloo";
    case Backend::kNccl: return "nccl";
  }
  return "unknown";
}

const LaunchInfo& init() { return init(discover_launch()); }

const LaunchInfo& init(const LaunchInfo& li) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.launch) return *s.launch;
  ALPACA_CHECK(!s.finalized, "dist::init() after dist::finalize(): the runtime lives once per process");
  s.launch = li;
  s.init_thread = std::this_thread::get_id();
  set_process_rank(li.world_size > 1 ? li.rank : -1);
  std::snprintf(g_rank_prefix, sizeof g_rank_prefix, "alpaca-train [rank %d]", li.rank);
  try {
    if (li.mpi_launched() || li.source == LaunchSource::kSingle) init_mpi(s);
  } catch (...) {
    s.launch.reset();
    throw;
  }
  install_signal_handlers();
  // Programs that never call finalize() (tests, early returns) still shut MPI down properly.
  std::atexit(finalize_at_exit);
  return *s.launch;
}

bool is_initialized() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.launch.has_value() && !s.finalized;
}

const LaunchInfo& launch_info() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ALPACA_CHECK(s.launch.has_value(), "dist::launch_info() before dist::init(); create a dist::Runtime first");
  return *s.launch;
}

void finalize(bool clean) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.launch || s.finalized) return;
  s.finalized = true;
  if (s.mpi_thread_level >= MPI_THREAD_MULTIPLE) detail::stop_mpi_progress();
  finalize_store(s, clean);
  if (s.mpi_inited_by_us) {
    int done = 0;
    MPI_Finalized(&done);
    // MPI_Finalize synchronises; a failing rank skips it and exits non-zero so the MPI launcher
    // ends the job instead of this rank waiting for healthy ones (or vice versa).
    if (!done && clean) {
      if (shutdown_barrier(s)) {
        MPI_Finalize();
      } else {
        std::cerr << g_rank_prefix << ": warning: not every rank reached the end of the job within the timeout; "
                                      "exiting without MPI_Finalize"
                  << std::endl;
      }
    }
  }
}

Runtime::Runtime() { init(); }
Runtime::Runtime(const LaunchInfo& launch) { init(launch); }
Runtime::~Runtime() { finalize(std::uncaught_exceptions() == 0); }

namespace detail {

bool mpi_active() {
  State& s = state();
  if (!s.launch || s.finalized) return false;
  int inited = 0, done = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&done);
  return inited && !done;
}

bool mpi_progress_thread() {
  static const bool enabled = [] {
    const char* v = std::getenv("ALPACA_MPI_PROGRESS_THREAD");
    return !(v && std::string(v) == "0");
  }();
  return enabled && state().mpi_thread_level >= MPI_THREAD_MULTIPLE;
}

bool mpi_thread_multiple() { return state().mpi_thread_level >= MPI_THREAD_MULTIPLE; }

void check_mpi_thread(const char* op) {
  State& s = state();
  if (s.mpi_thread_level >= MPI_THREAD_MULTIPLE) return;
  ALPACA_CHECK(std::this_thread::get_id() == s.init_thread,
               op << " called from a thread other than the one that initialised MPI, but this MPI library only "
                     "offers thread level "
                  << s.mpi_thread_level << " (< MPI_THREAD_MULTIPLE); issue and wait collectives from the main thread");
}

namespace {

std::function<int()> g_startup_interrupt;  // set_startup_interrupt; read by the watchdog thread

// Bounds a start-up phase that c10d cannot bound itself (a TCPStore client blocks in recv forever
// when MASTER_PORT is held by a program that accepts and never answers) and ends it early on a
// scheduler's signal, when there is nothing to save yet. A thread checks every 50 ms; on expiry
// or a signal it writes one line and ends the process with _exit (the main thread may be stuck
// in a system call no exception can leave).
class StartupWatchdog {
 public:
  StartupWatchdog(std::string what, std::string fix, std::chrono::milliseconds limit)
      : what_(std::move(what)), fix_(std::move(fix)), deadline_(std::chrono::steady_clock::now() + limit),
        limit_s_(std::chrono::duration_cast<std::chrono::seconds>(limit).count()), thread_([this] { watch(); }) {}
  ~StartupWatchdog() {
    done_ = true;
    thread_.join();
  }
  StartupWatchdog(const StartupWatchdog&) = delete;
  StartupWatchdog& operator=(const StartupWatchdog&) = delete;

 private:
  void watch() {
    while (!done_) {
      const int code = g_startup_interrupt ? g_startup_interrupt() : 0;
      if (code != 0) leave(std::string(g_rank_prefix) + ": stopping on a signal during " + what_ +
                           " (nothing to save yet); exit code " + std::to_string(code) + "\n", code);
      if (std::chrono::steady_clock::now() >= deadline_)
        leave(std::string(g_rank_prefix) + ": error: " + what_ + " did not finish within " + std::to_string(limit_s_) +
                  " s (--ddp_timeout and a margin); " + fix_ + "\n", 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  [[noreturn]] static void leave(const std::string& line, int code) {
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
    ::_exit(code);
  }

  std::string what_, fix_;
  std::chrono::steady_clock::time_point deadline_;
  long long limit_s_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Every rank announces itself; rank 0 waits for all of them until the timeout (--ddp_timeout) and
// publishes either "all here" or the list of ranks that never came, which every rank then reports.
void wait_for_every_rank(c10d::Store& store, const LaunchInfo& li, std::chrono::milliseconds timeout) {
  const std::string prefix = "alpaca/arrived/";
  store.set(prefix + std::to_string(li.rank), std::vector<uint8_t>{1});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto where = [&] { return li.master_addr + ":" + std::to_string(li.master_port); };
  if (li.rank == 0) {
    std::vector<int> missing;
    for (;;) {
      missing.clear();
      for (int r = 1; r < li.world_size; ++r)
        if (!store.check({prefix + std::to_string(r)})) missing.push_back(r);
      if (missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    store.set("alpaca/arrival", std::vector<uint8_t>(list.begin(), list.end()));
    // The store lives in this process: give the waiting ranks a moment to read the verdict.
    if (!missing.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ALPACA_CHECK(missing.empty(), "rank" << (missing.size() > 1 ? "s " : " ") << list << " of WORLD_SIZE=" << li.world_size
                                         << " never connected to the rendezvous store at " << where() << " within "
                                         << timeout.count() / 1000 << " s (--ddp_timeout); start every rank, or set "
                                            "WORLD_SIZE to the number of processes");
    return;
  }
  // Rank 0 answers at its own deadline, which may be a little after ours.
  const auto grace = deadline + std::chrono::seconds(5);
  for (;;) {
    bool answered = false;
    try {
      answered = store.check({"alpaca/arrival"});
    } catch (const std::exception& e) {
      ALPACA_FAIL("lost the rendezvous store at " << where() << " while waiting for all " << li.world_size
                                                  << " ranks to arrive (" << detail::short_what(e)
                                                  << "); rank 0 ended, see its error");
    }
    if (answered) break;
    ALPACA_CHECK(std::chrono::steady_clock::now() < grace,
                 "rank 0 did not confirm that all " << li.world_size << " ranks arrived at the rendezvous store at "
                                                    << where() << " within " << timeout.count() / 1000
                                                    << " s (--ddp_timeout)");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::vector<uint8_t> v = store.get("alpaca/arrival");
  const std::string list(v.begin(), v.end());
  ALPACA_CHECK(list.empty(), "rank(s) " << list << " of WORLD_SIZE=" << li.world_size
                                        << " never connected to the rendezvous store at " << where() << " within "
                                        << timeout.count() / 1000 << " s (--ddp_timeout); start every rank, or set "
                                           "WORLD_SIZE to the number of processes");
}

}  // namespace

c10::intrusive_ptr<c10d::Store> torchrun_store(std::chrono::milliseconds timeout) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  ALPACA_CHECK(s.launch.has_value(), "the rendezvous store is needed before dist::init(); create a dist::Runtime first");
  if (s.store) return s.store;
  const LaunchInfo& li = *s.launch;
  if (li.world_size == 1) {
    s.store = c10::make_intrusive<c10d::HashStore>();
    s.store->setTimeout(timeout);
    return s.store;
  }
  ALPACA_CHECK(!li.master_addr.empty() && li.master_port > 0,
               "a store-based communicator needs MASTER_ADDR and MASTER_PORT (torchrun-style launch); this process was "
               "launched by "
                   << to_string(li.source));
  // c10d logs every socket hiccup as a warning, and a failed connection as errors with a C++
  // backtrace; our errors name the cause already. TORCH_CPP_LOG_LEVEL=INFO/WARNING brings them
  // back for debugging.
  const bool quiet = !std::getenv("TORCH_CPP_LOG_LEVEL");
  if (quiet) FLAGS_caffe2_log_level = 3;  // only fatal ones while connecting; errors afterwards
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(li.master_port);
  opts.isServer = li.rank == 0;
  opts.numWorkers = li.world_size;
  // Arrival is checked below, rank by rank, so a rank that never comes is named.
  opts.waitWorkers = false;
  opts.timeout = timeout;
  const std::string where = li.master_addr + ":" + std::to_string(li.master_port);
  StartupWatchdog watchdog(
      "the start-up rendezvous with the store at " + where,
      opts.isServer ? "start every rank of WORLD_SIZE=" + std::to_string(li.world_size)
                    : "check that rank 0 runs (it hosts the store), MASTER_ADDR/MASTER_PORT, and that no other program "
                      "holds that port on rank 0's host",
      // c10d's own connect retries end within two timeouts, the roll call below within one more
      // plus its grace; the watchdog only catches what never ends.
      3 * timeout + std::chrono::seconds(10));
  try {
    s.store = c10::make_intrusive<c10d::TCPStore>(li.master_addr, opts);
  } catch (const std::exception& e) {
    if (quiet) FLAGS_caffe2_log_level = 2;
    ALPACA_FAIL("cannot " << (opts.isServer ? "host" : "reach") << " the rendezvous store at " << li.master_addr << ":"
                          << li.master_port << " (" << detail::short_what(e)
                          << "); check MASTER_ADDR/MASTER_PORT, that the port is free on rank 0's host, and that every "
                             "rank was started");
  }
  if (quiet) FLAGS_caffe2_log_level = 2;  // errors only
  wait_for_every_rank(*s.store, li, timeout);
  return s.store;
}

void fail_collective(const std::string& msg) {
  if (mpi_active()) {  // MPI cannot recover a communicator with a collective in flight: end the job
    std::cerr << g_rank_prefix << ": error: " << msg << "\n" << g_rank_prefix << ": aborting the MPI job" << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ALPACA_FAIL(msg);
}

WaitScope::WaitScope(const std::string& what) {
  g_op_set = 0;
  std::snprintf(g_op, sizeof g_op, "%s", what.c_str());
  g_op_set = 1;
}
WaitScope::~WaitScope() { g_op_set = 0; }

std::string short_what(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

std::string describe(const at::Tensor& t) {
  std::ostringstream os;
  os << t.numel() << " x " << t.scalar_type();
  return os.str();
}

void check_flat_buffers(const at::Tensor& out, const at::Tensor& in, int world, const char* op, bool out_is_whole) {
  ALPACA_CHECK(out.is_contiguous() && in.is_contiguous(), op << ": out and in must be contiguous");
  ALPACA_CHECK(out.scalar_type() == in.scalar_type(), op << ": out is " << out.scalar_type() << " but in is "
                                                         << in.scalar_type());
  const at::Tensor& whole = out_is_whole ? out : in;
  const at::Tensor& part = out_is_whole ? in : out;
  const char* whole_name = out_is_whole ? "out" : "in";
  const char* part_name = out_is_whole ? "in" : "out";
  ALPACA_CHECK(whole.numel() == part.numel() * world, op << ": " << whole_name << " has " << whole.numel()
                                                         << " elements, expected world " << world << " x "
                                                         << part_name << " " << part.numel());
}

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "?";
}

}  // namespace detail

std::shared_ptr<Communicator> make_communicator(const CommOptions& options) {
  const LaunchInfo& li = init();
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.timeout = std::max(s.timeout, options.timeout);
  }
  Backend b = options.backend;
  if (b == Backend::kAuto) b = options.cuda ? Backend::kNccl : (detail::mpi_active() ? Backend::kMpi : Backend::kGloo);
  switch (b) {
    case Backend::kMpi:
      ALPACA_CHECK(detail::mpi_active(), "the mpi backend needs an MPI launch (mpirun, mpiexec, srun); this process was "
                                         "launched by "
                                             << to_string(li.source) << "; use the gloo backend or launch with mpirun");
      return detail::make_mpi_communicator(options);
    case Backend::kStore: return detail::make_store_communicator(options);
    case Backend::kGloo: return detail::make_gloo_communicator(options);
    case Backend::kNccl:
#ifdef ALPACA_WITH_CUDA
      return detail::make_nccl_communicator(options);
#else
      ALPACA_FAIL("the nccl backend is not part of this build (LibTorch without CUDA); use a CPU backend");
#endif
    case Backend::kAuto: break;
  }
  ALPACA_FAIL("unreachable backend " << to_string(b));
}

void set_startup_interrupt(std::function<int()> exit_code_if_interrupted) {
  detail::g_startup_interrupt = std::move(exit_code_if_interrupted);
}

}  // namespace alpaca::dist
