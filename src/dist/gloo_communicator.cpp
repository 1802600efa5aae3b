// The gloo backend for CPU tensors under torchrun-style launches (our launcher, torchrun,
// PyTorchJob, TrainJob): LibTorch's own c10d::ProcessGroupGloo, the engine PyTorch uses on CPU,
// built into libtorch_cpu.so. Ranks talk directly over TCP (ring / halving-doubling); the
// rendezvous goes through rank 0's c10d::TCPStore, which carries no tensor bytes.
// Semantics match the mpi backend: 16-bit floats are reduced in fp32 (convert, reduce, round
// once), avg is a sum divided by the world size (integers truncate), and every wait is bounded by
// --ddp_timeout with an error naming the collective.
// The network interface: GLOO_SOCKET_IFNAME (as in PyTorch; a comma list gives several devices),
// else the address this host uses to reach MASTER_ADDR (loopback for a single-node job).
#ifndef USE_C10D_GLOO  // the torch target defines it; ProcessGroupGloo.hpp declares the class only under it
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>       // defines: c10d::PrefixStore
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>  // defines: c10d::ProcessGroupGloo

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "alpaca/util/error.h"
#include "cpu_collective.h"
#include "runtime_internal.h"
#include "shm_group.h"

namespace alpaca::dist::detail {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPeerLossGrace = std::chrono::seconds(1);
using GlooPtr = c10::intrusive_ptr<c10d::ProcessGroupGloo>;

// LibTorch renamed the one-tensor collectives (_allgather_base, _reduce_scatter_base became
// all_gather_single, reduce_scatter_single); the trainer builds against the pinned wheel, the GPU
// check against whatever torch the GPU machine has. Same arguments, same behaviour.
template <typename PG>
c10::intrusive_ptr<c10d::Work> all_gather_single(PG& pg, at::Tensor& out, at::Tensor& in) {
  if constexpr (requires { pg.all_gather_single(out, in); }) {
    return pg.all_gather_single(out, in);
  } else {
    return pg._allgather_base(out, in);
  }
}
template <typename PG>
c10::intrusive_ptr<c10d::Work> reduce_scatter_single(PG& pg, at::Tensor& out, at::Tensor& in,
                                                     const c10d::ReduceScatterOptions& opts) {
  if constexpr (requires { pg.reduce_scatter_single(out, in, opts); }) {
    return pg.reduce_scatter_single(out, in, opts);
  } else {
    return pg._reduce_scatter_base(out, in, opts);
  }
}

// The local address the kernel would use to reach `host` (a UDP connect sends nothing): in a
// network namespace or on a multi-homed node that is the interface facing the master.
std::string address_towards(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port > 0 ? port : 9).c_str(), &hints, &res);
  ALPACA_CHECK(rc == 0 && res, "gloo: cannot resolve MASTER_ADDR '" << host << "': " << ::gai_strerror(rc)
                                                                     << "; set MASTER_ADDR to rank 0's host");
  std::string out;
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
    char buf[INET_ADDRSTRLEN] = {};
    if (::inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf)) out = buf;
  }
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(res);
  ALPACA_CHECK(!out.empty(), "gloo: no route from this host to MASTER_ADDR " << host
                                                                               << "; set GLOO_SOCKET_IFNAME to the interface to use");
  return out;
}

struct Devices {
  std::vector<std::shared_ptr<::gloo::transport::Device>> devices;
  std::string where;  // "node 1 of 2 at 10.231.0.2" for error messages
};

Devices make_devices(const LaunchInfo& li) {
  Devices out;
  auto& devices = out.devices;
  const std::string node = "node " + std::to_string(li.node_rank) + " of " + std::to_string(li.num_nodes);
  const char* ifnames = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifnames && *ifnames) {
    out.where = node + " on " + ifnames;
    std::stringstream ss(ifnames);
    for (std::string name; std::getline(ss, name, ',');) {
      try {
        devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(name));
      } catch (const std::exception& e) {
        ALPACA_FAIL("gloo: cannot use interface '" << name << "' from GLOO_SOCKET_IFNAME=" << ifnames << " ("
                                                   << short_what(e) << "); name an interface of this host (ip link)");
      }
    }
    return out;
  }
  const std::string addr = li.world_size == 1 || li.master_addr.empty() ? std::string("127.0.0.1")
                                                                         : address_towards(li.master_addr, li.master_port);
  try {
    devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(addr));
  } catch (const std::exception& e) {
    ALPACA_FAIL("gloo: cannot bind to " << addr << " (the address facing MASTER_ADDR " << li.master_addr << "): "
                                        << short_what(e) << "; set GLOO_SOCKET_IFNAME to the interface to use");
  }
  out.where = node + " at " + addr;
  return out;
}

