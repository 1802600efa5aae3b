// The store backend for CPU tensors under torchrun-style launches (no MPI launcher): each
// collective publishes this rank's bytes under "<prefix>/<seq>/<rank>..." keys of LibTorch's
// c10d::TCPStore and reads the peers' keys. Every rank reduces the same inputs in rank order, so
// results are identical across ranks. Simple and bounded, not fast: all traffic goes through
// rank 0's store (see runtime.h).
#include <torch/csrc/distributed/c10d/Store.hpp>  // defines: c10d::Store

#include <algorithm>
#include <cstring>
#include <optional>
#include <mutex>
#include <sstream>
#include <vector>

#include "alpaca/util/error.h"
#include "runtime_internal.h"

namespace alpaca::dist::detail {
namespace {

using Bytes = std::vector<uint8_t>;

// TCPStore (libuv server) refuses values over 8 MiB: larger payloads travel as numbered parts.
constexpr size_t kPartBytes = size_t{4} << 20;
size_t num_parts(size_t bytes) { return std::max<size_t>(1, (bytes + kPartBytes - 1) / kPartBytes); }

Bytes to_bytes(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return Bytes(p, p + c.nbytes());
}

void from_bytes(const Bytes& b, at::Tensor dst, const std::string& what) {
  ALPACA_CHECK(static_cast<int64_t>(b.size()) == static_cast<int64_t>(dst.nbytes()),
               what << ": a peer sent " << b.size() << " bytes where " << dst.nbytes()
                    << " were expected; every rank must pass tensors of the same size and dtype");
  if (!b.empty()) std::memcpy(dst.data_ptr(), b.data(), b.size());  // an empty tensor has no buffer
}

class DoneWork final : public Work {
 public:
  void wait() override {}
};

bool is_16bit_float(at::ScalarType st) { return st == at::kBFloat16 || st == at::kHalf; }

class StoreCommunicator final : public Communicator {
 public:
  StoreCommunicator(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int world,
                    const CommOptions& options)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), world_(world), options_(options) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  at::Device device() const override { return at::Device(at::kCPU); }
  std::string backend() const override { return "store"; }

  WorkHandle all_gather_into(at::Tensor out, const at::Tensor& in) override {
    const char* op = "all_gather_into";
    check(out, in, op);
    ALPACA_CHECK(out.is_contiguous(), op << ": out must be contiguous");
    ALPACA_CHECK(out.numel() == in.numel() * world_, op << ": out has " << out.numel() << " elements, expected world "
                                                        << world_ << " x in " << in.numel());
    std::lock_guard<std::mutex> lock(mu_);
    std::string what = label(op, in);
    run(what, [&](uint64_t seq) {
      publish({key(seq, rank_)}, {to_bytes(in)}, what);  // copied before out's slot may be written (in place)
      for (int r = 0; r < world_; ++r)
        from_bytes(fetch(key(seq, r), what, in.nbytes()), out.view(-1).narrow(0, r * in.numel(), in.numel()), what);
    });
    return std::make_shared<DoneWork>();
  }

  WorkHandle reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp op_kind) override {
    const char* op = "reduce_scatter";
    check(out, in, op);
    ALPACA_CHECK(in.numel() == out.numel() * world_, op << ": in has " << in.numel() << " elements, expected world "
                                                        << world_ << " x out " << out.numel());
    std::lock_guard<std::mutex> lock(mu_);
    std::string what = label(op, in, op_kind);
    const int64_t n = out.numel();
    run(what, [&](uint64_t seq) {
      at::Tensor flat = in.contiguous().view(-1);
      std::vector<std::string> keys;
      std::vector<Bytes> values;
      for (int dst = 0; dst < world_; ++dst) {
        keys.push_back(key(seq, rank_) + "/" + std::to_string(dst));
        values.push_back(to_bytes(flat.narrow(0, dst * n, n)));
      }
      publish(keys, values, what);
      std::vector<at::Tensor> parts;
      for (int src = 0; src < world_; ++src) {
        at::Tensor part = at::empty({n}, in.options());
        from_bytes(fetch(key(seq, src) + "/" + std::to_string(rank_), what, part.nbytes()), part, what);
        parts.push_back(part);
      }
      out.view(-1).copy_(reduce(parts, op_kind));
    });
    return std::make_shared<DoneWork>();
  }

