// The NCCL backend for CUDA tensors. Each communicator has two lanes, one per direction, so a
// backward-prefetch all-gather never queues behind the previous unit's reduce-scatter: the gather
// lane (all_gather_into, broadcast) and the reduce lane (reduce_scatter, all_reduce, barrier).
// A lane is an NCCL communicator of its own (the gather one split from the reduce one; NCCL needs
// one issue order per communicator) with its own high-priority stream. A collective makes the
// lane's stream wait on an event of the caller's current stream, enqueues the NCCL call, and
// records an end event; wait() makes the caller's current stream wait on it, so the host never
// blocks in the hot path. barrier() is the exception: its wait() blocks the host until every rank
// arrived (checkpoint sealing relies on host ordering). Every rank issues the collectives of both
// lanes in the same program order (the FSDP engine is deterministic), which is what two NCCL
// communicators on one device need to make progress together.
//
// Memory: the tensors of a collective are kept alive by its Work until the caller's stream was
// ordered after the end event (wait() on the stream that issued it), or the watchdog saw the end
// event complete; then they are released, and the caching allocator may hand the blocks to the
// caller's stream again, which is ordered after the collective. No record_stream: blocks return as
// soon as the order is known, so peak memory is what the engine's own lifetimes say.
//
// Creation is bounded by --ddp_timeout: communicators are nonblocking (config.blocking = 0), after
// every NCCL call the communicator is polled with ncclCommGetAsyncError until it settles or the
// deadline passes (a call's return value does not say: a split returns ncclSuccess while it still
// runs, and writes the child only when done — see settle and split_settled); past the deadline the
// communicator is aborted (ncclCommAbort) and the error names what timed out. A watchdog thread
// polls the end events and ncclCommGetAsyncError: on an error or a collective older than the
// timeout it aborts the NCCL communicators and ends the process naming the collective: MPI_Abort when MPI runs with MPI_THREAD_MULTIPLE (any thread may call MPI then);
// under a lower thread level a non-main thread may not call MPI at all, so it exits with code 1
// without MPI (mpirun and srun end the whole job when a rank exits non-zero without finalizing),
// like PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING=1, because a watchdog thread cannot throw into
// the thread that is blocked on the aborted work.
#include <nccl.h>

#include <ATen/cuda/CUDAEvent.h>  // defines: at::cuda::CUDAEvent
#include <c10/cuda/CUDAFunctions.h>  // defines: c10::cuda::device_count, set_device
#include <c10/cuda/CUDAGuard.h>   // defines: c10::cuda::CUDAGuard, CUDAStreamGuard
#include <c10/cuda/CUDAStream.h>  // defines: c10::cuda::CUDAStream, getStreamFromPool
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/Store.hpp>  // defines: c10d::Store

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "alpaca/util/error.h"
#include "alpaca/util/host_sync.h"
#include "mpi_include.h"
#include "runtime_internal.h"

namespace alpaca::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

#define ALPACA_NCCL_CHECK(call, what)                                                               \
  do {                                                                                              \
    ncclResult_t alpaca_nccl_rc_ = (call);                                                          \
    ALPACA_CHECK(alpaca_nccl_rc_ == ncclSuccess, what << ": " #call " failed: "                     \
                                                      << ncclGetErrorString(alpaca_nccl_rc_) << " " \
                                                      << ncclGetLastError(nullptr));                \
  } while (0)