// A collective that failed: linger a moment, then end it naming the collective.
[[noreturn]] void fail_work(const std::string& what, const std::exception& e, Clock::time_point deadline) {
  // A peer's death reaches gloo within microseconds (its sockets close; shared memory polls its
  // pid). Linger a moment, still "waiting in" the collective, so the launcher sees the rank that
  // failed first and stops this one (the message then says where it waited) instead of blaming
  // the survivors. A timeout has no such first failure to wait for.
  if (Clock::now() + kPeerLossGrace < deadline) std::this_thread::sleep_for(kPeerLossGrace);
  fail_collective(what + " failed: " + short_what(e) +
                  " (a peer rank is dead, stuck, unreachable, or called the collectives in a different order; "
                  "--ddp_timeout bounds the wait)");
}

// One collective in flight, over gloo's c10d work or on the shared-memory worker: `block` waits
// for it (bounded by the deadline), `finish` runs after it (copy an fp32 result back into a
// 16-bit tensor, divide for avg).
class GlooWork final : public Work {
 public:
  GlooWork(std::function<void()> block, std::string what, Clock::time_point deadline, std::function<void()> finish)
      : block_(std::move(block)), what_(std::move(what)), deadline_(deadline), finish_(std::move(finish)) {}

  ~GlooWork() override {
    if (!done_) complete_unwaited(*this, what_);
  }

  void wait() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    WaitScope scope(what_);
    try {
      block_();
    } catch (const std::exception& e) {
      fail_work(what_, e, deadline_);
    }
    done_ = true;
    if (finish_) finish_();
  }

 private:
  std::function<void()> block_;
  std::string what_;
  Clock::time_point deadline_;
  std::function<void()> finish_;
  std::mutex mu_;
  bool done_ = false;
};

