// The MPI backend for CPU tensors: nonblocking MPI collectives (MPI_I*) whose handles are waited
// by polling MPI_Test against the communicator's deadline. Open MPI's nonblocking collectives
// advance only inside MPI calls, so under MPI_THREAD_MULTIPLE a progress thread tests pending
// requests every ~100 us: a prefetched all-gather moves while the caller computes. 16-bit floats travel as raw words in
// gathers and broadcasts, and are reduced in fp32 (convert, reduce, convert back) so every rank
// gets the correctly rounded result of an fp32 sum.
#include "mpi_include.h"

#include <climits>
#include <condition_variable>
#include <functional>
#include <iostream>
#include <optional>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "alpaca/model/fused_ops.h"
#include "alpaca/util/error.h"
#include "cpu_collective.h"
#include "runtime_internal.h"

namespace alpaca::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, buf, &len);
  return std::string(buf, len);
}

#define ALPACA_MPI_CHECK(call, what)                                                              \
  do {                                                                                            \
    int alpaca_mpi_rc_ = (call);                                                                  \
    ALPACA_CHECK(alpaca_mpi_rc_ == MPI_SUCCESS, what << ": " #call " failed: "                    \
                                                     << mpi_error_string(alpaca_mpi_rc_));        \
  } while (0)

// The type of raw element words, for moves that do no arithmetic (gather, broadcast).
MPI_Datatype raw_type(const at::Tensor& t) {
  switch (t.element_size()) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    case 8: return MPI_UINT64_T;
  }
  ALPACA_FAIL("tensor of " << describe(t) << " has element size " << t.element_size() << ", which MPI cannot move");
}

// The arithmetic type for reductions; 16-bit floats are reduced as fp32 by the caller.
MPI_Datatype reduce_type(at::ScalarType st) {
  switch (st) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    default: break;
  }
  ALPACA_FAIL("MPI reductions support Float, Double, Long, Int, BFloat16 and Half tensors, not " << st);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM; }

int checked_count(int64_t n, const char* op) {
  ALPACA_CHECK(n <= INT_MAX, op << ": " << n << " elements exceed MPI's int count limit; split the tensor");
  return static_cast<int>(n);
}

// One nonblocking MPI operation: a collective's request, or the steps of a ring (the requests of
// the current step, and `step`, which is run once they all completed and may issue the next
// step's requests: true while it did).
class MpiWork final : public Work {
 public:
  using Step = std::function<bool(std::vector<MPI_Request>&)>;

  MpiWork(std::vector<MPI_Request> reqs, Step step, std::string what, Clock::time_point deadline,
          std::function<void()> finish)
      : reqs_(std::move(reqs)), step_(std::move(step)), what_(std::move(what)), deadline_(deadline),
        finish_(std::move(finish)) {}

  ~MpiWork() override {
    if (!done_) complete_unwaited(*this, what_);
  }

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    check_mpi_thread(what_.c_str());
    WaitScope scope(what_);
    // Open MPI's nonblocking collectives advance only inside MPI calls, so poll MPI_Test
    // continuously (yielding the core to other ranks on oversubscribed hosts) for the first
    // second; after that the peer is evidently late: back off to sleeps so a long wait does not
    // burn a core the other ranks need.
    const auto spin_until = Clock::now() + std::chrono::seconds(1);
    auto sleep = std::chrono::microseconds(50);
    while (!test_locked()) {
      const auto now = Clock::now();
      if (now > deadline_) {
        fail_collective(what_ + " did not complete within the timeout (--ddp_timeout); a peer rank is dead, stuck, or "
                                "called the collectives in a different order");
      }
      if (now < spin_until) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
      }
    }
  }

 private:
  friend class ProgressEngine;

  // For the progress thread: advances the operation if nobody else holds it; true once finished
  // (or failed: the failure is kept for the waiter, who reports it).
  bool progress() {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (done_ || !error_.empty()) return true;
    return advance_locked() || !error_.empty();
  }

  bool test_locked() {
    if (error_.empty()) advance_locked();
    if (!error_.empty()) fail_collective(error_);
    return done_;
  }

  // Tests the current requests; once they all completed, runs the next step or finishes. True
  // once finished; a failure is left in error_.
  bool advance_locked() {
    for (;;) {
      int flag = 0;
      int rc = MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) {
        error_ = what_ + " failed in MPI: " + mpi_error_string(rc);
        return false;
      }
      if (!flag) return false;
      reqs_.clear();
      try {
        if (step_ && step_(reqs_)) continue;  // the next step's requests: test them at once
        complete_locked();
      } catch (const std::exception& e) {
        error_ = what_ + " failed to finish: " + e.what();
        return false;
      }
      return true;
    }
  }

  void complete_locked() {
    done_ = true;
    step_ = nullptr;
    if (finish_) finish_();
    finish_ = nullptr;  // releases the buffers it held
  }

  std::mutex mu_;
  std::vector<MPI_Request> reqs_;
  Step step_;
  std::string what_;
  Clock::time_point deadline_;
  std::function<void()> finish_;
  bool done_ = false;
  std::string error_;  // set by the progress thread, reported by the waiter
};

