// bench_train_profile: alpaca-train under a RecordFunction observer that splits each training
// step's time by phase (the trainer's "phase:*" regions), by kind of work (the model's "cat:*"
// regions, GEMMs, the FSDP engine's "fsdp:*" regions) and by ATen op, in thread CPU time and wall
// time. bench/profile_step.py runs it next to PyTorch's torch.profiler (docs/profile_bf16.md).
//
//   ALPACA_PROFILE_OUT=DIR [ALPACA_PROFILE_SKIP=2] mpirun -np N bench_train_profile <train flags>
//
// writes DIR/rank<R>.json with per-step averages over the steps after the first SKIP.
//
// Accounting: every op, autograd node and region is a frame; a frame's self time (its time minus
// its child frames') goes to (phase, kind) and to (kind, name). A frame's kind is its own when it
// has one (a GEMM op, an fsdp:/cat: region, an autograd node whose forward op ran inside a kind)
// and its parent's otherwise, so an aten::mul in an RMSNorm counts as RMSNorm, an aten::mm inside
// the fused loss as GEMM, and a backward node as the kind of the forward op that made it (matched
// by autograd sequence number). Ops of other threads (the MPI progress thread's ring folds, a gloo
// worker's) count in phase "other threads" while a step runs, in "setup" otherwise (loading, the final
// save); the op list leaves "setup" out, so it holds the steps' work only.
//
// Operand bytes (the profile's "bytes moved" estimate; hardware counters are not readable in this VM): each
// leaf op (an ATen op that runs no other op) counts the bytes of its tensor inputs, in-place and out=
// destinations included, a fresh output not; view and metadata ops count nothing. Our own kernels say
// what they read through util/trace.h's ALPACA_TRACE_BYTES ("alpaca::*" ops). bench/torch_step_profile.py
// counts PyTorch's ops the same way from torch.profiler's recorded input shapes and dtypes.
#include <ATen/record_function.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "alpaca/cli/dispatch.h"
#include "alpaca/util/error.h"

namespace {

double thread_cpu_s() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
double process_cpu_s() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  auto tv = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return tv(ru.ru_utime) + tv(ru.ru_stime);
}
long thread_minflt() {
  rusage ru{};
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_minflt;
}

struct Acc {
  double cpu = 0, wall = 0, bytes = 0;
  int64_t calls = 0;
  long minflt = 0;
};

struct Frame {
  std::string kind;  // empty: inherits
  std::string name;
  bool is_phase = false;
  bool is_op = false;  // scope FUNCTION: an ATen op or one of our kernels
  int child_ops = 0;
  double bytes = 0;    // operand bytes, counted when the op turns out to be a leaf
  double cpu0 = 0, wall0 = 0, child_cpu = 0, child_wall = 0;
  long flt0 = 0;
};

// Global, under one mutex (ops of other threads are rare: the autograd engine runs CPU work on the
// calling thread).
std::mutex g_mu;
std::map<std::pair<std::string, std::string>, Acc> g_by_kind;  // (phase, kind)
std::map<std::pair<std::string, std::string>, Acc> g_by_op;    // (kind, op)
std::map<std::string, Acc> g_phase;                            // inclusive
std::unordered_map<int64_t, std::string> g_seq_kind;           // forward op sequence nr -> kind
int g_steps_seen = 0, g_skip = 2;
std::atomic<bool> g_in_step{false};  // the main thread is inside "phase:step"
double g_cpu_start = 0, g_wall_start = 0, g_cpu_end = 0, g_wall_end = 0;

thread_local std::vector<Frame> t_stack;
thread_local std::vector<std::string> t_phase;

bool is_gemm(const std::string& n) {
  static const char* names[] = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul",
                                "aten::linear", "aten::addmm_", "aten::_addmm_activation", "aten::mkldnn_linear"};
  for (const char* g : names)
    if (n == g) return true;
  return false;
}

