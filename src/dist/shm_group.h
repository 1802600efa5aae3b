// Internal to src/dist: collectives between the processes of one host through one POSIX
// shared-memory segment per communicator, as NCCL's and Open MPI's intra-node paths do. The gloo
// communicator uses it when every rank of a communicator shares this host (same boot, network,
// pid and mount namespaces: the namespace "nodes" of the test bed stay on TCP); the segment is
// made after the gloo rendezvous and unlinked as soon as every rank mapped it, so nothing is left
// in /dev/shm even after a crash.
//
// Layout: a control page (barrier counter + generation used as a futex, an abort flag, each
// rank's arrival count), then
// world x 2 buffers of `half_bytes` (double-buffered, so one barrier per piece suffices: a
// buffer is written again only after a barrier that follows every rank's last read of it).
// Collectives move in pieces of at most one buffer; 16-bit floats are reduced in fp32 and
// rounded once, avg is a sum divided by the world size (integers truncate), every rank gets the
// same bits (each element is reduced once, in rank order). Waits poll the peers' pids and the
// deadline: a dead peer is noticed within ~20 ms, a stuck one at the deadline; either failure
// poisons the segment so the other ranks fail at once too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>  // defines: at::Tensor

#include "alpaca/dist/communicator.h"  // defines: ReduceOp

namespace alpaca::dist::detail {

using ShmDeadline = std::chrono::steady_clock::time_point;

// An all-gather of a few int64 per rank over the communicator's own transport (gloo): what
// ShmGroup::open agrees on with its peers. Returns world x mine.size() values in rank order.
using ShmExchange = std::function<std::vector<int64_t>(const std::vector<int64_t>& mine)>;

class ShmGroup {
 public:
  // Collective over the communicator: a group when every rank is on this host, shared memory is
  // enabled (ALPACA_GLOO_SHM, default on) and the segment could be made and mapped everywhere;
  // else nullptr on every rank (the caller keeps its own transport).
  static std::unique_ptr<ShmGroup> open(int rank, int world, const ShmExchange& exchange);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // Each runs to completion or throws std::runtime_error (peer died, deadline, aborted); after a
  // throw the group is poisoned on every rank. Shapes and dtypes are checked by the caller.
  void all_gather(at::Tensor out, const at::Tensor& in, ShmDeadline deadline);            // out (W*n), in (n)
  void reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp op, ShmDeadline deadline);  // out (n), in (W*n)
  void all_reduce(at::Tensor t, ReduceOp op, ShmDeadline deadline);
  void broadcast(at::Tensor t, int root, ShmDeadline deadline);
  void barrier(ShmDeadline deadline);
  // Makes every current and later wait of this process fail at once (communicator teardown).
  void stop();

  int64_t half_bytes() const { return half_bytes_; }

 private:
  struct Control;
  ShmGroup(int rank, int world, void* base, size_t bytes, int64_t half_bytes, std::vector<int64_t> pids);
  // Elements [begin, end) of `owner`'s buffer `parity`, viewed as `type`.
  at::Tensor buffer(int owner, int parity, at::ScalarType type, int64_t begin, int64_t end) const;
  at::Tensor mine(at::ScalarType type, int64_t begin, int64_t end) const { return buffer(rank_, parity_, type, begin, end); }
  void sync(ShmDeadline deadline);  // the barrier; throws (and poisons) on failure
  void wait_slow(uint32_t generation, ShmDeadline deadline);
  [[noreturn]] void fail(const std::string& why);
  void check_peers();
  std::string late_ranks() const;
  std::atomic<uint64_t>* passes() const;  // (world) arrival counters in the control page  // "rank 2, 3 (not arrived)": those behind this one

  int rank_, world_;
  void* base_;
  size_t bytes_;
  int64_t half_bytes_;
  std::vector<int64_t> pids_;  // (world): each rank's process id, polled while waiting
  int parity_ = 0;             // the buffer half the next piece uses
  bool poisoned_ = false;
  std::atomic<bool> stopping_{false};
};

// Runs posted tasks one after another on its own thread, in post order (a communicator's
// collectives, issued in the same order on every rank). A task's exception reaches its future.
class SerialWorker {
 public:
  SerialWorker();
  ~SerialWorker();  // runs what is queued, then joins
  std::shared_future<void> post(std::function<void()> task);

 private:
  void loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace alpaca::dist::detail
