// Every collective against a value each rank computes locally from the formula every rank used
// for its input. Run under real mpirun with 1-4 ranks (mpi backend), under our launcher with
// ALPACA_TEST_BACKEND=store (store backend), and with ALPACA_TEST_BACKEND=nccl on CUDA (label gpu).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <thread>
#include <vector>

#include "alpaca/dist/runtime.h"
#include "alpaca/model/fused_ops.h"
#include "alpaca/util/error.h"
#include "dist_test_env.h"

namespace test_collectives {

namespace dist = alpaca::dist;
using alpaca::testing::job_comm;
using alpaca::testing::register_job_comm;
using dist::ReduceOp;

namespace {

dist::CommOptions job_options() {
  dist::CommOptions opts;
  if (const char* b = std::getenv("ALPACA_TEST_BACKEND")) opts.backend = dist::parse_backend(b);
  opts.cuda = opts.backend == dist::Backend::kNccl;
  opts.timeout = std::chrono::seconds(60);
  return opts;
}
const auto* g_env = register_job_comm(job_options());

// Rank r's input: small integers plus a fraction, all exactly representable in bf16 and fp16,
// different on every rank and element. Sums of these need more mantissa bits than bf16 has,
// so a reduction that accumulates in bf16 (instead of fp32) rounds differently and fails.
at::Tensor input(int rank, int64_t n, at::ScalarType dtype) {
  at::Tensor i = at::arange(n, at::kDouble);
  at::Tensor v = at::remainder(i * 3 + rank * 7, 17) - 5;
  if (dtype != at::kLong) v = v + (rank + 1) * 0.0078125 * at::remainder(i, 4);  // + k/128
  return v.to(dtype);
}

// The reduction over ranks computed locally in double from everyone's input, as the backend
// must produce it: exact fp32 accumulation then one rounding to the dtype.
at::Tensor expected(int world, int64_t n, at::ScalarType dtype, ReduceOp op) {
  at::Tensor acc = input(0, n, dtype).to(at::kDouble);
  for (int r = 1; r < world; ++r) {
    at::Tensor x = input(r, n, dtype).to(at::kDouble);
    acc = op == ReduceOp::kMax ? at::maximum(acc, x) : acc + x;
  }
  if (op == ReduceOp::kAvg) {
    acc = dtype == at::kLong ? at::div(acc, world, "trunc") : (acc.to(at::kFloat) / world).to(at::kDouble);
  }
  return acc.to(dtype == at::kLong ? at::kLong : at::kFloat).to(dtype);
}

// Where the communicator's tensors live (CPU, or cuda:local_rank for nccl).
at::Tensor on_dev(const at::Tensor& t) { return t.to(job_comm()->device()); }

void expect_equal(const at::Tensor& got_any, const at::Tensor& want, const std::string& what) {
  at::Tensor got = got_any.cpu();  // for CUDA: ordered after the collective by wait()
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  ASSERT_EQ(got.numel(), want.numel()) << what;
  // NCCL reduces 16-bit floats in their own precision at each ring step (the CPU backends
  // accumulate in fp32 and round once): allow one rounding per rank there.
  if (job_comm()->backend() == "nccl" && job_comm()->world_size() > 1 &&
      (got.scalar_type() == at::kBFloat16 || got.scalar_type() == at::kHalf)) {
    double tol = (got.scalar_type() == at::kBFloat16 ? 1.0 / 128 : 1.0 / 1024) * job_comm()->world_size();
    EXPECT_TRUE(at::allclose(got.to(at::kDouble), want.to(at::kDouble), tol, tol)) << what;
    return;
  }
  EXPECT_TRUE(at::equal(got.reshape(-1), want.reshape(-1)))
      << what << " on rank " << job_comm()->rank() << ": max abs diff "
      << (got.to(at::kDouble).reshape(-1) - want.to(at::kDouble).reshape(-1)).abs().max().item<double>();
}

const at::ScalarType kDtypes[] = {at::kFloat, at::kBFloat16, at::kHalf, at::kLong};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax};

std::string name(at::ScalarType dt, ReduceOp op) {
  return std::string(c10::toString(dt)) + "/" + (op == ReduceOp::kSum ? "sum" : op == ReduceOp::kAvg ? "avg" : "max");
}

}  // namespace

TEST(Collectives, RankAndWorldMatchTheLaunch) {
  const auto& li = dist::launch_info();
  EXPECT_EQ(job_comm()->rank(), li.rank);
  EXPECT_EQ(job_comm()->world_size(), li.world_size);
  EXPECT_EQ(job_comm()->device().is_cuda(), job_comm()->backend() == "nccl");
  if (job_comm()->device().is_cuda()) {
    EXPECT_EQ(job_comm()->device().index(), li.local_rank);
  }
}