std::string node_kind(const std::string& n) {
  if (n.find("FusedHeadCrossEntropy") != std::string::npos) return "loss";
  if (n.find("AccumulateGrad") != std::string::npos) return "grad accumulate";
  if (n.find("Fp32Linear") != std::string::npos || n.rfind("MmBackward", 0) == 0 || n.rfind("AddmmBackward", 0) == 0)
    return "gemm";
  if (n.find("Attention") != std::string::npos) return "attention";
  // The fused bf16 kernels' backward nodes (model/fused_ops.h); their forward ops carry a cat: scope.
  if (n.find("RmsNormFn") != std::string::npos) return "rmsnorm";
  if (n.find("RopeFn") != std::string::npos) return "rope";
  if (n.find("SiluMulFn") != std::string::npos) return "silu_mul";
  return "";
}

// Ops that move no tensor data: views, allocations, metadata.
bool moves_nothing(const std::string& n) {
  static const char* names[] = {
#include "moves_nothing.inc"
  };
  for (const char* v : names)
    if (n == v) return true;
  return false;
}

double operand_bytes(const at::RecordFunction& fn, const std::string& name) {
  const auto inputs = fn.inputs();
  if (name.rfind("alpaca::", 0) == 0) return !inputs.empty() && inputs[0].isInt() ? static_cast<double>(inputs[0].toInt()) : 0;
  if (moves_nothing(name)) return 0;
  double b = 0;
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (t.defined()) b += static_cast<double>(t.nbytes());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) b += t.defined() ? static_cast<double>(t.nbytes()) : 0;
    }
  }
  return b;
}

std::string current_kind() {
  for (auto it = t_stack.rbegin(); it != t_stack.rend(); ++it)
    if (!it->kind.empty()) return it->kind;
  return "";
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Frame f;
  f.name = fn.name();
  const auto scope = fn.scope();
  if (scope == at::RecordScope::USER_SCOPE) {
    if (f.name.rfind("phase:", 0) == 0) {
      f.is_phase = true;
      if (f.name == "phase:step") {
        std::lock_guard<std::mutex> lk(g_mu);
        if (++g_steps_seen == g_skip + 1) {
          g_by_kind.clear();
          g_by_op.clear();
          g_phase.clear();
          g_cpu_start = process_cpu_s();
          g_wall_start = wall_s();
        }
        g_seq_kind.clear();
        g_in_step = true;
      }
      t_phase.push_back(f.name.substr(6));
    } else if (f.name.rfind("fsdp:", 0) == 0) {  // the groups bench/torch_step_profile.py uses
      f.kind = f.name.find("gather") != std::string::npos ? "fsdp gather+cast" : "fsdp reduce-scatter+grad";
    } else if (f.name.rfind("cat:", 0) == 0) {
      f.kind = f.name.substr(4);
    }
  } else if (scope == at::RecordScope::BACKWARD_FUNCTION) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_seq_kind.find(fn.seqNr());
    f.kind = it != g_seq_kind.end() ? it->second : node_kind(f.name);
  } else if (is_gemm(f.name)) {
    f.kind = "gemm";
  } else if (f.name == "alpaca::ring_fold") {  // the reduce-scatter ring's folds, on whichever thread drives it
    f.kind = "fsdp reduce-scatter+grad";
  }
  if (scope == at::RecordScope::FUNCTION && fn.seqNr() >= 0) {
    const std::string k = f.kind.empty() ? current_kind() : f.kind;
    if (!k.empty()) {
      std::lock_guard<std::mutex> lk(g_mu);
      g_seq_kind.emplace(fn.seqNr(), k);
    }
  }
  if (scope == at::RecordScope::FUNCTION) {
    f.is_op = true;
    f.bytes = operand_bytes(fn, f.name);
  }
  f.cpu0 = thread_cpu_s();
  f.wall0 = wall_s();
  if (f.is_phase) f.flt0 = thread_minflt();
  t_stack.push_back(std::move(f));
  return nullptr;
}