// A reduce-scatter as a ring of point-to-point messages (world - 1 steps): at step s a rank sends
// its running sum of block (rank - s - 1) to the next rank and receives the previous rank's
// running sum of block (rank - s - 2), to which it adds its own. After the last step `acc` holds
// this rank's block, reduced over every rank. Each rank holds two blocks of scratch (acc, recv).
// Open MPI's MPI_Ireduce_scatter_block (coll/libnbc) instead reduces the whole input to rank 0
// and scatters from there: every rank allocates twice the whole input as scratch and rank 0
// touches all of it, so rank 0's resident memory grows by twice the largest gradient a unit
// reduces (bench/mpi_reduce_scatter_rss.c), and rank 0 carries (world - 1) x the others' traffic.
//
// bf16 sums and averages (FSDP's gradients) take the fused form: step 0 sends the rank's own block
// as it is (bf16 words: exact, half the bytes of its fp32 upcast), later steps the fp32 running sum;
// each fold is one pass (model::ring_fold: upcast and add, the bits of copy_ then add_), and the last
// one writes `out` directly, divided and rounded once (finish_avg's div_ then copy_: the same bits).
// At world 2 that is one message of 2n bytes and one pass, where the general form moves 4n bytes and
// makes four passes (upcast, upcast, add, round) over fp32 scratch. ALPACA_CPU_FUSED=0 turns it off; like
// every setting that changes a collective's wire format it must be the same on every rank (mpirun and our
// launcher pass one environment to all).
struct RingReduceScatter {
  at::Tensor in;   // world blocks of n elements, the caller's dtype
  at::Tensor acc;  // n elements in the reduction dtype (fp32 for 16-bit floats)
  at::Tensor recv;
  ReduceOp op;
  MPI_Comm comm;
  MPI_Datatype type;
  int rank, world, tag, n;
  int step = 0;
  // The fused bf16 form: `out` written by the last fold; step 0's message in recv16.
  bool fused = false;
  at::Tensor out, recv16;

  at::Tensor block(int b) const { return in.narrow(0, static_cast<int64_t>(((b % world) + world) % world) * n, n); }

  void issue(std::vector<MPI_Request>& reqs, const at::Tensor& send, const at::Tensor& into, MPI_Datatype wire) {
    reqs.resize(2);
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    ALPACA_MPI_CHECK(MPI_Irecv(into.data_ptr(), n, wire, prev, tag, comm, &reqs[0]), "reduce_scatter ring receive");
    ALPACA_MPI_CHECK(MPI_Isend(send.data_ptr(), n, wire, next, tag, comm, &reqs[1]), "reduce_scatter ring send");
  }

  // Step 0: this rank's own block (rank - 1), as is when it already is in the reduction dtype (or,
  // fused, as its bf16 words).
  void start(std::vector<MPI_Request>& reqs) {
    at::Tensor first = block(rank - 1);
    if (fused) return issue(reqs, first, recv16, MPI_UINT16_T);
    if (first.scalar_type() != acc.scalar_type()) first = acc.copy_(first);
    issue(reqs, first, recv, type);
  }

  // Step `step` completed: fold the received running sum into this rank's block; send it on.
  bool operator()(std::vector<MPI_Request>& reqs) {
    if (fused) return fold_fused(reqs);
    acc.copy_(block(rank - step - 2));
    if (op == ReduceOp::kMax) {
      at::maximum_out(acc, acc, recv);
    } else {
      acc.add_(recv);
    }
    if (++step == world - 1) return false;
    issue(reqs, acc, recv, type);
    return true;
  }

  bool fold_fused(std::vector<MPI_Request>& reqs) {
    const at::Tensor own = block(rank - step - 2);
    const auto* a = own.const_data_ptr<at::BFloat16>();
    const bool last = step + 1 == world - 1;
    if (last) {
      const float div = op == ReduceOp::kAvg ? static_cast<float>(world) : 1.0f;
      auto* d = out.mutable_data_ptr<at::BFloat16>();
      if (step == 0) {
        model::ring_fold::sum_round(d, a, recv16.const_data_ptr<at::BFloat16>(), div, n);
      } else {
        model::ring_fold::sum_round(d, a, recv.const_data_ptr<float>(), div, n);
      }
      ++step;
      return false;
    }
    if (step == 0) {
      model::ring_fold::sum(acc.mutable_data_ptr<float>(), a, recv16.const_data_ptr<at::BFloat16>(), n);
      recv16 = at::Tensor();  // step 0's only
    } else {
      model::ring_fold::sum(acc.mutable_data_ptr<float>(), a, recv.const_data_ptr<float>(), n);
    }
    ++step;
    issue(reqs, acc, recv, MPI_FLOAT);
    return true;
  }
};