TEST(Collectives, AllReduceEveryDtypeAndOpWithOddSizes) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  for (int64_t n : {1, 1001}) {  // 1001 is divisible by none of 2, 3, 4
    for (auto dt : kDtypes) {
      for (auto op : kOps) {
        at::Tensor t = on_dev(input(R, n, dt));
        job_comm()->all_reduce(t, op)->wait();
        expect_equal(t, expected(W, n, dt, op), "all_reduce " + name(dt, op) + " n=" + std::to_string(n));
      }
    }
  }
}

TEST(Collectives, AllReduceOfANonContiguousTensor) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  at::Tensor base = on_dev(input(R, 12, at::kFloat)).view({3, 4});
  at::Tensor t = base.t();  // a transposed view: the result must land in base's storage
  job_comm()->all_reduce(t, ReduceOp::kSum)->wait();
  expect_equal(base.reshape(-1), expected(W, 12, at::kFloat, ReduceOp::kSum), "all_reduce of a transposed view");
}

TEST(Collectives, AllGatherIntoOneTensorAndInPlace) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  for (auto dt : kDtypes) {
    const int64_t n = 333;  // odd shard, total world*333
    at::Tensor want = at::cat([&] {
      std::vector<at::Tensor> parts;
      for (int r = 0; r < W; ++r) parts.push_back(input(r, n, dt));
      return parts;
    }());
    at::Tensor out = on_dev(at::full({W * n}, 99, at::TensorOptions().dtype(dt)));
    job_comm()->all_gather_into(out, on_dev(input(R, n, dt)))->wait();
    expect_equal(out, want, std::string("all_gather_into ") + c10::toString(dt));

    // In place: this rank's shard already sits in its slot of the output (FSDP's unshard).
    at::Tensor full = on_dev(at::zeros({W * n}, at::TensorOptions().dtype(dt)));
    at::Tensor slot = full.narrow(0, R * n, n);
    slot.copy_(on_dev(input(R, n, dt)));
    job_comm()->all_gather_into(full, slot)->wait();
    expect_equal(full, want, std::string("in-place all_gather_into ") + c10::toString(dt));
  }
}

TEST(Collectives, ReduceScatterEveryDtypeAndOpAndInPlace) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  const int64_t n = 7;
  for (auto dt : kDtypes) {
    for (auto op : kOps) {
      at::Tensor in = on_dev(input(R, W * n, dt));
      at::Tensor want = expected(W, W * n, dt, op).narrow(0, R * n, n);
      at::Tensor out = at::empty({n}, in.options());
      job_comm()->reduce_scatter(out, in, op)->wait();
      expect_equal(out, want, "reduce_scatter " + name(dt, op));

      // In place: the output is this rank's block of the input.
      at::Tensor buf = on_dev(input(R, W * n, dt));
      job_comm()->reduce_scatter(buf.narrow(0, R * n, n), buf, op)->wait();
      expect_equal(buf.narrow(0, R * n, n), want, "in-place reduce_scatter " + name(dt, op));
    }
  }
}

// bf16 sums and averages take a fused form on some backends (the MPI ring: bf16 words on the first step,
// one fold per step; ALPACA_CPU_FUSED=0 turns it off): bit for bit the general form, on values whose
// sums round (random, 1e3 scale), with NaN, infinities and subnormals, odd block sizes, in and out of place
// (a NaN is NaN either way).
TEST(Collectives, ReduceScatterBf16FusedIsTheGeneralFormBitForBit) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  struct Restore {
    ~Restore() { alpaca::model::set_fused_cpu_bf16(true); }
  } restore;
  for (int64_t n : {1, 1001, 40000}) {
    at::manual_seed(100 + R);
    at::Tensor in = (at::randn({W * n}) * 1e3).to(at::kBFloat16);
    if (n > 8) {
      in[R] = std::numeric_limits<float>::quiet_NaN();
      in[W + 1] = R % 2 == 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
      in[W + 2] = 1e-40 * (R + 1);
    }
    for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      for (bool in_place : {false, true}) {
        std::vector<at::Tensor> outs;
        for (bool fused : {true, false}) {
          alpaca::model::set_fused_cpu_bf16(fused);
          at::Tensor buf = on_dev(in.clone());
          at::Tensor out = in_place ? buf.narrow(0, R * n, n) : on_dev(at::empty({n}, at::kBFloat16));
          job_comm()->reduce_scatter(out, buf, op)->wait();
          outs.push_back(out.cpu());
        }
        // A NaN result is NaN either way; its encoding is not compared (ATen's vectorised rounding writes
        // 0xFFFF, its scalar tail and the fused folds c10's 0x7FC0).
        const at::Tensor same = outs[0].view(at::kShort).eq(outs[1].view(at::kShort)) | (outs[0].isnan() & outs[1].isnan());
        EXPECT_TRUE(same.all().item<bool>())
            << name(at::kBFloat16, op) << " n=" << n << (in_place ? " in place" : "") << " on rank " << R;
      }
    }
  }
}