// Every rank of `pg` on this host: collectives go through one shared-memory segment (shm_group.h)
// on a worker thread instead of loopback TCP. Collective over `pg`; nullptr keeps gloo.
std::unique_ptr<ShmGroup> open_shm(const GlooPtr& pg, const std::string& where, const CommOptions& options) {
  const int world = pg->getSize();
  if (world < 2) return nullptr;
  ShmExchange exchange = [&](const std::vector<int64_t>& mine) {
    at::Tensor in = at::tensor(mine, at::kLong);  // (k)
    at::Tensor out = at::empty({world * in.numel()}, at::kLong);  // (world*k)
    all_gather_single(*pg, out, in)->wait(options.timeout);
    return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
  };
  try {
    return ShmGroup::open(pg->getRank(), world, exchange);
  } catch (const std::exception& e) {
    fail_collective("gloo: rank " + std::to_string(pg->getRank()) + " of " + std::to_string(world) + " (" + where +
                    ") could not agree on shared memory with its peers (" + short_what(e) +
                    "); every rank must be running (ALPACA_GLOO_SHM=0 turns the shared-memory path off)");
  }
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(GlooPtr pg, c10::intrusive_ptr<c10d::Store> store, std::string name, std::string where,
                   const CommOptions& options)
      : pg_(std::move(pg)), store_(std::move(store)), name_(std::move(name)), where_(std::move(where)), options_(options),
        shm_(open_shm(pg_, where_, options_)) {
    if (shm_) worker_ = std::make_unique<SerialWorker>();
  }

  ~GlooCommunicator() override {
    if (shm_) shm_->stop();  // a collective still in flight fails instead of waiting for its peers
  }

  int rank() const override { return pg_->getRank(); }
  int world_size() const override { return pg_->getSize(); }
  at::Device device() const override { return at::Device(at::kCPU); }
  std::string backend() const override { return "gloo"; }

  WorkHandle all_gather_into(at::Tensor out, const at::Tensor& in) override {
    const char* op = "all_gather_into";
    check_cpu_tensor(out, "gloo", op, "out");
    check_cpu_tensor(in, "gloo", op, "in");
    ALPACA_CHECK(out.is_contiguous() && out.scalar_type() == in.scalar_type(),
                 op << ": out must be contiguous with in's dtype " << in.scalar_type());
    ALPACA_CHECK(out.numel() == in.numel() * world_size(),
                 op << ": out has " << out.numel() << " elements, expected world " << world_size() << " x in " << in.numel());
    const std::string what = label(op, in);
    at::Tensor src = in.contiguous().view(-1), dst = out.view(-1);
    if (shm_) return issue_shm(what, [this, dst, src](ShmDeadline d) { shm_->all_gather(dst, src, d); });
    if (src.is_alias_of(dst)) src = src.clone();  // in place (in is out's own slot)
    return issue(what, [&] { return all_gather_single(*pg_, dst, src); }, {});
  }

  WorkHandle reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp op_kind) override {
    const char* op = "reduce_scatter";
    check_cpu_tensor(out, "gloo", op, "out");
    check_cpu_tensor(in, "gloo", op, "in");
    ALPACA_CHECK(out.scalar_type() == in.scalar_type(), op << ": out is " << out.scalar_type() << " but in is " << in.scalar_type());
    ALPACA_CHECK(in.numel() == out.numel() * world_size(),
                 op << ": in has " << in.numel() << " elements, expected world " << world_size() << " x out " << out.numel());
    const std::string what = label(op, in, op_kind);
    if (shm_) return issue_shm(what, [this, out, in, op_kind](ShmDeadline d) { shm_->reduce_scatter(out, in, op_kind, d); });
    const bool widen = is_16bit_float(in);
    at::Tensor src = widen ? in.contiguous().view(-1).to(at::kFloat) : in.contiguous().view(-1).clone();
    at::Tensor dst = at::empty({out.numel()}, src.options());
    auto finish = [dst, out, op_kind, world = world_size()]() mutable {
      if (op_kind == ReduceOp::kAvg) finish_avg(dst, world);
      out.view(-1).copy_(dst);  // rounds a 16-bit result once
    };
    return issue(what, [&] { return reduce_scatter_op(dst, src, op_kind); }, finish);
  }

  WorkHandle all_reduce(at::Tensor t, ReduceOp op_kind) override {
    const char* op = "all_reduce";
    check_cpu_tensor(t, "gloo", op, "t");
    const std::string what = label(op, t, op_kind);
    if (shm_) return issue_shm(what, [this, t, op_kind](ShmDeadline d) { shm_->all_reduce(t, op_kind, d); });
    const bool widen = is_16bit_float(t);
    at::Tensor buf = widen ? t.to(at::kFloat).contiguous() : (t.is_contiguous() ? t : t.contiguous());
    const bool copy_back = widen || !buf.is_same(t);
    auto finish = [buf, t, op_kind, copy_back, world = world_size()]() mutable {
      if (op_kind == ReduceOp::kAvg) finish_avg(buf, world);
      if (copy_back) t.copy_(buf);
    };
    c10d::AllreduceOptions opts;
    opts.reduceOp = op_kind == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    return issue(what, [&] {
      std::vector<at::Tensor> ts{buf};
      return pg_->allreduce(ts, opts);
    }, finish);
  }

  WorkHandle broadcast(at::Tensor t, int root) override {
    const char* op = "broadcast";
    check_cpu_tensor(t, "gloo", op, "t");
    ALPACA_CHECK(root >= 0 && root < world_size(), op << ": root " << root << " is outside the " << world_size() << " ranks");
    const std::string what = label(op, t) + " from rank " + std::to_string(root);
    if (shm_) return issue_shm(what, [this, t, root](ShmDeadline d) { shm_->broadcast(t, root, d); });
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    std::function<void()> finish;
    if (!buf.is_same(t)) finish = [buf, t]() mutable { t.copy_(buf); };
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    return issue(what, [&] {
      std::vector<at::Tensor> ts{buf};
      return pg_->broadcast(ts, opts);
    }, finish);
  }

  WorkHandle barrier() override {
    if (shm_) return issue_shm(label("barrier"), [this](ShmDeadline d) { shm_->barrier(d); });
    return issue(label("barrier"), [&] { return pg_->barrier(); }, {});
  }

  std::shared_ptr<Communicator> split(int color, int key) override;

 private:
  // Gloo's reduce_scatter_single wants equal chunks per rank; its max/sum map directly.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_op(at::Tensor& dst, at::Tensor& src, ReduceOp op_kind) {
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = op_kind == ReduceOp::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    return reduce_scatter_single(*pg_, dst, src, opts);
  }

  std::string label(const char* op, const at::Tensor& t = {}, std::optional<ReduceOp> r = std::nullopt) {
    std::ostringstream os;
    os << op << " #" << ++seq_;
    if (t.defined()) os << " (" << describe(t) << (r ? std::string(", ") + to_string(*r) : std::string()) << ")";
    os << " on gloo communicator " << name_ << " (rank " << rank() << " of " << world_size() << ", " << where_ << ")";
    return os.str();
  }

  template <class Start>
  WorkHandle issue(const std::string& what, Start start, std::function<void()> finish) {
    std::lock_guard<std::mutex> lock(mu_);  // one issue order on every rank
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = start();
    } catch (const std::exception& e) {
      fail_collective(what + " could not start: " + short_what(e));
    }
    const auto deadline = deadline_after(options_.timeout);
    auto block = [work, deadline] {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      work->wait(std::max(left, std::chrono::milliseconds(1)));
    };
    return std::make_shared<GlooWork>(std::move(block), what, deadline, std::move(finish));
  }

  // The shared-memory path: the worker runs the collectives in issue order.
  WorkHandle issue_shm(const std::string& what, std::function<void(ShmDeadline)> run) {
    std::lock_guard<std::mutex> lock(mu_);  // one issue order on every rank
    const auto deadline = deadline_after(options_.timeout);
    auto done = worker_->post([run = std::move(run), deadline] { run(deadline); });
    // The worker bounds every collective by its deadline.
    return std::make_shared<GlooWork>([done = std::move(done)] { done.get(); }, what, deadline, nullptr);
  }

  GlooPtr pg_;
  c10::intrusive_ptr<c10d::Store> store_;  // the job's store (sub-communicators rendezvous under new prefixes)
  std::string name_;
  std::string where_;  // this process's node and address
  CommOptions options_;
  std::mutex mu_;
  uint64_t seq_ = 0;
  std::unique_ptr<ShmGroup> shm_;         // set when every rank shares this host
  std::unique_ptr<SerialWorker> worker_;  // declared after shm_: joined before the segment goes
};

