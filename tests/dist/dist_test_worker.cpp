// A test-only worker for the launcher and failure tests (started by mpirun or by our launcher):
//   dist_test_worker report                  prints its rank, world and the sum of all ranks
//   dist_test_worker fail  <rank> <code>     <rank> exits with <code>; the others wait in a barrier
//   dist_test_worker die   <rank> <timeout>  <rank> SIGKILLs itself while the others are in all_reduce
//   dist_test_worker stuck <rank> <timeout>  <rank> sleeps forever while the others are in all_reduce
//   dist_test_worker loop <seconds> <timeout> every rank all_reduces 4 MiB for <seconds> (a fault comes from outside)
//   dist_test_worker bench [MiB,MiB,...]     prints the time of each fp32 collective per size (figures, not a
//                                            test): "BENCH <backend> world <W> <op> <MiB> MiB <ms> ms <GB/s> GB/s
//                                            cpu <s> s" (rank 0; MiB = the full tensor; cpu = rank 0's user+sys)
//                                            and every rank's resident-memory growth over each op:
//                                            "RSS rank <r> <op> <MiB> MiB +<growth> MiB" (the trainer's heap policy)
//   dist_test_worker save  <ms> <code>       waits for the trainer's stop signals (SIGTERM/SIGUSR1), then
//                                            "saves" for <ms> ms and exits with <code> (a preempted trainer)
//   dist_test_worker --nproc_per_node N ...  runs the built-in launcher on itself, as alpaca-train does
//                                            (also with a Kubeflow pod's PET_NPROC_PER_NODE and no flag)
// ALPACA_TEST_BACKEND=mpi|gloo|store|nccl picks the backend (default auto, CPU).
// Each process writes its pid to $ALPACA_TEST_PIDDIR/<pid> (when set) so tests can check that
// nothing is left behind.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <sstream>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "alpaca/ckpt/preemption.h"
#include "alpaca/cli/commands.h"
#include "alpaca/dist/launcher.h"
#include "alpaca/dist/runtime.h"
#include "alpaca/util/error.h"
#include "alpaca/util/sys.h"

namespace dist = alpaca::dist;

