// The built-in launcher's process management: fork/exec the workers with torchrun's variables,
// multiplex their output line by line with rank prefixes, forward signals, and stop everyone
// when one worker fails (SIGTERM, then SIGKILL after a grace period).
#include "alpaca/dist/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "alpaca/util/error.h"
#include "alpaca/util/text.h"

namespace alpaca::dist {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t g_signal = 0;
volatile sig_atomic_t g_signal_count = 0;
volatile sig_atomic_t g_sigint_count = 0;
void on_signal(int sig) {
  g_signal = sig;
  g_signal_count = g_signal_count + 1;
  if (sig == SIGINT) g_sigint_count = g_sigint_count + 1;
}

struct Stream {
  int fd = -1;
  int out_fd = STDOUT_FILENO;  // where its lines go
  std::string partial;
};

struct Worker {
  int rank = 0;
  pid_t pid = -1;
  bool running = false;
  int exit_code = 0;
  Stream out, err;
};

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    off += static_cast<size_t>(n);
  }
}

// Forwards complete lines (or everything at EOF) with the worker's rank prefix.
void emit(Stream& s, int rank, bool eof) {
  const std::string prefix = "[rank " + std::to_string(rank) + "]: ";
  size_t start = 0, nl;
  std::string out;
  while ((nl = s.partial.find('\n', start)) != std::string::npos) {
    out += prefix + s.partial.substr(start, nl - start + 1);
    start = nl + 1;
  }
  s.partial.erase(0, start);
  if (eof && !s.partial.empty()) {
    out += prefix + s.partial + "\n";
    s.partial.clear();
  }
  if (!out.empty()) write_all(s.out_fd, out);
}

// Reads what is available; at EOF closes the fd and flushes the last partial line.
void drain(Stream& s, int rank) {
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(s.fd, buf, sizeof buf);
    if (n > 0) {
      s.partial.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR)) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    ::close(s.fd);  // EOF or error
    s.fd = -1;
    emit(s, rank, true);
    return;
  }
  emit(s, rank, false);
}