void on_end(const at::RecordFunction&, at::ObserverContext*) {
  if (t_stack.empty()) return;
  const double cpu1 = thread_cpu_s(), wall1 = wall_s();
  Frame f = std::move(t_stack.back());
  t_stack.pop_back();
  const double cpu = cpu1 - f.cpu0, wall = wall1 - f.wall0;
  if (!t_stack.empty()) {
    t_stack.back().child_cpu += cpu;
    t_stack.back().child_wall += wall;
    if (f.is_op) ++t_stack.back().child_ops;
  }
  const double bytes = f.is_op && f.child_ops == 0 ? f.bytes : 0;  // leaves only: no byte counted twice
  const std::string phase = !t_phase.empty() ? t_phase.back() : g_in_step ? "other threads" : "setup";
  std::string kind = f.kind.empty() ? current_kind() : f.kind;
  const bool op = !f.is_phase && f.name.rfind("cat:", 0) != 0 && f.name.rfind("fsdp:", 0) != 0;
  if (kind.empty()) kind = f.is_phase ? "host code" : (phase == "optimizer" ? "optimizer" : "other ops");
  std::lock_guard<std::mutex> lk(g_mu);
  Acc& k = g_by_kind[{phase, kind}];
  k.cpu += cpu - f.child_cpu;
  k.wall += wall - f.child_wall;
  k.bytes += bytes;
  if (phase != "setup") {
    Acc& o = g_by_op[{kind, op ? f.name : std::string("(code in ") + f.name + ")"}];
    o.cpu += cpu - f.child_cpu;
    o.wall += wall - f.child_wall;
    o.bytes += bytes;
    ++o.calls;
  }
  if (f.is_phase) {
    Acc& p = g_phase[phase];
    p.cpu += cpu;
    p.wall += wall;
    p.minflt += thread_minflt() - f.flt0;
    ++p.calls;
    t_phase.pop_back();
    if (phase == "step") {
      g_cpu_end = process_cpu_s();
      g_wall_end = wall1;
      g_in_step = false;
    }
  }
}

nlohmann::json report() {
  std::lock_guard<std::mutex> lk(g_mu);
  const int steps = std::max(1, g_steps_seen - g_skip);
  nlohmann::json j;
  j["steps_profiled"] = g_steps_seen - g_skip;
  j["process_cpu_s_per_step"] = (g_cpu_end - g_cpu_start) / steps;
  j["wall_s_per_step"] = (g_wall_end - g_wall_start) / steps;
  for (const auto& [p, a] : g_phase)
    j["phases"][p] = {{"cpu_s", a.cpu / steps}, {"wall_s", a.wall / steps}, {"minflt", a.minflt / steps}};
  for (const auto& [k, a] : g_by_kind)
    j["by_kind"].push_back({{"phase", k.first}, {"kind", k.second}, {"cpu_s", a.cpu / steps}, {"wall_s", a.wall / steps},
                            {"bytes", a.bytes / steps}});
  for (const auto& [k, a] : g_by_op)
    j["by_op"].push_back({{"kind", k.first}, {"op", k.second}, {"cpu_s", a.cpu / steps}, {"wall_s", a.wall / steps},
                          {"bytes", a.bytes / steps}, {"calls", static_cast<double>(a.calls) / steps}});
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  const char* out = std::getenv("ALPACA_PROFILE_OUT");
  if (out == nullptr || *out == '\0') {
    std::cerr << "bench_train_profile: set ALPACA_PROFILE_OUT to the directory for rank<R>.json\n";
    return 2;
  }
  if (const char* s = std::getenv("ALPACA_PROFILE_SKIP")) g_skip = std::atoi(s);
  at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                            .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION,
                                     at::RecordScope::USER_SCOPE})
                            .needsInputs(true));
  int rc = 0;
  try {
    rc = alpaca::cli::dispatch(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const std::exception& e) {
    std::cerr << "bench_train_profile: " << e.what() << "\n";
    return 1;
  }
  at::clearCallbacks();
  const int rank = std::max(0, alpaca::process_rank());
  std::ofstream(std::string(out) + "/rank" + std::to_string(rank) + ".json") << report().dump(1) << "\n";
  return rc;
}