  WorkHandle all_reduce(at::Tensor t, ReduceOp op_kind) override {
    const char* op = "all_reduce";
    check(t, t, op);
    std::lock_guard<std::mutex> lock(mu_);
    std::string what = label(op, t, op_kind);
    run(what, [&](uint64_t seq) {
      publish({key(seq, rank_)}, {to_bytes(t)}, what);
      std::vector<at::Tensor> parts;
      for (int src = 0; src < world_; ++src) {
        at::Tensor part = at::empty({t.numel()}, t.options());
        from_bytes(fetch(key(seq, src), what, part.nbytes()), part, what);
        parts.push_back(part);
      }
      t.copy_(reduce(parts, op_kind).view(t.sizes()));
    });
    return std::make_shared<DoneWork>();
  }

  WorkHandle broadcast(at::Tensor t, int root) override {
    const char* op = "broadcast";
    check(t, t, op);
    ALPACA_CHECK(root >= 0 && root < world_, op << ": root " << root << " is outside the " << world_ << " ranks");
    std::lock_guard<std::mutex> lock(mu_);
    std::string what = label(op, t) + " from rank " + std::to_string(root);
    run(what, [&](uint64_t seq) {
      // Every rank publishes (non-roots an empty marker) so that reaching `seq` is visible.
      publish({key(seq, rank_)}, {rank_ == root ? to_bytes(t) : Bytes{}}, what);
      Bytes b = fetch(key(seq, root), what, t.nbytes());
      if (rank_ != root) {
        at::Tensor buf = at::empty({t.numel()}, t.options());
        from_bytes(b, buf, what);
        t.copy_(buf.view(t.sizes()));
      }
      wait_all(seq, what);
    });
    return std::make_shared<DoneWork>();
  }

