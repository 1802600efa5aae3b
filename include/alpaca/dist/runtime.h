// The process-level distributed runtime: discovers how the job was launched, initialises MPI
// when an MPI launcher started us, owns the rendezvous store of torchrun-style launches, and
// builds communicators. One per process; `Runtime` is the RAII form for main/trainer.
//
//   alpaca::dist::Runtime runtime;                       // init(); finalize() on scope exit
//   auto comm = alpaca::dist::make_communicator({});     // MPI or gloo on CPU, NCCL on CUDA
//   comm->all_reduce(t, alpaca::dist::ReduceOp::kSum)->wait();
//
// Backends (CommOptions::backend, or "auto"):
// - "mpi":   CPU tensors over MPI. Used when mpirun/mpiexec/srun started us, and for a single
//            process (MPI singleton). MPI is initialised with MPI_THREAD_MULTIPLE when the library
//            offers it (ALPACA_MPI_THREAD_LEVEL=serialized|funneled asks for less); then a
//            progress thread advances pending collectives (ALPACA_MPI_PROGRESS_THREAD=0 turns it
//            off). Below MULTIPLE every collective and wait must come from the thread that called
//            init(), which is checked (alpaca::Error naming the collective).
// - "gloo":  CPU tensors over LibTorch's c10d::ProcessGroupGloo (TCP, ring / halving-doubling),
//            rendezvous through the torchrun-style c10d::TCPStore (rank 0 hosts it; it carries no
//            tensor bytes). Used for torchrun-style launches (our --nproc_per_node launcher,
//            torchrun, PyTorchJob, TrainJob) where no MPI launcher exists. Binds to
//            GLOO_SOCKET_IFNAME, else to the address facing MASTER_ADDR.
// - "store": CPU tensors exchanged through the TCPStore itself (every byte through rank 0).
//            Only on request (ALPACA_TEST_BACKEND=store), as a baseline for the bandwidth bench;
//            its collectives complete before they return.
// - "nccl":  CUDA tensors (device cuda:local_rank) over NCCL on dedicated streams; the unique id
//            travels over MPI (mpirun/srun) or the store (torchrun-style).
//
// Failure policy (--ddp_timeout): every wait is bounded by CommOptions::timeout. When a
// collective fails or times out, the rank prints an error naming the collective to stderr and
// - under an MPI launch: calls MPI_Abort, so every rank of the job ends at once;
// - otherwise: throws alpaca::Error (the launcher then stops the other workers).
// A rank terminated by SIGTERM/SIGINT while waiting prints which collective it was in.
// Start-up: under an MPI launch init() holds a roll call before its first blocking collective,
// bounded by LaunchInfo::timeout; a rank that did not answer is named and the job is aborted.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "alpaca/dist/communicator.h"
#include "alpaca/dist/launch.h"

namespace alpaca::dist {

enum class Backend { kAuto, kMpi, kGloo, kStore, kNccl };
// "auto", "mpi", "gloo", "store", "nccl"; throws alpaca::Error naming the accepted words otherwise.
Backend parse_backend(const std::string& word);
const char* to_string(Backend backend);

struct CommOptions {
  Backend backend = Backend::kAuto;
  bool cuda = false;  // auto: NCCL on cuda:local_rank when true, a CPU backend otherwise
  // Bound on every collective from issue to completion (HF --ddp_timeout, default 1800 s).
  std::chrono::milliseconds timeout = std::chrono::seconds(1800);
};

// Idempotent. Discovers the launch, sets alpaca::set_process_rank, and initialises MPI for
// MPI launches and single processes. Throws alpaca::Error on inconsistent launch variables.
// Call from the main thread before any communicator is made.
const LaunchInfo& init();
// The same with a launch the caller already discovered (dist::discover_launch()), so a process
// reads its launch environment once: alpaca-train reads it before parsing flags and passes it here.
const LaunchInfo& init(const LaunchInfo& launch);
bool is_initialized();
// The launch found by init(); throws if init() has not run.
const LaunchInfo& launch_info();
// Idempotent. Synchronises with the other ranks and shuts MPI / the store down cleanly.
// With `clean == false` (an error is unwinding) it skips every synchronisation so a failing rank
// never waits on healthy ones: the launcher (mpirun, our launcher) then ends the job.
void finalize(bool clean = true);

// Asked every 50 ms while a torchrun-style rank waits in the start-up rendezvous: a non-zero result
// is the exit code to leave with at once (the caller's signal handling says a scheduler's notice
// came; before the rendezvous ends there is nothing to save). Set before init / make_communicator.
void set_startup_interrupt(std::function<int()> exit_code_if_interrupted);

// RAII: init() now, finalize() at scope exit (clean unless an exception is unwinding).
class Runtime {
 public:
  Runtime();
  explicit Runtime(const LaunchInfo& launch);  // init(launch)
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;
  const LaunchInfo& launch() const { return launch_info(); }
};

// A communicator over all ranks of the job (collective: every rank calls it, same options).
// Calls init() if needed. Throws alpaca::Error when the backend is unavailable for this launch
// (e.g. "mpi" without an MPI launcher, "nccl" without a GPU for this local rank).
std::shared_ptr<Communicator> make_communicator(const CommOptions& options);

}  // namespace alpaca::dist
