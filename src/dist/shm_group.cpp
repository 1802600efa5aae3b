// Intra-host collectives through POSIX shared memory (shm_group.h).
#include "shm_group.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "alpaca/model/fused_ops.h"
#include "cpu_collective.h"

namespace alpaca::dist::detail {

struct ShmGroup::Control {
  std::atomic<uint32_t> arrived;     // ranks in the current barrier
  std::atomic<uint32_t> generation;  // bumped by the last arrival; the futex word
  std::atomic<uint32_t> aborted;     // 1 + the rank whose collective failed first, else 0
};

namespace {

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "the barrier's futex word must be a plain 32-bit integer");
// The control page(s): the barrier words, then one arrival counter per rank.
// At kPassesOffset: (world) uint64 counters, the barriers each rank arrived at (to name the late ones).
constexpr size_t kPassesOffset = 64;
size_t control_bytes(int world) { return (kPassesOffset + 8 * static_cast<size_t>(world) + 4095) / 4096 * 4096; }
constexpr int kSpins = 2000;  // busy polls before sleeping in the futex
constexpr auto kSlice = std::chrono::milliseconds(20);

uint32_t* futex_word(std::atomic<uint32_t>& a) { return reinterpret_cast<uint32_t*>(&a); }

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::milliseconds slice) {
  timespec ts{0, static_cast<long>(slice.count()) * 1000000L};
  ::syscall(SYS_futex, futex_word(word), FUTEX_WAIT, expected, &ts, nullptr, 0);  // shared mapping: not _PRIVATE
}

