// The NCCL backend for CUDA tensors. Each communicator owns one communication stream (NCCL needs
// one issue order per communicator): a collective makes that stream wait on an event of the
// caller's current stream, enqueues the NCCL call, and records an end event; wait() makes the
// caller's current stream wait on it, so the host never blocks in the hot path. A watchdog thread
// polls the end events and ncclCommGetAsyncError: on an error or a collective older than the
// timeout it aborts the NCCL communicator and ends the process naming the collective (MPI_Abort
// under MPI; otherwise exit code 1, like PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING=1, because a
// watchdog thread cannot throw into the thread that is blocked on the aborted work).
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
#include <sstream>
#include <thread>
#include <unistd.h>

#include "alpaca/util/error.h"
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

class NcclCommunicator;

// A collective in flight: its end event on the communication stream and the tensors it uses.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> end, std::string what)
      : end_(std::move(end)), what_(std::move(what)) {}
  void wait() override {
    // Stream-ordered: the caller's current stream waits; the host does not.
    end_->block(c10::cuda::getCurrentCUDAStream(end_->device_index()));
  }

 private:
  std::shared_ptr<at::cuda::CUDAEvent> end_;
  std::string what_;
};

class NcclCommunicator final : public Communicator, public std::enable_shared_from_this<NcclCommunicator> {
 public:
  NcclCommunicator(ncclComm_t comm, int device, const CommOptions& options, std::string name)
      : comm_(comm),
        device_(device),
        options_(options),
        name_(std::move(name)),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, static_cast<c10::DeviceIndex>(device))) {
    ALPACA_NCCL_CHECK(ncclCommUserRank(comm_, &rank_), "nccl communicator " << name_);
    ALPACA_NCCL_CHECK(ncclCommCount(comm_, &world_), "nccl communicator " << name_);
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (!aborted_) {
      ncclCommFinalize(comm_);
      ncclCommDestroy(comm_);
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
    ALPACA_CHECK(out.is_contiguous() && in.is_contiguous(), op << ": out and in must be contiguous");
    ALPACA_CHECK(out.scalar_type() == in.scalar_type(), op << ": out is " << out.scalar_type() << " but in is "
                                                           << in.scalar_type());
    ALPACA_CHECK(out.numel() == in.numel() * world_, op << ": out has " << out.numel() << " elements, expected world "
                                                        << world_ << " x in " << in.numel());
    // In place (in == out + rank*n) is NCCL's own in-place form.
    return enqueue(label(op, in), {out, in}, [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in.scalar_type(), op), comm_, s);
    });
  }

  WorkHandle reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp r) override {
    const char* op = "reduce_scatter";
    check(out, op, "out");
    check(in, op, "in");
    ALPACA_CHECK(out.is_contiguous() && in.is_contiguous(), op << ": out and in must be contiguous");
    ALPACA_CHECK(out.scalar_type() == in.scalar_type(), op << ": out is " << out.scalar_type() << " but in is "
                                                           << in.scalar_type());
    ALPACA_CHECK(in.numel() == out.numel() * world_, op << ": in has " << in.numel() << " elements, expected world "
                                                        << world_ << " x out " << out.numel());
    return enqueue(label(op, in, r), {out, in}, [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in.scalar_type(), op),
                               nccl_op(r), comm_, s);
    });
  }

  WorkHandle all_reduce(at::Tensor t, ReduceOp r) override {
    const char* op = "all_reduce";
    check(t, op, "t");
    at::Tensor buf = t.contiguous();
    return enqueue(
        label(op, t, r), {t, buf},
        [&](cudaStream_t s) {
          return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_type(buf.scalar_type(), op),
                               nccl_op(r), comm_, s);
        },
        [&] {
          if (!buf.is_same(t)) t.copy_(buf);  // on the communication stream, after the reduction
        });
  }

  WorkHandle broadcast(at::Tensor t, int root) override {
    const char* op = "broadcast";
    check(t, op, "t");
    ALPACA_CHECK(root >= 0 && root < world_, op << ": root " << root << " is outside the " << world_ << " ranks");
    at::Tensor buf = t.contiguous();
    return enqueue(
        label(op, t) + " from rank " + std::to_string(root), {t, buf},
        [&](cudaStream_t s) {
          return ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(), nccl_type(buf.scalar_type(), op), root,
                               comm_, s);
        },
        [&] {
          if (!buf.is_same(t)) t.copy_(buf);
        });
  }

  WorkHandle barrier() override {
    // NCCL has no barrier: a one-element all-reduce orders every rank's stream the same way.
    at::Tensor one = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device()));
    return enqueue(label("barrier"), {one}, [&](cudaStream_t s) {
      return ncclAllReduce(one.data_ptr(), one.data_ptr(), 1, ncclFloat32, ncclSum, comm_, s);
    });
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    check_healthy("split");
    ncclComm_t sub = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ALPACA_NCCL_CHECK(ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &sub, &config),
                      "split(color " << color << ", key " << key << ") of nccl communicator " << name_);
    if (color < 0 || sub == nullptr) return nullptr;
    return std::make_shared<NcclCommunicator>(sub, device_, options_, name_ + "/split(" + std::to_string(color) + ")");
  }

 private:
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
  WorkHandle enqueue(const std::string& what, std::initializer_list<at::Tensor> tensors, Launch launch,
                     After after = [] {}) {
    check_healthy(what.c_str());
    c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_));
    auto compute = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_));
    // The inputs were produced on the caller's stream: the communication stream waits for them.
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(stream_);
    {
      c10::cuda::CUDAStreamGuard stream_guard(stream_);
      ALPACA_NCCL_CHECK(launch(stream_.stream()), what);
      after();
    }
    // The caching allocator must not hand these blocks to the caller's stream before we are done.
    for (const auto& t : tensors) t.record_stream(stream_);
    auto end = std::make_shared<at::cuda::CUDAEvent>();
    end->record(stream_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({end, what, deadline_after(options_.timeout)});
    }
    cv_.notify_all();
    return std::make_shared<NcclWork>(end, what);
  }

  // Polls pending collectives: completion, NCCL async errors, deadlines.
  void watch() {
    c10::cuda::CUDAGuard device_guard(static_cast<c10::DeviceIndex>(device_));
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      while (!pending_.empty() && pending_.front().end->query()) pending_.pop_front();
      ncclResult_t async_err = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async_err);
      std::string failure;
      if (async_err != ncclSuccess && async_err != ncclInProgress) {
        failure = (pending_.empty() ? std::string("a collective") : pending_.front().what) + " failed in NCCL: " +
                  ncclGetErrorString(async_err);
      } else if (!pending_.empty() && Clock::now() > pending_.front().deadline) {
        failure = pending_.front().what +
                  " did not complete within the timeout (--ddp_timeout); a peer rank is dead, stuck, or called the "
                  "collectives in a different order";
      }
      if (!failure.empty()) {
        aborted_ = true;
        abort_reason_ = failure;
        lock.unlock();
        ncclCommAbort(comm_);
        fail_from_watchdog(failure);
      }
    }
  }

  [[noreturn]] static void fail_from_watchdog(const std::string& msg) {
    std::cerr << "alpaca-train [rank " << launch_info().rank << "]: error: " << msg << std::endl;
    if (mpi_active()) MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }

  struct Pending {
    std::shared_ptr<at::cuda::CUDAEvent> end;
    std::string what;
    Clock::time_point deadline;
  };

  ncclComm_t comm_;
  int device_;
  CommOptions options_;
  std::string name_;
  c10::cuda::CUDAStream stream_;
  int rank_ = 0;
  int world_ = 1;
  uint64_t seq_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> pending_;
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
    WaitScope scope("ncclCommInitRank (make_communicator)");
    ALPACA_NCCL_CHECK(ncclCommInitRank(&comm, li.world_size, id, li.rank),
                      "make_communicator(nccl) on cuda:" << li.local_rank);
  }
  return std::make_shared<NcclCommunicator>(comm, li.local_rank, options, "world");
}

}  // namespace alpaca::dist::detail