namespace {

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

// reduce_scatter, all_reduce and all_gather_into on fp32 tensors of each size (MiB of the full
// tensor: the all_reduce operand, the gathered output, the scattered input), median of 3 after a
// warm-up, each size's buffers freed before the next.
void bench(dist::Communicator& comm, const std::string& sizes) {
  const int W = comm.world_size();
  auto time_it = [&](const char* name, int64_t mib, auto fn) {
    const int64_t rss0 = alpaca::sys::rss_bytes();
    fn();  // warm-up (connections, buffers)
    std::vector<double> wall;
    double cpu = 0;
    for (int i = 0; i < 3; ++i) {
      comm.barrier()->wait();
      const double c0 = cpu_seconds();
      auto t0 = std::chrono::steady_clock::now();
      fn();
      if (comm.device().is_cuda()) (void)at::ones({1}, at::TensorOptions().device(comm.device())).item<float>();
      wall.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      cpu += cpu_seconds() - c0;
    }
    std::sort(wall.begin(), wall.end());
    const double s = wall[1];
    if (comm.rank() == 0)
      std::cout << "BENCH " << comm.backend() << " world " << W << " " << name << " " << mib << " MiB " << s * 1e3
                << " ms " << (mib << 20) / s / 1e9 << " GB/s cpu " << cpu / 3 << " s" << std::endl;
    std::cout << "RSS rank " << comm.rank() << " " << name << " " << mib << " MiB +"
              << (alpaca::sys::rss_bytes() - rss0) / (1 << 20) << " MiB" << std::endl;
  };
  std::stringstream ss(sizes);
  for (std::string item; std::getline(ss, item, ',');) {
    const int64_t mib = std::stoll(item), n = (mib << 20) / 4 / W * W;
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(comm.device());
    {
      at::Tensor full = at::ones({n}, f32), shard = at::empty({n / W}, f32);
      time_it("reduce_scatter", mib, [&] { comm.reduce_scatter(shard, full, dist::ReduceOp::kSum)->wait(); });
    }
    {
      at::Tensor t = at::ones({n}, f32);
      time_it("all_reduce", mib, [&] { comm.all_reduce(t, dist::ReduceOp::kSum)->wait(); });
    }
    {
      at::Tensor full = at::empty({n}, f32), shard = at::ones({n / W}, f32);
      time_it("all_gather", mib, [&] { comm.all_gather_into(full, shard)->wait(); });
    }
  }
}

}  // namespace

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "report";
  const int victim = argc > 2 ? std::atoi(argv[2]) : -1;
  if (const char* dir = std::getenv("ALPACA_TEST_PIDDIR")) std::ofstream(std::string(dir) + "/" + std::to_string(getpid()));
  dist::Runtime runtime;
  dist::CommOptions opts;
  if (const char* b = std::getenv("ALPACA_TEST_BACKEND")) opts.backend = dist::parse_backend(b);
  opts.cuda = opts.backend == dist::Backend::kNccl;
  if (mode == "die" || mode == "stuck" || mode == "loop") opts.timeout = std::chrono::seconds(argc > 3 ? std::atoi(argv[3]) : 5);
  auto comm = dist::make_communicator(opts);
  const auto& li = runtime.launch();

  at::Tensor t = at::full({1}, static_cast<int64_t>(comm->rank()), at::kLong).to(comm->device());
  comm->all_reduce(t, dist::ReduceOp::kSum)->wait();
  std::cout << "RANK " << comm->rank() << " WORLD " << comm->world_size() << " LOCAL " << li.local_rank << "/"
            << li.local_world_size << " NODE " << li.node_rank << "/" << li.num_nodes << " SOURCE " << dist::to_string(li.source) << " BACKEND " << comm->backend()
            << " SUM " << t.item<int64_t>() << std::endl;

  if (mode == "bench") {
    alpaca::sys::keep_host_heap();  // as the trainer: freed scratch stays resident, so RSS shows what an op touched
    bench(*comm, argc > 2 ? argv[2] : "16");
  } else if (mode == "save") {
    alpaca::ckpt::install_preemption_handlers();
    std::cout << "WAITING rank " << comm->rank() << std::endl;
    for (int i = 0; i < 60000 && alpaca::ckpt::stop_requested() == alpaca::ckpt::StopRequest::kNone; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(victim));
    std::cout << "SAVED rank " << comm->rank() << " on signal " << alpaca::ckpt::stop_signal() << std::endl;
    return argc > 3 ? std::atoi(argv[3]) : 0;
  } else if (mode == "loop") {
    // Every rank all_reduces 4 MiB (max: the values stay finite) for <seconds>; the fault tests
    // break a link or kill a node meanwhile.
    at::Tensor big = at::ones({1 << 20}, at::kFloat).to(comm->device());
    std::cout << "LOOPING rank " << comm->rank() << std::endl;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(victim);
    while (std::chrono::steady_clock::now() < until) comm->all_reduce(big, dist::ReduceOp::kMax)->wait();
  } else if (mode == "fail") {
    if (comm->rank() == victim) {
      dist::finalize(/*clean=*/false);  // a failing rank must not wait for the healthy ones
      return argc > 3 ? std::atoi(argv[3]) : 3;
    }
    comm->barrier()->wait();  // never completes: the victim is gone
  } else if (mode == "die" || mode == "stuck") {
    if (comm->rank() == victim) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
      if (mode == "die") raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    at::Tensor big = at::ones({1 << 16}, at::kBFloat16).to(comm->device());
    comm->all_reduce(big, dist::ReduceOp::kSum)->wait();  // the victim never joins
    (void)big.sum().item<float>();                        // host waits (CUDA: stream-ordered wait)
  }
  comm->barrier()->wait();
  return 0;
}

int main(int argc, char** argv) {
  try {
    std::vector<std::string> args(argv + 1, argv + argc);
    for (const auto& a : args)
      if (a.rfind("--nproc_per_node", 0) == 0) return alpaca::cli::run_launcher(args);
    if (dist::pod_launcher_options(dist::process_env())) return alpaca::cli::run_launcher(args);  // a Kubeflow pod
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