void futex_wake_all(std::atomic<uint32_t>& word) { ::syscall(SYS_futex, futex_word(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0); }

std::string read_first_line(const std::string& path) {
  std::ifstream f(path);
  std::string line;
  std::getline(f, line);
  return line;
}

std::string link_target(const std::string& path) {
  char buf[256] = {};
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Ranks share memory when they share the kernel boot and the namespaces that decide what
// /dev/shm and a pid mean and which network they are on (a namespace "node" counts as a host).
int64_t host_key() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string id = std::string(host) + "|" + read_first_line("/proc/sys/kernel/random/boot_id");
  for (const char* ns : {"net", "pid", "mnt"}) id += "|" + link_target(std::string("/proc/self/ns/") + ns);
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ULL;
  return static_cast<int64_t>(h >> 1) | 1;  // positive, never 0 (0 means "shared memory off")
}

// ALPACA_GLOO_SHM=0 turns the path off; ALPACA_GLOO_SHM_MB is each rank's buffer (two halves).
int64_t wanted_megabytes() {
  const char* on = std::getenv("ALPACA_GLOO_SHM");
  if (on && std::string(on) == "0") return 0;
  const char* mb = std::getenv("ALPACA_GLOO_SHM_MB");
  const long v = mb && *mb ? std::strtol(mb, nullptr, 10) : 32;
  return std::clamp<long>(v, 0, 4096);
}

bool process_alive(int64_t pid) {
  std::string stat = read_first_line("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return false;  // gone
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';  // a zombie is dead too (its parent has not reaped it yet)
}

// Maps `name` (made by rank 0 with `create`) read-write; nullptr on failure.
void* map_segment(const std::string& name, size_t bytes, bool create) {
  const int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return nullptr;
  // posix_fallocate reserves the pages now: a full /dev/shm is a clean "no" here, not a SIGBUS later.
  const bool sized = !create || (::ftruncate(fd, static_cast<off_t>(bytes)) == 0 && ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0);
  void* p = sized ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (p == MAP_FAILED) {
    if (create) ::shm_unlink(name.c_str());
    return nullptr;
  }
  return p;
}

bool all_equal(const std::vector<int64_t>& v, size_t stride, size_t at) {
  for (size_t i = at; i < v.size(); i += stride)
    if (v[i] != v[at]) return false;
  return true;
}

// out <- op over srcs (in rank order); out aliases none of them.
void reduce_into(at::Tensor out, const std::vector<at::Tensor>& srcs, ReduceOp op) {
  if (op == ReduceOp::kMax) {
    at::maximum_out(out, srcs[0], srcs[1]);
    for (size_t s = 2; s < srcs.size(); ++s) at::maximum_out(out, out, srcs[s]);
  } else {
    at::add_out(out, srcs[0], srcs[1]);
    for (size_t s = 2; s < srcs.size(); ++s) out.add_(srcs[s]);
  }
}

at::ScalarType reduce_type(const at::Tensor& t) { return is_16bit_float(t) ? at::kFloat : t.scalar_type(); }

// bf16 sums and averages travel as their own words (exact, half the bytes of the fp32 upcast) and are
// reduced by the fused folds (model::ring_fold, one pass each): the same bits as reduce_into over the
// fp32 upcasts then finish_avg and the rounding copy_ (IEEE addition commutes). ALPACA_CPU_FUSED=0
// keeps the fp32 staging; every rank must agree on it (the segment's layout differs).
bool fused_bf16(const at::Tensor& t, ReduceOp op) { return op != ReduceOp::kMax && alpaca::model::fused_cpu_bf16_applies(t); }

// out (bf16, m) = bf16((sum over parts, in rank order, in fp32) / div); `acc` 2m floats of scratch
// when there are more than two parts (two running sums, so that no fold reads what it writes).
void fold_bf16_parts(at::BFloat16* out, const std::vector<const at::BFloat16*>& parts, float div, int64_t m,
                     std::vector<float>& acc) {
  namespace rf = alpaca::model::ring_fold;
  const size_t w = parts.size();
  if (w == 2) return rf::sum_round(out, parts[0], parts[1], div, m);
  acc.resize(2 * static_cast<size_t>(m));
  float *sum = acc.data(), *next = acc.data() + m;
  rf::sum(sum, parts[0], parts[1], m);
  for (size_t s = 2; s + 1 < w; ++s) {
    rf::sum(next, parts[s], sum, m);
    std::swap(sum, next);
  }
  rf::sum_round(out, parts[w - 1], sum, div, m);
}

// target <- op over parts (rank order), divided by the world size for kAvg: bf16 words folded in one
// pass when `fused` (fused_bf16), else ATen over parts already in the reduction dtype.
void reduce_parts(at::Tensor target, const std::vector<at::Tensor>& parts, ReduceOp op, bool fused,
                  std::vector<float>& acc) {
  const int world = static_cast<int>(parts.size());
  if (!fused) {
    reduce_into(target, parts, op);
    if (op == ReduceOp::kAvg) finish_avg(target, world);
    return;
  }
  std::vector<const at::BFloat16*> words;
  for (const at::Tensor& p : parts) words.push_back(p.const_data_ptr<at::BFloat16>());
  fold_bf16_parts(target.mutable_data_ptr<at::BFloat16>(), words, op == ReduceOp::kAvg ? static_cast<float>(world) : 1.0f,
                  target.numel(), acc);
}

// A flat contiguous view of t, or a contiguous copy (written back by the caller when it differs).
at::Tensor flat(const at::Tensor& t) { return t.is_contiguous() ? t.view(-1) : t.contiguous().view(-1); }

}  // namespace

std::unique_ptr<ShmGroup> ShmGroup::open(int rank, int world, const ShmExchange& exchange) {
  const int64_t mb = wanted_megabytes();
  const std::vector<int64_t> who = exchange({mb > 0 ? host_key() : 0, static_cast<int64_t>(::getpid()), mb});
  int64_t min_mb = mb;
  for (int r = 0; r < world; ++r) min_mb = std::min(min_mb, who[3 * r + 2]);
  if (world < 2 || min_mb <= 0 || who[0] == 0 || !all_equal(who, 3, 0)) return nullptr;
  std::vector<int64_t> pids(world);
  for (int r = 0; r < world; ++r) pids[r] = who[3 * r + 1];
  const int64_t half = (min_mb << 20) / 2;
  const size_t bytes = control_bytes(world) + static_cast<size_t>(world) * 2 * static_cast<size_t>(half);
  // Rank 0 makes the segment under a random name, the others learn the name and map it.
  const int64_t nonce = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  const std::string base = "/alpaca-gloo-" + std::to_string(pids[0]) + "-";
  void* p = rank == 0 ? map_segment(base + std::to_string(nonce), bytes, true) : nullptr;
  const std::vector<int64_t> made = exchange({p != nullptr ? 1 : 0, nonce});
  const std::string name = base + std::to_string(made[1]);
  if (made[0] == 0) return nullptr;
  if (rank != 0) p = map_segment(name, bytes, false);
  // Waits poll the peers' pids: each must be visible here (not so under /proc's hidepid).
  const bool see_peers = std::all_of(pids.begin(), pids.end(), [](int64_t pid) { return process_alive(pid); });
  const std::vector<int64_t> mapped = exchange({p != nullptr && see_peers ? 1 : 0});
  if (rank == 0) ::shm_unlink(name.c_str());  // everyone who will map it has: nothing stays in /dev/shm
  const bool everyone = std::all_of(mapped.begin(), mapped.end(), [](int64_t v) { return v == 1; });
  if (!everyone) {
    if (p) ::munmap(p, bytes);
    return nullptr;
  }
  return std::unique_ptr<ShmGroup>(new ShmGroup(rank, world, p, bytes, half, std::move(pids)));
}

std::atomic<uint64_t>* ShmGroup::passes() const {
  static_assert(sizeof(Control) <= kPassesOffset, "the arrival counters follow the barrier words");
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(base_) + kPassesOffset);
}