// The process's progress thread (MPI_THREAD_MULTIPLE only). Started with the first collective,
// stopped by dist::finalize() before MPI_Finalize (and at static destruction).
class ProgressEngine {
 public:
  static ProgressEngine& get() {
    static ProgressEngine engine;
    return engine;
  }
  ~ProgressEngine() { stop(); }

  void add(const std::shared_ptr<MpiWork>& work) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    works_.push_back(work);
    cv_.notify_one();
  }

  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::vector<std::weak_ptr<MpiWork>> batch;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopped_ || !works_.empty(); });
        if (stopped_) return;
        batch.swap(works_);
      }
      std::vector<std::weak_ptr<MpiWork>> still;
      for (auto& weak : batch) {
        auto work = weak.lock();
        if (work && !work->progress()) still.push_back(weak);
      }
      batch.clear();
      {
        std::lock_guard<std::mutex> lock(mu_);
        works_.insert(works_.end(), still.begin(), still.end());
      }
      if (!still.empty()) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::weak_ptr<MpiWork>> works_;
  bool stopped_ = false;
  std::thread thread_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned, const CommOptions& options, std::string name)
      : comm_(comm), owned_(owned), options_(options), name_(std::move(name)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &world_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }

  ~MpiCommunicator() override {
    if (owned_ && mpi_active()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  at::Device device() const override { return at::Device(at::kCPU); }
  std::string backend() const override { return "mpi"; }

  WorkHandle all_gather_into(at::Tensor out, const at::Tensor& in) override {
    const char* op = "all_gather_into";
    check_cpu_tensor(out, "mpi", op, "out");
    check_cpu_tensor(in, "mpi", op, "in");
    check_flat_buffers(out, in, world_, op, /*out_is_whole=*/true);
    std::string what = label(op, in);
    const int n = checked_count(in.numel(), op);
    const int64_t bytes = in.nbytes();
    char* out_base = static_cast<char*>(out.data_ptr());
    const char* in_ptr = static_cast<const char*>(in.data_ptr());
    // In place when `in` already is this rank's slot of `out` (FSDP's gather of its own shard).
    const bool in_place = in_ptr == out_base + rank_ * bytes;
    ALPACA_CHECK(in_place || in_ptr + bytes <= out_base || in_ptr >= out_base + out.nbytes(),
                 op << ": in overlaps out but is not this rank's slot of it");
    MPI_Request req;
    check_mpi_thread(op);
    ALPACA_MPI_CHECK(MPI_Iallgather(in_place ? MPI_IN_PLACE : in_ptr, n, raw_type(in), out_base, n, raw_type(out),
                                    comm_, &req),
                     what);
    return make_work(req, what, [out, in] {});
  }

  WorkHandle reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp op_kind) override {
    const char* op = "reduce_scatter";
    check_cpu_tensor(out, "mpi", op, "out");
    check_cpu_tensor(in, "mpi", op, "in");
    check_flat_buffers(out, in, world_, op, /*out_is_whole=*/false);
    std::string what = label(op, in, op_kind);
    const int n = checked_count(out.numel(), op);
    // A ring of point-to-point steps (RingReduceScatter), reduced in fp32 for 16-bit floats. The
    // result lands in `out` only at the end, so out may be a block of in (FSDP's in-place case).
    const at::ScalarType acc_type = is_16bit_float(in) ? at::kFloat : in.scalar_type();
    auto ring = std::make_shared<RingReduceScatter>();
    ring->in = in.view(-1);
    ring->fused = world_ > 1 && op_kind != ReduceOp::kMax && model::fused_cpu_bf16_applies(in);
    // The fused form at world 2 needs no fp32 scratch at all: one bf16 message, one fold into out.
    if (!ring->fused || world_ > 2) ring->acc = at::empty({out.numel()}, in.options().dtype(acc_type));
    if (ring->fused) {
      ring->out = out.view(-1);
      ring->recv16 = at::empty({out.numel()}, in.options());
    }
    ring->op = op_kind;
    ring->comm = comm_;
    ring->type = reduce_type(acc_type);
    ring->rank = rank_;
    ring->world = world_;
    ring->tag = static_cast<int>(seq_ % 32767);  // MPI guarantees tags up to 32767; one per operation in flight
    ring->n = n;
    std::vector<MPI_Request> reqs;
    if (world_ > 1) {
      if (ring->acc.defined()) ring->recv = at::empty_like(ring->acc);
      check_mpi_thread(op);
      ring->start(reqs);
    } else {
      ring->acc.copy_(ring->in);
    }
    const int world = world_;
    auto step = [ring](std::vector<MPI_Request>& next) { return (*ring)(next); };
    return make_work(std::move(reqs), world_ > 1 ? MpiWork::Step(step) : nullptr, what,
                     [out, ring, op_kind, world]() mutable {
                       if (ring->fused) return;  // the last fold wrote out
                       if (op_kind == ReduceOp::kAvg) finish_avg(ring->acc, world);
                       out.view(-1).copy_(ring->acc);
                     });
  }

  WorkHandle all_reduce(at::Tensor t, ReduceOp op_kind) override {
    const char* op = "all_reduce";
    check_cpu_tensor(t, "mpi", op, "t");
    std::string what = label(op, t, op_kind);
    const int n = checked_count(t.numel(), op);
    at::Tensor buf = is_16bit_float(t) ? t.to(at::kFloat).contiguous() : t.contiguous();
    MPI_Request req;
    check_mpi_thread(op);
    ALPACA_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), n, reduce_type(buf.scalar_type()), mpi_op(op_kind),
                                    comm_, &req),
                     what);
    const int world = world_;
    return make_work(req, what, [t, buf, op_kind, world]() mutable {
      if (op_kind == ReduceOp::kAvg) finish_avg(buf, world);
      if (!buf.is_same(t)) t.copy_(buf);
    });
  }

  WorkHandle broadcast(at::Tensor t, int root) override {
    const char* op = "broadcast";
    check_cpu_tensor(t, "mpi", op, "t");
    ALPACA_CHECK(root >= 0 && root < world_, op << ": root " << root << " is outside the " << world_ << " ranks");
    std::string what = label(op, t) + " from rank " + std::to_string(root);
    const int n = checked_count(t.numel(), op);
    at::Tensor buf = t.contiguous();
    MPI_Request req;
    check_mpi_thread(op);
    ALPACA_MPI_CHECK(MPI_Ibcast(buf.data_ptr(), n, raw_type(buf), root, comm_, &req), what);
    return make_work(req, what, [t, buf]() mutable {
      if (!buf.is_same(t)) t.copy_(buf);
    });
  }

  WorkHandle barrier() override {
    std::string what = label("barrier");
    MPI_Request req;
    check_mpi_thread("barrier");
    ALPACA_MPI_CHECK(MPI_Ibarrier(comm_, &req), what);
    return make_work(req, what, nullptr);
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    // MPI_Comm_split itself cannot be bounded; a bounded barrier first makes sure every rank
    // arrived, so a dead peer is caught by the timeout rather than hanging here.
    barrier()->wait();
    MPI_Comm sub = MPI_COMM_NULL;
    check_mpi_thread("split");
    ALPACA_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub),
                     "split(color " << color << ", key " << key << ") of " << name_);
    if (sub == MPI_COMM_NULL) return nullptr;
    std::ostringstream os;
    os << name_ << "/split(" << color << ")";
    return std::make_shared<MpiCommunicator>(sub, true, options_, os.str());
  }

 private:
  std::string label(const char* op, const at::Tensor& t = {}, std::optional<ReduceOp> r = std::nullopt) {
    std::ostringstream os;
    os << op << " #" << ++seq_;
    if (t.defined() || r) {
      os << " (";
      if (t.defined()) os << describe(t);
      if (r) os << (t.defined() ? ", " : "") << to_string(*r);
      os << ")";
    }
    os << " on mpi communicator " << name_ << " (rank " << rank_ << " of " << world_ << ")";
    return os.str();
  }

  WorkHandle make_work(MPI_Request req, const std::string& what, std::function<void()> finish) {
    return make_work({req}, nullptr, what, std::move(finish));
  }

  WorkHandle make_work(std::vector<MPI_Request> reqs, MpiWork::Step step, const std::string& what,
                       std::function<void()> finish) {
    auto work = std::make_shared<MpiWork>(std::move(reqs), std::move(step), what, deadline_after(options_.timeout),
                                          std::move(finish));
    if (mpi_progress_thread()) ProgressEngine::get().add(work);
    return work;
  }

  MPI_Comm comm_;
  bool owned_;
  CommOptions options_;
  std::string name_;
  int rank_ = 0;
  int world_ = 1;
  uint64_t seq_ = 0;
};

}  // namespace

void stop_mpi_progress() { ProgressEngine::get().stop(); }

std::shared_ptr<Communicator> make_mpi_communicator(const CommOptions& options) {
  // A duplicate of MPI_COMM_WORLD, so our collectives never match anyone else's traffic.
  MPI_Comm dup = MPI_COMM_NULL;
  ALPACA_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &dup), "make_communicator(mpi)");
  return std::make_shared<MpiCommunicator>(dup, true, options, "world");
}

}  // namespace alpaca::dist::detail