// Several reduce-scatters in flight at once, waited in the reverse order (FSDP keeps one in
// flight while gathers run; a ring of point-to-point steps must not take another operation's
// messages), and one large enough that every step carries many pages.
TEST(Collectives, ReduceScattersInFlightTogether) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  const std::vector<int64_t> sizes = {5, 1 << 20, 129};
  std::vector<at::Tensor> outs;
  std::vector<dist::WorkHandle> works;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto dt = i == 1 ? at::kFloat : at::kBFloat16;
    outs.push_back(on_dev(at::empty({sizes[i]}, at::TensorOptions().dtype(dt))));
    works.push_back(job_comm()->reduce_scatter(outs.back(), on_dev(input(R, W * sizes[i], dt)), ReduceOp::kSum));
  }
  for (size_t i = sizes.size(); i-- > 0;) {
    works[i]->wait();
    const auto dt = outs[i].scalar_type();
    expect_equal(outs[i], expected(W, W * sizes[i], dt, ReduceOp::kSum).narrow(0, R * sizes[i], sizes[i]),
                 "reduce_scatter #" + std::to_string(i) + " of " + std::to_string(sizes[i]) + " in flight");
  }
}

TEST(Collectives, BroadcastFromEveryRoot) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  for (int root = 0; root < W; ++root) {
    for (auto dt : kDtypes) {
      at::Tensor t = on_dev(input(R, 101, dt));
      job_comm()->broadcast(t, root)->wait();
      expect_equal(t, input(root, 101, dt), "broadcast from " + std::to_string(root) + " " + c10::toString(dt));
    }
  }
}

TEST(Collectives, AsyncHandlesWaitedInAnyOrder) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  std::vector<at::Tensor> ts;
  std::vector<dist::WorkHandle> works;
  for (int k = 0; k < 4; ++k) {
    ts.push_back(on_dev(input(R + k, 4097, at::kBFloat16)));
    works.push_back(job_comm()->all_reduce(ts.back(), ReduceOp::kSum));
  }
  works.push_back(job_comm()->barrier());
  for (int k = static_cast<int>(works.size()) - 1; k >= 0; --k) works[k]->wait();
  for (int k = 0; k < 4; ++k) {
    at::Tensor acc = at::zeros({4097}, at::kDouble);
    for (int r = 0; r < W; ++r) acc += input(r + k, 4097, at::kBFloat16).to(at::kDouble);
    expect_equal(ts[k], acc.to(at::kBFloat16), "async all_reduce " + std::to_string(k));
  }
}

TEST(Collectives, SplitByParityInReverseKeyOrder) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  auto sub = job_comm()->split(R % 2, -R);
  ASSERT_TRUE(sub);
  std::vector<int> members;
  for (int r = W - 1; r >= 0; --r)
    if (r % 2 == R % 2) members.push_back(r);  // ordered by key = -rank
  EXPECT_EQ(sub->world_size(), static_cast<int>(members.size()));
  EXPECT_EQ(members[sub->rank()], R);
  at::Tensor t = on_dev(at::full({5}, static_cast<int64_t>(R + 1), at::kLong));
  sub->all_reduce(t, ReduceOp::kSum)->wait();
  int64_t want = 0;
  for (int r : members) want += r + 1;
  EXPECT_TRUE(at::equal(t.cpu(), at::full({5}, want, at::kLong))) << t;
  at::Tensor g = on_dev(at::empty({static_cast<int64_t>(members.size())}, at::kLong));
  sub->all_gather_into(g, on_dev(at::full({1}, static_cast<int64_t>(R), at::kLong)))->wait();
  g = g.cpu();
  for (size_t i = 0; i < members.size(); ++i) EXPECT_EQ(g[i].item<int64_t>(), members[i]);
  // A rank passing a negative color gets no communicator.
  auto none = job_comm()->split(R == 0 ? -1 : 0, R);
  EXPECT_EQ(none == nullptr, R == 0);
  if (none) {
    EXPECT_EQ(none->world_size(), W - 1);
    none->barrier()->wait();
  }
}

TEST(Collectives, MisuseIsAnErrorNamingTheCollective) {
  const int W = job_comm()->world_size();
  try {
    job_comm()->all_gather_into(on_dev(at::empty({W * 3 + 1})), on_dev(at::empty({3})));
    FAIL() << "a wrong output size must throw";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("all_gather_into"), std::string::npos) << e.message();
  }
  try {
    job_comm()->reduce_scatter(on_dev(at::empty({3}, at::kFloat)), on_dev(at::empty({W * 3}, at::kBFloat16)), ReduceOp::kSum);
    FAIL() << "mixed dtypes must throw";
  } catch (const alpaca::Error& e) {
    EXPECT_NE(e.message().find("reduce_scatter"), std::string::npos) << e.message();
  }
}