ShmGroup::ShmGroup(int rank, int world, void* base, size_t bytes, int64_t half_bytes, std::vector<int64_t> pids)
    : rank_(rank), world_(world), base_(base), bytes_(bytes), half_bytes_(half_bytes), pids_(std::move(pids)) {}

ShmGroup::~ShmGroup() { ::munmap(base_, bytes_); }

void ShmGroup::stop() {
  stopping_ = true;
  futex_wake_all(static_cast<Control*>(base_)->generation);
}

at::Tensor ShmGroup::buffer(int owner, int parity, at::ScalarType type, int64_t begin, int64_t end) const {
  char* start = static_cast<char*>(base_) + control_bytes(world_) + (static_cast<size_t>(owner) * 2 + parity) * half_bytes_;
  return at::from_blob(start + begin * static_cast<int64_t>(at::elementSize(type)), {end - begin}, at::TensorOptions().dtype(type));
}

void ShmGroup::fail(const std::string& why) {
  poisoned_ = true;
  auto* c = static_cast<Control*>(base_);
  uint32_t none = 0;
  c->aborted.compare_exchange_strong(none, static_cast<uint32_t>(rank_) + 1, std::memory_order_acq_rel);
  futex_wake_all(c->generation);
  throw std::runtime_error(why);
}

void ShmGroup::check_peers() {
  for (int r = 0; r < world_; ++r)
    if (r != rank_ && !process_alive(pids_[r]))
      fail("rank " + std::to_string(r) + " (pid " + std::to_string(pids_[r]) + " on this host) exited");
}

void ShmGroup::sync(ShmDeadline deadline) {
  if (poisoned_) throw std::runtime_error("an earlier collective of this communicator failed");
  auto* c = static_cast<Control*>(base_);
  const uint32_t gen = c->generation.load(std::memory_order_acquire);
  passes()[rank_].fetch_add(1, std::memory_order_relaxed);
  if (c->arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(world_)) {
    c->arrived.store(0, std::memory_order_relaxed);
    c->generation.store(gen + 1, std::memory_order_release);
    futex_wake_all(c->generation);
  } else {
    int spin = 0;
    while (spin < kSpins && c->generation.load(std::memory_order_acquire) == gen) ++spin;
    if (spin == kSpins) wait_slow(gen, deadline);
  }
  parity_ ^= 1;
}

void ShmGroup::wait_slow(uint32_t gen, ShmDeadline deadline) {
  auto* c = static_cast<Control*>(base_);
  while (c->generation.load(std::memory_order_acquire) == gen) {
    if (const uint32_t first = c->aborted.load(std::memory_order_acquire))
      fail("rank " + std::to_string(first - 1) + "'s wait in it failed first (its own error says why)");
    if (stopping_) fail("the communicator is being destroyed");
    if (std::chrono::steady_clock::now() >= deadline) fail("timed out waiting for " + late_ranks() + " (shared memory)");
    check_peers();
    futex_wait(c->generation, gen, kSlice);
  }
}

std::string ShmGroup::late_ranks() const {
  const uint64_t mine = passes()[rank_].load(std::memory_order_relaxed);
  std::string late;
  for (int r = 0; r < world_; ++r)
    if (passes()[r].load(std::memory_order_relaxed) < mine) late += (late.empty() ? "rank " : ", ") + std::to_string(r);
  return late.empty() ? std::string("the other ranks") : late + " (not arrived)";
}

void ShmGroup::barrier(ShmDeadline deadline) { sync(deadline); }

void ShmGroup::all_gather(at::Tensor out, const at::Tensor& in, ShmDeadline deadline) {
  const at::Tensor src = flat(in), dst = out.view(-1);  // out is contiguous (checked by the caller)
  const int64_t n = src.numel(), piece = std::max<int64_t>(1, half_bytes_ / src.element_size());
  for (int64_t a = 0; a < n; a += piece) {
    const int64_t m = std::min(piece, n - a);
    mine(src.scalar_type(), 0, m).copy_(src.narrow(0, a, m));
    const int parity = parity_;
    sync(deadline);
    for (int s = 0; s < world_; ++s) dst.narrow(0, s * n + a, m).copy_(buffer(s, parity, src.scalar_type(), 0, m));
  }
}

