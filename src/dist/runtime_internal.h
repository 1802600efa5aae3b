// Private to src/dist: what the backends share with the runtime (MPI state, the rendezvous
// store, failure handling and the "which collective am I in" record for signal handlers).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>  // defines: c10::intrusive_ptr

#include "alpaca/dist/runtime.h"

namespace c10d {
class Store;
}

namespace alpaca::dist::detail {

// True between MPI_Init_thread (by us) and MPI_Finalize.
bool mpi_active();
// True when a progress thread drives MPI collectives: MPI runs with MPI_THREAD_MULTIPLE and
// ALPACA_MPI_PROGRESS_THREAD is not 0.
bool mpi_progress_thread();
// Stops the MPI progress thread; finalize() calls it before MPI_Finalize.
void stop_mpi_progress();
// Throws unless the calling thread may call MPI (FUNNELED/SERIALIZED: only the init thread).
void check_mpi_thread(const char* op);
// True when MPI runs with MPI_THREAD_MULTIPLE, so any thread (e.g. the NCCL watchdog) may call
// MPI_Abort; below it only the init thread may call MPI at all.
bool mpi_thread_multiple();

// The torchrun-style rendezvous store (rank 0 hosts it), made on first use; its operations are
// bounded by `timeout`. For a world of one it is an in-process store.
c10::intrusive_ptr<c10d::Store> torchrun_store(std::chrono::milliseconds timeout);

// Ends the job for a failed/timed-out collective: under MPI prints `msg` with the rank and calls
// MPI_Abort; otherwise throws alpaca::Error(msg) (main prints it, the launcher stops the rest).
[[noreturn]] void fail_collective(const std::string& msg);

// Records the collective this thread is waiting in, so a SIGTERM/SIGINT (e.g. mpirun or our
// launcher stopping the job after another rank died) prints what this rank was doing.
class WaitScope {
 public:
  explicit WaitScope(const std::string& what);
  ~WaitScope();
};

// Steady-clock deadline of a collective issued now.
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  return std::chrono::steady_clock::now() + timeout;
}

// An exception's message without the C++ backtrace that c10::Error appends to what().
std::string short_what(const std::exception& e);

// A short description of a tensor for error messages: "4099 x BFloat16".
std::string describe(const at::Tensor& t);
// The buffers of a flat all_gather_into / reduce_scatter (MPI, NCCL): out and in contiguous and of
// one dtype, the whole side `world` times the other (all_gather_into: out, `out_is_whole`;
// reduce_scatter: in). Errors name `op`.
void check_flat_buffers(const at::Tensor& out, const at::Tensor& in, int world, const char* op, bool out_is_whole);
const char* to_string(ReduceOp op);

std::shared_ptr<Communicator> make_mpi_communicator(const CommOptions& options);
std::shared_ptr<Communicator> make_store_communicator(const CommOptions& options);
std::shared_ptr<Communicator> make_gloo_communicator(const CommOptions& options);
#ifdef ALPACA_WITH_CUDA
std::shared_ptr<Communicator> make_nccl_communicator(const CommOptions& options);
#endif

}  // namespace alpaca::dist::detail