// A process group over `rank`/`size` whose rendezvous keys live under `prefix` of `store`.
GlooPtr make_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& prefix, int rank, int size,
                   const Devices& devices, const CommOptions& options) {
  auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
  opts->devices = devices.devices;
  // Two threads run the queued collectives: a prefetched all-gather can move while a
  // reduce-scatter is in flight (as the MPI progress thread allows).
  opts->threads = 2;
  try {
    return c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>(prefix, store), rank, size,
                                                       opts);
  } catch (const std::exception& e) {
    fail_collective("gloo: rank " + std::to_string(rank) + " of " + std::to_string(size) + " (" + devices.where +
                    ") could not connect to its peers (" + short_what(e) +
                    "); every rank must be started and reachable from the others on the interface chosen "
                    "(GLOO_SOCKET_IFNAME, else the one facing MASTER_ADDR)");
  }
}

std::shared_ptr<Communicator> GlooCommunicator::split(int color, int key) {
  // Everyone learns everyone's (color, key) through an all-gather on this communicator.
  at::Tensor mine = at::tensor({static_cast<int64_t>(color), static_cast<int64_t>(key)}, at::kLong);
  at::Tensor all = at::empty({2 * world_size()}, at::kLong);
  all_gather_into(all, mine)->wait();
  const uint64_t split_seq = seq_;
  if (color < 0) return nullptr;
  std::vector<std::pair<int64_t, int>> members;  // (key, old rank) of the ranks sharing my color
  for (int r = 0; r < world_size(); ++r)
    if (all[2 * r].item<int64_t>() == color) members.emplace_back(all[2 * r + 1].item<int64_t>(), r);
  std::sort(members.begin(), members.end());
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == rank()) new_rank = static_cast<int>(i);
  const std::string name = name_ + "/split" + std::to_string(split_seq) + "c" + std::to_string(color);
  const Devices devices = make_devices(launch_info());
  auto pg = make_group(store_, "alpaca/gloo/" + name, new_rank, static_cast<int>(members.size()), devices, options_);
  return std::make_shared<GlooCommunicator>(std::move(pg), store_, name, devices.where, options_);
}

}  // namespace

std::shared_ptr<Communicator> make_gloo_communicator(const CommOptions& options) {
  const LaunchInfo& li = launch_info();
  auto store = torchrun_store(options.timeout);
  // Communicators are made collectively and in the same order on every rank: a process-wide
  // counter gives every rank the same name.
  static int next_id = 0;
  const std::string name = "world" + std::to_string(next_id++);
  const Devices devices = make_devices(li);
  auto pg = make_group(store, "alpaca/gloo/" + name, li.rank, li.world_size, devices, options);
  return std::make_shared<GlooCommunicator>(std::move(pg), store, name, devices.where, options);
}

}  // namespace alpaca::dist::detail