ncclDataType_t nccl_type(at::ScalarType st, const char* op) {
  switch (st) {
    case at::kFloat: return ncclFloat32;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kLong: return ncclInt64;
    case at::kInt: return ncclInt32;
    case at::kDouble: return ncclFloat64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    case at::kBool: return ncclUint8;
    default: break;
  }
  ALPACA_FAIL(op << ": NCCL cannot move " << st << " tensors");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// The unique id travels from rank 0 over MPI (mpirun/srun) or the rendezvous store (torchrun).
ncclUniqueId exchange_unique_id(int rank, const std::string& store_key, std::chrono::milliseconds timeout) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) ALPACA_NCCL_CHECK(ncclGetUniqueId(&id), "make_communicator(nccl)");
  if (mpi_active()) {
    MPI_Request req;
    ALPACA_CHECK(MPI_Ibcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD, &req) == MPI_SUCCESS,
                 "make_communicator(nccl): MPI_Ibcast of the NCCL unique id failed");
    auto deadline = deadline_after(timeout);
    WaitScope scope("the NCCL unique id broadcast (make_communicator)");
    for (int flag = 0; !flag;) {
      MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (!flag && Clock::now() > deadline)
        fail_collective("the NCCL unique id broadcast did not complete within the timeout; a rank is missing");
      if (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return id;
  }
  auto store = torchrun_store(timeout);
  if (rank == 0) {
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    store->set(store_key, std::vector<uint8_t>(p, p + sizeof id));
  } else {
    try {
      store->wait({store_key}, timeout);
    } catch (const std::exception& e) {
      fail_collective(std::string("waiting for the NCCL unique id from rank 0 failed: ") + short_what(e));
    }
    std::vector<uint8_t> b = store->get(store_key);
    ALPACA_CHECK(b.size() == sizeof id, "the NCCL unique id in the store has " << b.size() << " bytes, expected "
                                                                               << sizeof id);
    std::memcpy(&id, b.data(), sizeof id);
  }
  return id;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

// Nonblocking NCCL: a call on `comm` may leave it busy (ncclCommGetAsyncError says ncclInProgress)
// whatever the call returned: ncclCommSplit ends its NCCL group and returns ncclSuccess while the
// group's job still runs (NCCL passes the group's ncclInProgress through its error check and returns
// the call's own result; ncclCommInitRankConfig returns the polled state instead), so the return
// value alone does not say the communicator is ready. Unless the call failed outright, polls `comm` (spinning briefly,
// then sleeping) until it settles or `deadline` passes; returns the settled state, or
// ncclInProgress on expiry. (Seen on the first GPU run, H200, NCCL 2.28: a split that returned
// ncclSuccess left the parent busy and the child not yet written.)
ncclResult_t settle(ncclComm_t comm, ncclResult_t rc, Clock::time_point deadline) {
  if (rc != ncclSuccess && rc != ncclInProgress) return rc;
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    if (q != ncclSuccess) return q;
    if (state != ncclInProgress) return state;
    if (Clock::now() > deadline) return ncclInProgress;
    if (spins < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

// ncclCommSplit of a nonblocking `parent`: the split runs as a job of the parent, and NCCL stores
// the child into the pointer it was given only when that job ends (until then it reads
// NCCL_COMM_NULL). So the parent is what is polled, and the child is read after it settled; the
// pointer lives in this frame, which is left only once the job is over: settled, or the parent
// aborted (ncclCommAbort joins the job). On failure (or expiry) the parent and any child are
// aborted and the result says why; `child` is then nullptr. NCCL_SPLIT_NOCOLOR gives no child.
struct SplitResult {
  ncclResult_t rc = ncclSuccess;
  ncclComm_t child = nullptr;
};
SplitResult split_settled(ncclComm_t parent, int color, int key, Clock::time_point deadline) {
  ncclComm_t slot = nullptr;  // written by NCCL's job thread
  ncclConfig_t config = nonblocking_config();
  SplitResult r;
  r.rc = settle(parent, ncclCommSplit(parent, color, key, &slot, &config), deadline);
  r.child = __atomic_load_n(&slot, __ATOMIC_ACQUIRE);
  if (r.rc == ncclSuccess && r.child != nullptr) r.rc = settle(r.child, ncclSuccess, deadline);
  if (r.rc == ncclSuccess && color != NCCL_SPLIT_NOCOLOR && r.child == nullptr) r.rc = ncclInternalError;
  if (r.rc != ncclSuccess) {
    ncclCommAbort(parent);
    if (ncclComm_t late = __atomic_load_n(&slot, __ATOMIC_ACQUIRE)) ncclCommAbort(late);
    r.child = nullptr;
  }
  return r;
}

// What a communicator creation that did not settle says: a timeout names the deadline and the
// likely causes, an error NCCL's own words.
std::string creation_failure(const std::string& what, ncclResult_t rc, std::chrono::milliseconds timeout) {
  std::ostringstream os;
  if (rc == ncclInProgress) {
    os << what << " did not complete within " << timeout.count() / 1000.0
       << " s (--ddp_timeout); a rank is missing, started late, or cannot reach its peers (check that every rank "
          "was started, and NCCL_SOCKET_IFNAME / the network between the nodes)";
  } else {
    os << what << " failed: " << ncclGetErrorString(rc) << " " << ncclGetLastError(nullptr);
  }
  return os.str();
}

// A collective in flight: its end event on the lane's stream, the stream it was issued from, and
// the tensors it reads and writes, kept alive until their reuse is ordered after it.
struct Inflight {
  Inflight(std::shared_ptr<at::cuda::CUDAEvent> e, std::string w, Clock::time_point d, std::vector<at::Tensor> k,
           c10::cuda::CUDAStream s)
      : end(std::move(e)), what(std::move(w)), deadline(d), issued_on(s), keep(std::move(k)) {}
  void release() {
    std::vector<at::Tensor> drop;
    std::lock_guard<std::mutex> lock(mu);
    drop.swap(keep);
  }
  std::shared_ptr<at::cuda::CUDAEvent> end;
  std::string what;
  Clock::time_point deadline;
  c10::cuda::CUDAStream issued_on;
  std::mutex mu;
  std::vector<at::Tensor> keep;
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Inflight> inflight, bool host_blocking)
      : inflight_(std::move(inflight)), host_blocking_(host_blocking) {}
  void wait() override {
    const c10::DeviceIndex dev = inflight_->end->device_index();
    c10::cuda::CUDAGuard guard(dev);
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(dev);
    if (host_blocking_) {
      // The host waits (bounded by the watchdog, which ends the process past the timeout).
      WaitScope scope(inflight_->what);
      util::count_host_sync();
      for (int spins = 0; !inflight_->end->query(); ++spins) {
        if (spins < 1000) {
          std::this_thread::yield();
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
      }
    } else {
      // Stream-ordered: the caller's current stream waits; the host does not.
      inflight_->end->block(current);
    }
    // Reuse of the tensors' blocks by the issuing stream is now ordered after the collective.
    if (host_blocking_ || current == inflight_->issued_on) inflight_->release();
  }

 private:
  std::shared_ptr<Inflight> inflight_;
  bool host_blocking_;
};

enum LaneId { kGatherLane = 0, kReduceLane = 1 };

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` (settled), and splits the gather lane's communicator off it
  // (collective over `comm`, like the constructor's callers).
  NcclCommunicator(ncclComm_t comm, int device, const CommOptions& options, std::string name)
      : device_(device), options_(options), name_(std::move(name)) {
    lanes_[kReduceLane].comm = comm;
    for (auto& lane : lanes_)
      lane.stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device));
    ALPACA_NCCL_CHECK(ncclCommUserRank(comm, &rank_), "nccl communicator " << name_);
    ALPACA_NCCL_CHECK(ncclCommCount(comm, &world_), "nccl communicator " << name_);
    SplitResult gather;
    {
      WaitScope scope("ncclCommSplit of the all-gather lane of nccl communicator " + name_);
      gather = split_settled(comm, 0, rank_, deadline_after(options_.timeout));
    }
    if (gather.rc != ncclSuccess) {  // `comm` is aborted
      lanes_[kReduceLane].comm = nullptr;
      fail_collective(creation_failure("ncclCommSplit (the all-gather lane of nccl communicator " + name_ + ")",
                                       gather.rc, options_.timeout));
    }
    lanes_[kGatherLane].comm = gather.child;
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (aborted_) return;
    const auto deadline = deadline_after(options_.timeout);
    for (auto& lane : lanes_) {
      if (lane.comm == nullptr) continue;
      // Finalize flushes what was issued; past the timeout the communicator is aborted instead.
      if (settle(lane.comm, ncclCommFinalize(lane.comm), deadline) == ncclSuccess) {
        ncclCommDestroy(lane.comm);
      } else {
        ncclCommAbort(lane.comm);
      }
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  at::Device device() const override { return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(device_)); }
  std::string backend() const override { return "nccl"; }

  WorkHandle all_gather_into(at::Tensor out, const at::Tensor& in) override {
    const char* op = "all_gather_into";
    check(out, op, "out");
    check(in, op, "in");
    check_flat_buffers(out, in, world_, op, /*out_is_whole=*/true);
    // In place (in == out + rank*n) is NCCL's own in-place form.
    return enqueue(kGatherLane, label(op, in), {out, in}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in.scalar_type(), op), c, s);
    });
  }

  WorkHandle reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp r) override {
    const char* op = "reduce_scatter";
    check(out, op, "out");
    check(in, op, "in");
    check_flat_buffers(out, in, world_, op, /*out_is_whole=*/false);
    return enqueue(kReduceLane, label(op, in, r), {out, in}, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.scalar_type(), op),
                               nccl_op(r), c, s);
    });
  }

  WorkHandle all_reduce(at::Tensor t, ReduceOp r) override {
    const char* op = "all_reduce";
    check(t, op, "t");
    at::Tensor buf = t.contiguous();
    return enqueue(
        kReduceLane, label(op, t, r), {t, buf},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_type(buf.scalar_type(), op),
                               nccl_op(r), c, s);
        },
        [&] {
          if (!buf.is_same(t)) t.copy_(buf);  // on the lane's stream, after the reduction
        });
  }

  WorkHandle broadcast(at::Tensor t, int root) override {
    const char* op = "broadcast";
    check(t, op, "t");
    ALPACA_CHECK(root >= 0 && root < world_, op << ": root " << root << " is outside the " << world_ << " ranks");
    at::Tensor buf = t.contiguous();
    return enqueue(
        kGatherLane, label(op, t) + " from rank " + std::to_string(root), {t, buf},
        [&](ncclComm_t c, cudaStream_t s) {
          return ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_type(buf.scalar_type(), op), root, c,
                               s);
        },
        [&] {
          if (!buf.is_same(t)) t.copy_(buf);
        });
  }

  WorkHandle barrier() override {
    // NCCL has no barrier: a one-element all-reduce every rank must join, and wait() blocks the
    // host until it completed here, i.e. until every rank has issued it.
    at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
    return enqueue(
        kReduceLane, label("barrier"), {one},
        [&](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, c, s); },
        [] {}, /*host_blocking=*/true);
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    check_healthy("split");
    const std::string what = "ncclCommSplit(color " + std::to_string(color) + ", key " + std::to_string(key) +
                             ") of nccl communicator " + name_;
    SplitResult sub;
    {
      WaitScope scope(what);
      std::lock_guard<std::mutex> nccl(nccl_mu_);
      sub = split_settled(lanes_[kReduceLane].comm, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                          deadline_after(options_.timeout));
      if (sub.rc != ncclSuccess) {
        // split_settled aborted (freed) the reduce lane's communicator: forgotten before nccl_mu_ is
        // released, so the watchdog never polls it (it polls under mu_ and only try-locks nccl_mu_:
        // taking mu_ here cannot deadlock).
        std::lock_guard<std::mutex> lock(mu_);
        lanes_[kReduceLane].comm = nullptr;
      }
    }
    if (sub.rc != ncclSuccess) {
      // The gather lane's communicator goes with the reduce lane's.
      const std::string failure = creation_failure(what, sub.rc, options_.timeout);
      abort_all(failure);
      fail_collective(failure);
    }
    if (color < 0) return nullptr;
    return std::make_shared<NcclCommunicator>(sub.child, device_, options_,
                                              name_ + "/split(" + std::to_string(color) + ")");
  }

 private:
  struct Lane {
    ncclComm_t comm = nullptr;
    std::optional<c10::cuda::CUDAStream> stream;  // set by the constructor
    std::deque<std::shared_ptr<Inflight>> pending;
  };

  void check(const at::Tensor& t, const char* op, const char* name) const {
    ALPACA_CHECK(t.defined() && t.is_cuda() && t.device().index() == device_,
                 op << ": " << name << " must be a CUDA tensor on cuda:" << device_ << " for the nccl backend, got "
                    << (t.defined() ? t.device().str() : std::string("undefined")));
  }

  void check_healthy(const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    ALPACA_CHECK(!aborted_, op << " on nccl communicator " << name_ << " after it was aborted: " << abort_reason_);
  }

  std::string label(const char* op, const at::Tensor& t = {}, std::optional<ReduceOp> r = std::nullopt) {
    std::ostringstream os;
    os << op << " #" << ++seq_;
    if (t.defined()) os << " (" << describe(t) << (r ? std::string(", ") + to_string(*r) : std::string()) << ")";
    os << " on nccl communicator " << name_ << " (rank " << rank_ << " of " << world_ << ")";
    return os.str();
  }

  template <class Launch, class After = void (*)()>
  WorkHandle enqueue(LaneId id, const std::string& what, std::vector<at::Tensor> keep, Launch launch,
                     After after = [] {}, bool host_blocking = false) {
    check_healthy(what.c_str());
    Lane& lane = lanes_[id];
    c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_));
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
    // The inputs were produced on the caller's stream: the lane's stream waits for them.
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(*lane.stream);
    const auto deadline = deadline_after(options_.timeout);
    {
      c10::cuda::CUDAStreamGuard stream_guard(*lane.stream);
      ncclResult_t rc;
      {
        std::lock_guard<std::mutex> nccl(nccl_mu_);
        rc = settle(lane.comm, launch(lane.comm, lane.stream->stream()), deadline);
      }
      if (rc == ncclInProgress) {
        abort_all(what + " could not be enqueued within the timeout (--ddp_timeout)");
        fail_collective(what + " could not be enqueued within the timeout (--ddp_timeout); NCCL stayed busy");
      }
      ALPACA_CHECK(rc == ncclSuccess, what << " failed in NCCL: " << ncclGetErrorString(rc) << " "
                                           << ncclGetLastError(nullptr));
      after();
    }
    auto end = std::make_shared<at::cuda::CUDAEvent>();
    end->record(*lane.stream);
    auto inflight = std::make_shared<Inflight>(end, what, deadline, std::move(keep), compute);
    {
      std::lock_guard<std::mutex> lock(mu_);
      lane.pending.push_back(inflight);
    }
    cv_.notify_all();
    return std::make_shared<NcclWork>(inflight, host_blocking);
  }

  // Aborts both lanes' NCCL communicators once (any thread); later calls are refused.
  void abort_all(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (aborted_) return;
      aborted_ = true;
      abort_reason_ = reason;
    }
    for (auto& lane : lanes_)
      if (lane.comm != nullptr) ncclCommAbort(lane.comm);
  }

  // Polls pending collectives: completion (releasing their tensors), NCCL async errors, deadlines.
  void watch() {
    c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      std::vector<std::shared_ptr<Inflight>> done;
      std::string failure;
      for (auto& lane : lanes_) {
        try {
          while (!lane.pending.empty() && lane.pending.front()->end->query()) {
            done.push_back(std::move(lane.pending.front()));
            lane.pending.pop_front();
          }
        } catch (const c10::Error& e) {  // a sticky CUDA error (another kernel's fault): reported, not terminate()
          if (failure.empty()) failure = lane.pending.front()->what + " could not be polled: " + e.what_without_backtrace();
          continue;
        }
        // An aborted communicator is freed (abort_all sets aborted_ under mu_, held here, before it aborts).
        if (!failure.empty() || aborted_ || lane.comm == nullptr) continue;
        ncclResult_t async_err = ncclSuccess;
        {
          // Busy: the issuing thread is inside NCCL with these communicators; poll next round.
          std::unique_lock<std::mutex> nccl(nccl_mu_, std::try_to_lock);
          if (nccl.owns_lock()) ncclCommGetAsyncError(lane.comm, &async_err);
        }
        if (async_err != ncclSuccess && async_err != ncclInProgress) {
          failure = (lane.pending.empty() ? std::string("a collective") : lane.pending.front()->what) +
                    " failed in NCCL: " + ncclGetErrorString(async_err);
        } else if (!lane.pending.empty() && Clock::now() > lane.pending.front()->deadline) {
          failure = lane.pending.front()->what +
                    " did not complete within the timeout (--ddp_timeout); a peer rank is dead, stuck, or called the "
                    "collectives in a different order";
        }
      }
      lock.unlock();
      for (auto& d : done) d->release();  // deallocation outside the lock
      done.clear();
      if (!failure.empty()) {
        abort_all(failure);
        fail_from_watchdog(failure);
      }
      lock.lock();
    }
  }

  [[noreturn]] static void fail_from_watchdog(const std::string& msg) {
    std::cerr << "alpaca-train [rank " << launch_info().rank << "]: error: " << msg << std::endl;
    // MPI_Abort from this (non-main) thread is legal only under MPI_THREAD_MULTIPLE; otherwise the
    // exit status alone ends the job (mpirun/srun kill the other ranks of a job whose rank exits
    // non-zero without MPI_Finalize).
    if (mpi_active() && mpi_thread_multiple()) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  int device_;
  CommOptions options_;
  std::string name_;
  Lane lanes_[2];
  int rank_ = 0;
  int world_ = 1;
  uint64_t seq_ = 0;
  std::mutex mu_;
  // Held by the issuing thread around its NCCL calls on the lanes' communicators (a launch and its
  // settling, a split), and tried by the watchdog around ncclCommGetAsyncError: that call also
  // completes (joins) a finished nonblocking group job of the communicator, which two threads must
  // not do at once. Never taken while holding mu_ by the issuing thread; abort needs neither.
  std::mutex nccl_mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool aborted_ = false;
  std::string abort_reason_;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const CommOptions& options) {
  const LaunchInfo& li = launch_info();
  const int count = c10::cuda::device_count();
  ALPACA_CHECK(count > 0, "the nccl backend needs a CUDA GPU but none is visible to this process; check "
                          "CUDA_VISIBLE_DEVICES and the driver, or train on CPU");
  ALPACA_CHECK(li.local_rank < count,
               "local rank " << li.local_rank << " has no GPU: this node shows " << count
                             << " CUDA device(s) and runs " << li.local_world_size
                             << " ranks; start at most one rank per GPU (--nproc_per_node " << count
                             << ", or mpirun -npernode " << count << "), or fix CUDA_VISIBLE_DEVICES");
  ALPACA_CHECK(li.local_world_size <= count,
               li.local_world_size << " ranks on this node share " << count
                                   << " GPU(s); NCCL needs one GPU per rank (two ranks on one GPU hang); start at most "
                                   << count << " ranks per node");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(li.local_rank));
  static int next_id = 0;
  std::string key = "alpaca/nccl" + std::to_string(next_id++) + "/unique_id";
  ncclUniqueId id = exchange_unique_id(li.rank, key, options.timeout);
  ncclComm_t comm = nullptr;
  {
    const std::string what = "ncclCommInitRank (make_communicator: rank " + std::to_string(li.rank) + " of " +
                             std::to_string(li.world_size) + " on cuda:" + std::to_string(li.local_rank) + ")";
    WaitScope scope(what);
    ncclConfig_t config = nonblocking_config();
    ncclResult_t rc = ncclCommInitRankConfig(&comm, li.world_size, id, li.rank, &config);
    if (comm != nullptr) rc = settle(comm, rc, deadline_after(options.timeout));
    if (rc != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      fail_collective(creation_failure(what, rc, options.timeout));
    }
  }
  return std::make_shared<NcclCommunicator>(comm, li.local_rank, options, "world");
}

}  // namespace alpaca::dist::detail