// Over the 8 MiB value limit of the TCPStore (the store backend sends parts).
TEST(Collectives, LargePayloadAllReduceAndGather) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  const int64_t n = (int64_t{10} << 20) / 4 + 3;  // 10 MiB of fp32, odd
  at::Tensor t = on_dev(at::full({n}, static_cast<float>(R + 1)));
  job_comm()->all_reduce(t, ReduceOp::kSum)->wait();
  expect_equal(t, at::full({n}, static_cast<float>(W * (W + 1) / 2)), "10 MiB all_reduce");
  at::Tensor out = on_dev(at::empty({W * n}));
  job_comm()->all_gather_into(out, on_dev(at::full({n}, static_cast<float>(R))))->wait();
  at::Tensor want = at::arange(W, at::kFloat).repeat_interleave(n);
  expect_equal(out, want, "10 MiB all_gather_into");
}

// Collectives from another thread: fine with MPI_THREAD_MULTIPLE (and other backends); refused
// with a clear error when MPI was initialised FUNNELED (ALPACA_MPI_THREAD_LEVEL=funneled).
TEST(Collectives, FromAnotherThread) {
  const char* level = std::getenv("ALPACA_MPI_THREAD_LEVEL");
  const bool refused = job_comm()->backend() == "mpi" && level && std::string(level) == "funneled";
  std::string error;
  at::Tensor t = on_dev(at::full({3}, static_cast<float>(job_comm()->rank())));
  std::thread th([&] {
    try {
      job_comm()->all_reduce(t, ReduceOp::kMax)->wait();
    } catch (const alpaca::Error& e) {
      error = e.message();
    }
  });
  th.join();
  if (refused) {
    EXPECT_NE(error.find("all_reduce called from a thread other than the one that initialised MPI"), std::string::npos)
        << error;
  } else {
    EXPECT_EQ(error, "");
    expect_equal(t, at::full({3}, static_cast<float>(job_comm()->world_size() - 1)), "all_reduce from another thread");
  }
}

// barrier()->wait() orders the host on every backend (checkpoint sealing relies on it): the last
// rank arrives 400 ms late, and no rank may leave the wait before it arrived. The late rank
// publishes its arrival time over a second collective, measured on one steady clock (same node).
TEST(Collectives, BarrierBlocksTheHostUntilEveryRankArrived) {
  const int R = job_comm()->rank(), W = job_comm()->world_size();
  if (W == 1) GTEST_SKIP() << "needs two ranks";
  using Clock = std::chrono::steady_clock;
  auto now_us = [] {
    return static_cast<double>(
        std::chrono::duration_cast<std::chrono::microseconds>(Clock::now().time_since_epoch()).count());
  };
  job_comm()->barrier()->wait();  // start together
  if (R == W - 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const double arrived = now_us();
  job_comm()->barrier()->wait();
  const double left = now_us();
  // Everyone learns when the late rank arrived (max over ranks of the arrival times).
  at::Tensor t = on_dev(at::full({1}, arrived, at::kDouble));
  job_comm()->all_reduce(t, ReduceOp::kMax)->wait();
  const double last_arrival = t.cpu().item<double>();
  EXPECT_GE(left, last_arrival) << "rank " << R << " left barrier() " << (last_arrival - left) / 1000.0
                                << " ms before the last rank arrived";
  if (R == 0) {
    EXPECT_GE(left - arrived, 300e3) << "rank 0 waited only " << (left - arrived) / 1000.0 << " ms";
  }
}

// gloo on one host moves tensors through one shared-memory segment per communicator (it shows in
// /proc/self/maps as a deleted /dev/shm/alpaca-gloo-* file: unlinked once every rank mapped it),
// unless ALPACA_GLOO_SHM=0; mpi, store and nccl never map one.
TEST(Collectives, GlooOnOneHostMapsSharedMemoryUnlessTurnedOff) {
  std::ifstream maps("/proc/self/maps");
  bool mapped = false, unlinked = true;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/alpaca-gloo-") == std::string::npos) continue;
    mapped = true;
    unlinked &= line.find("(deleted)") != std::string::npos;
  }
  const char* off = std::getenv("ALPACA_GLOO_SHM");
  const bool want = job_comm()->backend() == "gloo" && job_comm()->world_size() > 1 && !(off && std::string(off) == "0");
  EXPECT_EQ(mapped, want) << job_comm()->backend() << " at world " << job_comm()->world_size();
  EXPECT_TRUE(unlinked) << "a shared-memory segment is still linked in /dev/shm";
}

}  // namespace test_collectives