void ShmGroup::broadcast(at::Tensor t, int root, ShmDeadline deadline) {
  at::Tensor buf = flat(t);
  const int64_t n = buf.numel(), piece = std::max<int64_t>(1, half_bytes_ / buf.element_size());
  for (int64_t a = 0; a < n; a += piece) {
    const int64_t m = std::min(piece, n - a);
    if (rank_ == root) mine(buf.scalar_type(), 0, m).copy_(buf.narrow(0, a, m));
    const int parity = parity_;
    sync(deadline);
    if (rank_ != root) buf.narrow(0, a, m).copy_(buffer(root, parity, buf.scalar_type(), 0, m));
  }
  if (buf.data_ptr() != t.data_ptr()) t.copy_(buf.view(t.sizes()));
}

void ShmGroup::reduce_scatter(at::Tensor out, const at::Tensor& in, ReduceOp op, ShmDeadline deadline) {
  const at::Tensor src = flat(in);
  at::Tensor dst = flat(out);
  const bool fused = fused_bf16(in, op);  // staged as bf16 words, folded straight into out
  const at::ScalarType wide = fused ? at::kBFloat16 : reduce_type(in);
  const int64_t n = dst.numel(), esize = at::elementSize(wide);
  const int64_t piece = std::max<int64_t>(1, half_bytes_ / esize / world_);
  const bool direct = dst.scalar_type() == wide;  // reduce straight into out, else via fp32 scratch
  at::Tensor scratch = direct ? at::Tensor() : at::empty({std::min(piece, n)}, at::TensorOptions().dtype(wide));
  std::vector<float> acc;
  for (int64_t a = 0; a < n; a += piece) {
    const int64_t m = std::min(piece, n - a);
    for (int j = 0; j < world_; ++j) mine(wide, j * m, (j + 1) * m).copy_(src.narrow(0, j * n + a, m));
    const int parity = parity_;
    sync(deadline);
    std::vector<at::Tensor> parts;
    for (int s = 0; s < world_; ++s) parts.push_back(buffer(s, parity, wide, rank_ * m, (rank_ + 1) * m));
    at::Tensor target = direct ? dst.narrow(0, a, m) : scratch.narrow(0, 0, m);
    reduce_parts(target, parts, op, fused, acc);
    if (!direct) dst.narrow(0, a, m).copy_(target);  // rounds a 16-bit result once
  }
  if (dst.data_ptr() != out.data_ptr()) out.copy_(dst.view(out.sizes()));
}

void ShmGroup::all_reduce(at::Tensor t, ReduceOp op, ShmDeadline deadline) {
  at::Tensor buf = flat(t);
  const bool fused = fused_bf16(t, op);  // the input and the reduced parts as bf16 words
  const at::ScalarType wide = fused ? at::kBFloat16 : reduce_type(t);
  std::vector<float> acc;
  const int64_t n = buf.numel(), piece = std::max<int64_t>(world_, half_bytes_ / at::elementSize(wide) / 2);
  for (int64_t a = 0; a < n; a += piece) {
    const int64_t m = std::min(piece, n - a);
    mine(wide, 0, m).copy_(buf.narrow(0, a, m));  // the input in [0, m), the reduced part in [m, 2m)
    const int parity = parity_;
    sync(deadline);
    auto lo = [&](int r) { return m * r / world_; };
    std::vector<at::Tensor> parts;
    for (int s = 0; s < world_; ++s) parts.push_back(buffer(s, parity, wide, lo(rank_), lo(rank_ + 1)));
    at::Tensor reduced = buffer(rank_, parity, wide, m + lo(rank_), m + lo(rank_ + 1));
    reduce_parts(reduced, parts, op, fused, acc);
    sync(deadline);
    // Two barriers flipped the parity back: move on, so the next piece writes the other buffer
    // while the peers may still read this one's reduced parts.
    parity_ = parity ^ 1;
    for (int s = 0; s < world_; ++s)  // rounds a 16-bit result once
      buf.narrow(0, a + lo(s), lo(s + 1) - lo(s)).copy_(buffer(s, parity, wide, m + lo(s), m + lo(s + 1)));
  }
  if (buf.data_ptr() != t.data_ptr()) t.copy_(buf.view(t.sizes()));
}

SerialWorker::SerialWorker() : thread_([this] { loop(); }) {}

SerialWorker::~SerialWorker() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_future<void> SerialWorker::post(std::function<void()> task) {
  std::packaged_task<void()> job(std::move(task));
  std::shared_future<void> result = job.get_future().share();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_one();
  return result;
}

void SerialWorker::loop() {
  // Collectives move raw values, as gloo's own threads do: no autograd bookkeeping (grad mode is
  // per thread, so the issuing thread's no_grad would not reach this one).
  at::NoGradGuard no_grad;
  for (;;) {
    std::packaged_task<void()> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return done_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    job();
  }
}

}  // namespace alpaca::dist::detail