  WorkHandle barrier() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string what = label("barrier");
    run(what, [&](uint64_t seq) {
      publish({key(seq, rank_)}, {Bytes{}}, what);
      wait_all(seq, what);
    });
    return std::make_shared<DoneWork>();
  }

  std::shared_ptr<Communicator> split(int color, int key_arg) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string what = label("split");
    std::vector<std::pair<int, int>> members;  // (key, old rank) of ranks sharing my color
    uint64_t split_seq = 0;
    run(what, [&](uint64_t seq) {
      split_seq = seq;
      std::string mine = std::to_string(color) + " " + std::to_string(key_arg);
      publish({key(seq, rank_)}, {Bytes(mine.begin(), mine.end())}, what);
      for (int r = 0; r < world_; ++r) {
        Bytes b = fetch(key(seq, r), what);
        std::istringstream is(std::string(b.begin(), b.end()));
        int c = 0, k = 0;
        is >> c >> k;
        if (color >= 0 && c == color) members.emplace_back(k, r);
      }
    });
    if (color < 0) return nullptr;
    std::sort(members.begin(), members.end());
    int new_rank = 0;
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].second == rank_) new_rank = static_cast<int>(i);
    std::string prefix = prefix_ + "/s" + std::to_string(split_seq) + "c" + std::to_string(color);
    return std::make_shared<StoreCommunicator>(store_, prefix, new_rank, static_cast<int>(members.size()), options_);
  }

 private:
  void check(const at::Tensor& out, const at::Tensor& in, const char* op) const {
    ALPACA_CHECK(out.defined() && in.defined() && out.device().is_cpu() && in.device().is_cpu(),
                 op << ": the store backend takes CPU tensors");
    ALPACA_CHECK(out.scalar_type() == in.scalar_type(), op << ": out is " << out.scalar_type() << " but in is "
                                                           << in.scalar_type());
  }

  // Sums or maxes the ranks' parts in rank order; 16-bit floats accumulate in fp32.
  at::Tensor reduce(const std::vector<at::Tensor>& parts, ReduceOp op) const {
    const bool widen = is_16bit_float(parts[0].scalar_type());
    at::Tensor acc = widen ? parts[0].to(at::kFloat) : parts[0].clone();
    for (size_t i = 1; i < parts.size(); ++i) {
      at::Tensor p = widen ? parts[i].to(at::kFloat) : parts[i];
      if (op == ReduceOp::kMax) {
        acc = at::maximum(acc, p);
      } else {
        acc.add_(p);
      }
    }
    if (op == ReduceOp::kAvg) {
      if (at::isFloatingType(acc.scalar_type())) {
        acc.div_(world_);
      } else {
        acc.div_(world_, "trunc");
      }
    }
    return acc.to(parts[0].scalar_type());
  }

  std::string label(const char* op, const at::Tensor& t = {}, std::optional<ReduceOp> r = std::nullopt) {
    std::ostringstream os;
    os << op << " #" << (seq_ + 1);
    if (t.defined()) os << " (" << describe(t) << (r ? std::string(", ") + to_string(*r) : std::string()) << ")";
    os << " on store communicator " << prefix_ << " (rank " << rank_ << " of " << world_ << ")";
    return os.str();
  }

  std::string key(uint64_t seq, int r) const { return prefix_ + "/" + std::to_string(seq) + "/" + std::to_string(r); }

  // Runs one collective: bounded by the timeout, and after it drops this rank's keys of the
  // previous collective (every rank has read them: each published `seq` only after finishing it).
  template <class F>
  void run(const std::string& what, F body) {
    const uint64_t seq = ++seq_;
    deadline_ = deadline_after(options_.timeout);
    WaitScope scope(what);
    try {
      body(seq);
      for (const auto& k : prev_keys_) store_->deleteKey(k);
    } catch (const alpaca::Error&) {
      throw;
    } catch (const std::exception& e) {
      fail_collective(what + " failed: " + short_what(e) +
                      " (a peer rank is dead, stuck, or called the collectives in a different order; --ddp_timeout "
                      "bounds the wait)");
    }
    prev_keys_ = std::move(cur_keys_);
    cur_keys_.clear();
  }

  void publish(const std::vector<std::string>& keys, const std::vector<Bytes>& values, const std::string& what) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const Bytes& v = values[i];
      for (size_t p = 0, n = num_parts(v.size()); p < n; ++p) {
        const size_t begin = p * kPartBytes, end = std::min(v.size(), begin + kPartBytes);
        const std::string part_key = keys[i] + "#" + std::to_string(p);
        store_->set(part_key, Bytes(v.begin() + begin, v.begin() + end));
        cur_keys_.push_back(part_key);
      }
    }
  }

  std::chrono::milliseconds remaining() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - std::chrono::steady_clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  // Reads a value of `bytes` bytes (its part count follows from the size; small values: 1 part).
  Bytes fetch(const std::string& k, const std::string& what, size_t bytes = 0) {
    Bytes out;
    for (size_t p = 0, n = num_parts(bytes); p < n; ++p) {
      const std::string part_key = k + "#" + std::to_string(p);
      store_->wait({part_key}, remaining());
      Bytes part = store_->get(part_key);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  void wait_all(uint64_t seq, const std::string& what) {
    std::vector<std::string> keys;
    for (int r = 0; r < world_; ++r) keys.push_back(key(seq, r) + "#0");
    store_->wait(keys, remaining());
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_;
  int world_;
  CommOptions options_;
  std::mutex mu_;
  uint64_t seq_ = 0;
  std::chrono::steady_clock::time_point deadline_;
  std::vector<std::string> prev_keys_, cur_keys_;
};

}  // namespace

std::shared_ptr<Communicator> make_store_communicator(const CommOptions& options) {
  const LaunchInfo& li = launch_info();
  auto store = torchrun_store(options.timeout);
  // Communicators are made collectively and in the same order on every rank, so a process-wide
  // counter gives every rank the same key prefix.
  static int next_id = 0;
  std::string prefix = "alpaca/comm" + std::to_string(next_id++);
  return std::make_shared<StoreCommunicator>(store, prefix, li.rank, li.world_size, options);
}

}  // namespace alpaca::dist::detail