std::vector<std::pair<std::string, std::string>> worker_env(const LauncherOptions& o, int local_rank, int port) {
  const int world = o.nproc_per_node * o.nnodes;
  return {{"RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", std::to_string(local_rank)},
          {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
          {"GROUP_RANK", std::to_string(o.node_rank)},
          {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
          {"ROLE_RANK", std::to_string(o.node_rank * o.nproc_per_node + local_rank)},
          {"ROLE_WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", o.master_addr},
          {"MASTER_PORT", std::to_string(port)},
          {"TORCHELASTIC_RESTART_COUNT", "0"},
          {"TORCHELASTIC_MAX_RESTARTS", "0"}};
}

void start(Worker& w, const LauncherOptions& o, int local_rank, int port) {
  int out_pipe[2], err_pipe[2];
  ALPACA_CHECK(::pipe2(out_pipe, O_CLOEXEC) == 0 && ::pipe2(err_pipe, O_CLOEXEC) == 0,
               "launcher: cannot create pipes for worker " << local_rank << ": " << std::strerror(errno));
  auto env = worker_env(o, local_rank, port);
  std::vector<std::string> argv_s{o.program};
  argv_s.insert(argv_s.end(), o.args.begin(), o.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  ALPACA_CHECK(pid >= 0, "launcher: fork failed for worker " << local_rank << ": " << std::strerror(errno));
  if (pid == 0) {
    // Child: own process group (signals reach it only through the launcher), die with the
    // launcher even if it is SIGKILLed, default signal dispositions.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGUSR1, SIG_DFL);
    ::signal(SIGCHLD, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    for (auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(o.program.c_str(), argv.data());
    std::string msg = "launcher: cannot execute " + o.program + ": " + std::strerror(errno) + "\n";
    write_all(STDERR_FILENO, msg);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from the parent, so it holds before we ever signal the group
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  w.rank = o.node_rank * o.nproc_per_node + local_rank;
  w.pid = pid;
  w.running = true;
  w.out.fd = out_pipe[0];
  w.out.out_fd = STDOUT_FILENO;
  w.err.fd = err_pipe[0];
  w.err.out_fd = STDERR_FILENO;
  ::fcntl(w.out.fd, F_SETFL, O_NONBLOCK);
  ::fcntl(w.err.fd, F_SETFL, O_NONBLOCK);
}

void signal_all(std::vector<Worker>& workers, int sig) {
  for (auto& w : workers)
    if (w.running) ::kill(-w.pid, sig);
}

void note(const std::string& msg) { write_all(STDERR_FILENO, "alpaca-train launcher: " + msg + "\n"); }

// Restores the launcher's previous signal handlers on scope exit.
class SignalGuard {
 public:
  SignalGuard() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGUSR1, &sa, &old_usr1_);
    g_signal = 0;
    g_signal_count = 0;
    g_sigint_count = 0;
  }
  ~SignalGuard() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGUSR1, &old_usr1_, nullptr);
  }

 private:
  struct sigaction old_int_, old_term_, old_usr1_;
};

}  // namespace

namespace {

int pod_int(const EnvMap& env, const char* name, const std::string& shown) {
  const std::string& v = env.at(name);
  const std::optional<long> n = text::parse_whole_long(v);
  ALPACA_CHECK(n && *n >= 0 && *n < 65536,
               "Kubeflow pod launch: " << name << "=" << v << " is not a non-negative integer (elastic ranges and "
                                       << "'auto' are not supported); pod variables: " << shown);
  return static_cast<int>(*n);
}

const char* first_set(const EnvMap& env, const char* a, const char* b) {
  return env.count(a) ? a : env.count(b) ? b : nullptr;
}

}  // namespace

std::optional<LauncherOptions> pod_launcher_options(const EnvMap& env) {
  if (!env.count("PET_NPROC_PER_NODE") || env.count("LOCAL_RANK")) return std::nullopt;
  std::string shown;
  for (const char* k : {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PET_NPROC_PER_NODE", "PET_NNODES",
                        "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"})
    if (env.count(k)) shown += (shown.empty() ? "" : " ") + std::string(k) + "=" + env.at(k);
  LauncherOptions o;
  o.nproc_per_node = pod_int(env, "PET_NPROC_PER_NODE", shown);
  const char* nnodes = first_set(env, "PET_NNODES", "WORLD_SIZE");
  const char* node_rank = first_set(env, "PET_NODE_RANK", "RANK");
  ALPACA_CHECK(nnodes && node_rank, "Kubeflow pod launch (PET_NPROC_PER_NODE is set) needs PET_NNODES or WORLD_SIZE, and "
                                    "PET_NODE_RANK or RANK; pod variables: " << shown);
  o.nnodes = pod_int(env, nnodes, shown);
  o.node_rank = pod_int(env, node_rank, shown);
  if (env.count("WORLD_SIZE")) {
    const int world = pod_int(env, "WORLD_SIZE", shown);
    ALPACA_CHECK(world == o.nnodes || world == o.nnodes * o.nproc_per_node,
                 "Kubeflow pod launch: WORLD_SIZE=" << world << " is neither the pod count " << o.nnodes
                                                    << " nor pods x PET_NPROC_PER_NODE = " << o.nnodes * o.nproc_per_node
                                                    << "; pod variables: " << shown);
  }
  ALPACA_CHECK(o.node_rank < o.nnodes, "Kubeflow pod launch: node rank " << o.node_rank << " is outside the " << o.nnodes
                                                                        << " pods; pod variables: " << shown);
  const char* addr = first_set(env, "MASTER_ADDR", "PET_MASTER_ADDR");
  const char* port = first_set(env, "MASTER_PORT", "PET_MASTER_PORT");
  ALPACA_CHECK(o.nnodes == 1 || (addr && port), "Kubeflow pod launch of " << o.nnodes << " pods needs MASTER_ADDR and "
                                                                            "MASTER_PORT (or PET_MASTER_*); pod variables: "
                                                                         << shown);
  if (addr) o.master_addr = env.at(addr);
  if (port) o.master_port = pod_int(env, port, shown);
  return o;
}

int pick_free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ALPACA_CHECK(fd >= 0, "launcher: cannot open a socket to find a free port: " << std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  ALPACA_CHECK(ok, "launcher: cannot find a free port; pass --master_port");
  return ntohs(addr.sin_port);
}

namespace {

void check_launcher_options(const LauncherOptions& o) {
  ALPACA_CHECK(o.nproc_per_node >= 1, "--nproc_per_node must be at least 1, got " << o.nproc_per_node);
  ALPACA_CHECK(o.nnodes >= 1, "--nnodes must be at least 1, got " << o.nnodes);
  ALPACA_CHECK(o.node_rank >= 0 && o.node_rank < o.nnodes,
               "--node_rank " << o.node_rank << " is outside the " << o.nnodes << " nodes (--nnodes)");
  ALPACA_CHECK(o.master_port >= 0 && o.master_port < 65536, "--master_port " << o.master_port << " is not a TCP port");
  ALPACA_CHECK(o.master_port > 0 || o.nnodes == 1,
               "a job on " << o.nnodes << " nodes needs the same --master_port on every node");
  ALPACA_CHECK(!o.program.empty() && ::access(o.program.c_str(), X_OK) == 0,
               "launcher: the worker program '" << o.program << "' is not executable");
}

// Starts every local worker; when one cannot start, the ones already started are killed and reaped.
std::vector<Worker> start_workers(const LauncherOptions& o, int port) {
  std::vector<Worker> workers(o.nproc_per_node);
  for (int i = 0; i < o.nproc_per_node; ++i) {
    try {
      start(workers[i], o, i, port);
    } catch (...) {
      signal_all(workers, SIGKILL);
      for (auto& w : workers)
        if (w.running) ::waitpid(w.pid, nullptr, 0);
      throw;
    }
  }
  return workers;
}

// The launcher's loop over its running workers: pass their output on, forward signals, reap
// exits, stop the rest after a failure, kill what outlives its grace period.
class Supervisor {
 public:
  Supervisor(const LauncherOptions& o, std::vector<Worker>& workers) : o_(o), workers_(workers) {}

  // Runs until every worker has exited; returns the launcher's exit code.
  int run() {
    for (;;) {
      pass_output();
      forward_signals();
      reap_exits();
      kill_overdue();
      if (!any_running()) break;
    }
    close_up();
    return exit_code();
  }

 private:
  void stop(int sig, std::chrono::milliseconds grace) {
    if (stopping_) return;
    stopping_ = true;
    signal_all(workers_, sig);
    kill_at_ = Clock::now() + grace;
  }

  // 1. Output.
  void pass_output() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Worker*, Stream*>> owners;
    for (auto& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back({&w, s});
        }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      return;
    }
    if (::poll(fds.data(), fds.size(), 50) > 0)
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents) drain(*owners[i].second, owners[i].first->rank);
  }

  // 2. Signals to forward. The workers get signal_grace to finish a step and save a checkpoint
  // (SIGTERM/SIGUSR1 are preemption notices); a second SIGINT (impatient Ctrl-C) kills them at
  // once. A repeated SIGTERM/SIGUSR1 (the scheduler and the batch script both signalling) does
  // not cut the save short.
  void forward_signals() {
    if (g_signal && !stop_signal_) {
      stop_signal_ = g_signal;
      note("received signal " + std::to_string(stop_signal_) + "; forwarding it to the workers (SIGINT again kills them)");
      if (stopping_) {
        signal_all(workers_, stop_signal_);  // stopping after a failure already: pass it on anyway
      } else {
        stop(stop_signal_, o_.signal_grace);
      }
    } else if (stop_signal_ && g_sigint_count > (stop_signal_ == SIGINT ? 1 : 0) && Clock::now() < kill_at_) {
      note("received SIGINT while the workers are stopping; killing them");
      kill_at_ = Clock::now();
    }
  }

  // 3. Exits: the first failure (not one after a stop request) stops the other workers.
  void reap_exits() {
    for (auto& w : workers_) {
      if (!w.running) continue;
      int status = 0;
      pid_t r = ::waitpid(w.pid, &status, WNOHANG);
      if (r != w.pid) continue;
      w.running = false;
      w.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (w.exit_code != 0 && first_failure_ == 0 && !stop_signal_) {
        first_failure_ = w.exit_code;
        note("worker rank " + std::to_string(w.rank) + " (pid " + std::to_string(w.pid) + ") " +
             (WIFEXITED(status) ? "exited with code " + std::to_string(w.exit_code)
                                : "was killed by signal " + std::to_string(WTERMSIG(status))) +
             "; stopping the other workers");
        stop(SIGTERM, o_.stop_grace);
      }
    }
  }

  // Any worker still alive after the grace period is killed, with its process group.
  void kill_overdue() {
    if (!stopping_ || Clock::now() <= kill_at_) return;
    for (auto& w : workers_)
      if (w.running) note("worker rank " + std::to_string(w.rank) + " is still running after the stop request; killing it");
    signal_all(workers_, SIGKILL);
    kill_at_ = Clock::now() + std::chrono::hours(1);
  }

  // Pipes stay open while a worker's own children live; do not wait on them once all exited.
  bool any_running() {
    bool any = false;
    for (auto& w : workers_) any |= w.running;
    if (!any)
      for (auto& w : workers_)
        for (Stream* s : {&w.out, &w.err})
          if (s->fd >= 0) drain(*s, w.rank);
    return any;
  }

  // Kill leftovers in the workers' process groups (e.g. grandchildren holding the pipes).
  void close_up() {
    for (auto& w : workers_) ::kill(-w.pid, SIGKILL);
    for (auto& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) ::close(s->fd);
  }

  int exit_code() const {
    if (first_failure_) return first_failure_;
    if (!stop_signal_) return 0;
    // Stopped on request: when every worker ended the same way (e.g. each saved a checkpoint and
    // exited with the trainer's "preempted" code) that is the launcher's code too, so a batch
    // script sees what the workers said; a mixed ending is 128 + the signal.
    bool same = true;
    for (const auto& w : workers_) same = same && w.exit_code == workers_[0].exit_code;
    return same ? workers_[0].exit_code : 128 + stop_signal_;
  }

  const LauncherOptions& o_;
  std::vector<Worker>& workers_;
  int first_failure_ = 0;  // exit code to return
  int stop_signal_ = 0;    // signal that stopped the launcher
  bool stopping_ = false;
  Clock::time_point kill_at_{};
};

}  // namespace

int run_workers(const LauncherOptions& o) {
  check_launcher_options(o);
  const int port = o.master_port > 0 ? o.master_port : pick_free_port();
  SignalGuard guard;
  std::vector<Worker> workers = start_workers(o, port);
  return Supervisor(o, workers).run();
}

}  // namespace alpaca::dist
