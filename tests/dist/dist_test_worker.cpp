// A test-only worker for the launcher and failure tests (started by mpirun or by our launcher):
//   dist_test_worker report                  prints its rank, world and the sum of all ranks
//   dist_test_worker fail  <rank> <code>     <rank> exits with <code>; the others wait in a barrier
//   dist_test_worker die   <rank> <timeout>  <rank> SIGKILLs itself while the others are in all_reduce
//   dist_test_worker stuck <rank> <timeout>  <rank> sleeps forever while the others are in all_reduce
//   dist_test_worker bench [MiB]             prints the bandwidth of each collective (figures, not a test)
//   dist_test_worker save  <ms> <code>       waits for the trainer's stop signals (SIGTERM/SIGUSR1), then
//                                            "saves" for <ms> ms and exits with <code> (a preempted trainer)
//   dist_test_worker --nproc_per_node N ...  runs the built-in launcher on itself, as alpaca-train does
// ALPACA_TEST_BACKEND=mpi|store|nccl picks the backend (default auto, CPU).
// Each process writes its pid to $ALPACA_TEST_PIDDIR/<pid> (when set) so tests can check that
// nothing is left behind.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "alpaca/ckpt/preemption.h"
#include "alpaca/cli/commands.h"
#include "alpaca/dist/runtime.h"
#include "alpaca/util/error.h"

namespace dist = alpaca::dist;

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "report";
  const int victim = argc > 2 ? std::atoi(argv[2]) : -1;
  if (const char* dir = std::getenv("ALPACA_TEST_PIDDIR")) std::ofstream(std::string(dir) + "/" + std::to_string(getpid()));
  dist::Runtime runtime;
  dist::CommOptions opts;
  if (const char* b = std::getenv("ALPACA_TEST_BACKEND")) opts.backend = dist::parse_backend(b);
  opts.cuda = opts.backend == dist::Backend::kNccl;
  if (mode == "die" || mode == "stuck") opts.timeout = std::chrono::seconds(argc > 3 ? std::atoi(argv[3]) : 5);
  auto comm = dist::make_communicator(opts);
  const auto& li = runtime.launch();

  at::Tensor t = at::full({1}, static_cast<int64_t>(comm->rank()), at::kLong).to(comm->device());
  comm->all_reduce(t, dist::ReduceOp::kSum)->wait();
  std::cout << "RANK " << comm->rank() << " WORLD " << comm->world_size() << " LOCAL " << li.local_rank << "/"
            << li.local_world_size << " NODE " << li.node_rank << "/" << li.num_nodes << " SOURCE " << dist::to_string(li.source) << " BACKEND " << comm->backend()
            << " SUM " << t.item<int64_t>() << std::endl;

  if (mode == "bench") {
    const int64_t bytes = (argc > 2 ? std::atoll(argv[2]) : 16) << 20;
    const int W = comm->world_size();
    auto time_it = [&](const char* name, auto fn) {
      fn();  // warm-up
      comm->barrier()->wait();
      const int reps = 5;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) fn();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
      if (comm->rank() == 0)
        std::cout << "BENCH " << comm->backend() << " world " << W << " " << name << " " << (bytes >> 20)
                  << " MiB: " << s * 1e3 << " ms, " << bytes / s / 1e9 << " GB/s (payload bytes / time)" << std::endl;
    };
    auto opts_f = at::TensorOptions().device(comm->device());
    at::Tensor f32 = at::ones({bytes / 4}, opts_f.dtype(at::kFloat));
    at::Tensor b16_full = at::ones({bytes / 2 / W * W}, opts_f.dtype(at::kBFloat16));
    at::Tensor b16_shard = at::ones({bytes / 2 / W}, opts_f.dtype(at::kBFloat16));
    time_it("all_reduce fp32", [&] { comm->all_reduce(f32, dist::ReduceOp::kSum)->wait(); });
    time_it("all_gather_into bf16", [&] { comm->all_gather_into(b16_full, b16_shard)->wait(); });
    time_it("reduce_scatter bf16", [&] { comm->reduce_scatter(b16_shard, b16_full, dist::ReduceOp::kAvg)->wait(); });
    at::Tensor f32_shard = at::ones({bytes / 4 / W}, opts_f.dtype(at::kFloat));
    at::Tensor f32_full = at::ones({bytes / 4 / W * W}, opts_f.dtype(at::kFloat));
    time_it("reduce_scatter fp32", [&] { comm->reduce_scatter(f32_shard, f32_full, dist::ReduceOp::kSum)->wait(); });
    at::Tensor b16 = at::ones({bytes / 2}, opts_f.dtype(at::kBFloat16));
    time_it("all_reduce bf16", [&] { comm->all_reduce(b16, dist::ReduceOp::kSum)->wait(); });
    if (comm->device().is_cuda()) (void)f32.sum().item<float>();
  } else if (mode == "save") {
    alpaca::ckpt::install_preemption_handlers();
    std::cout << "WAITING rank " << comm->rank() << std::endl;
    for (int i = 0; i < 60000 && alpaca::ckpt::stop_requested() == alpaca::ckpt::StopRequest::kNone; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(victim));
    std::cout << "SAVED rank " << comm->rank() << " on signal " << alpaca::ckpt::stop_signal() << std::endl;
    return argc > 3 ? std::atoi(argv[3]) : 0;
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
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
}
