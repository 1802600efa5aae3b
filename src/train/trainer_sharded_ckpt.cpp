// Sharded checkpoints (the default layout): every rank writes the parameter and AdamW-moment
// ranges it owns as safetensors in torch DCP's Hugging Face layout (ckpt/sharded_tensors.h), with
// digests computed while writing; nothing passes through another rank. Rank 0 writes the small
// files (config, tokenizer, trainer and resume state) and seals the checkpoint only after an
// all-gather of every rank's status, file sizes and digests. With --save_async the shards are
// first copied into host memory and a background thread writes them while training goes on; the
// seal happens at the first step after every rank finished (or at the next save, the end, a
// signal). A resume reads only this rank's ranges, whatever world size or strategy wrote them.
#include <ATen/ATen.h>

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>

#include "alpaca/ckpt/digest.h"
#include "alpaca/ckpt/sharded_tensors.h"
#include "alpaca/util/error.h"
#include "alpaca/util/fault.h"
#include "alpaca/util/log.h"
#include "alpaca/util/sys.h"
#include "alpaca/util/tensor_memory.h"
#include "trainer_impl.h"

namespace fs = std::filesystem;

namespace alpaca::train {
namespace {

constexpr const char* kModelSub = "sharded";  // torch's SHARDED_DIR_NAME
struct Kind {
  const char* sub;
  const char* stem;
};
// Slot order of the status gather: kind-major, then the part. The block scales are written by runs
// with 8-bit moments (--optim adamw_8bit and kin: optim/adamw.h), whose exp_avg / exp_avg_sq are
// the dequantized moments; with them the codes restore exactly. Adafactor's statistics (--optim
// adafactor) are not sharded: every rank holds them whole, rank 0 writes them, whole, by name
// ("exp_avg_sq_row.<param>", ...), and they are its only optimizer state.
constexpr Kind kKinds[] = {{kModelSub, "model"},
                           {"optimizer/exp_avg", "exp_avg"},
                           {"optimizer/exp_avg_sq", "exp_avg_sq"},
                           {"optimizer/exp_avg_absmax", "exp_avg_absmax"},
                           {"optimizer/exp_avg_sq_absmax", "exp_avg_sq_absmax"},
                           {"optimizer/adafactor", "adafactor"}};
constexpr int kNumKinds = 6;
constexpr int kAdafactorKind = 5;
constexpr int kSlots = kNumKinds * ckpt::kShardParts;
// status, bytes written, RSS growth; (size, hi, lo) per slot; then the RSS figures of RssPoints
// and the writer thread's CPU time (ms).
constexpr int kRssBase = 3 + 3 * kSlots;
constexpr int kGatherWidth = kRssBase + 5;

// Free host memory for a staging copy: the kernel's MemAvailable, and under a CPU tensor cap
// (util/tensor_memory.h; auto_find_batch_size and the memory tests run under one) no more than
// the cap leaves above the run's peak so far: the copy lives on through the next steps, whose
// activations still need that peak, so a run that fits never turns into an out-of-memory error.
int64_t mem_available_bytes() {
  int64_t available = -1;
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") {
      available = kb * 1024;
      break;
    }
  if (const int64_t cap = util::cpu_tensor_cap_bytes(); cap > 0) {
    const int64_t left = cap - util::cpu_tensor_peak_bytes();
    available = available < 0 ? left : std::min(available, left);
  }
  return available;
}

// This rank's part of [begin, end) when `count` ranks hold the same shard (NO_SHARD / HYBRID).
std::pair<int64_t, int64_t> replica_part(int64_t begin, int64_t end, int index, int count) {
  const int64_t n = end - begin;
  return {begin + n * index / count, begin + n * (index + 1) / count};
}

// What a checkpoint holds of a local shard: its values (never a LoRA run's frozen base), and its
// AdamW moments when it trains and the save is not --save_only_model. snapshot_shards writes
// these; the --save_async headroom check sizes the copy by the same rule.
bool checkpoints_values(const TrainerOptions& opt, const fsdp::LocalParamShard& p) { return !opt.lora || p.trainable; }
bool checkpoints_moments(const TrainerOptions& opt, const fsdp::LocalParamShard& p) {
  return p.trainable && !opt.save_only_model && !opt.adamw.adafactor;
}

// CPU time this thread has used, in seconds (the background writer's cost, whoever pays it).
double thread_cpu_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The background writer gets only the CPU time training leaves: SCHED_IDLE (below nice 19; falls
// back to nice 19 where refused), for this thread only. On CPU ranks every core is busy with the
// steps; an equal-priority writer made the step beside it ~2x longer. The write then spreads over
// the next steps. (Not the idle I/O class: on a shared disk it starved the write for minutes.)
void lower_writer_priority() {
  const sched_param param{};
  if (pthread_setschedparam(pthread_self(), SCHED_IDLE, &param) != 0)
    setpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)), 19);
}

// The seal line's per-rank figures from the status gather: RSS in MiB (the process peak before the save /
// at its start / the peak after the snapshot / the peak through the save) and the writer's CPU s.
std::string per_rank_save_figures(const at::Tensor& gathered) {
  const auto a = gathered.accessor<int64_t, 2>();
  std::ostringstream out;
  out << "RSS MiB per rank (process peak before the save / at its start / peak after the snapshot / peak during the save):";
  for (int64_t r = 0; r < a.size(0); ++r)
    out << (r ? ", " : " ") << "rank " << r << " " << a[r][kRssBase] / (1 << 20) << "/" << a[r][kRssBase + 1] / (1 << 20)
        << "/" << a[r][kRssBase + 2] / (1 << 20) << "/" << a[r][kRssBase + 3] / (1 << 20);
  out << "; writer thread CPU s per rank:";
  for (int64_t r = 0; r < a.size(0); ++r) out << (r ? ", " : " ") << static_cast<double>(a[r][kRssBase + 4]) / 1000;
  return out.str();
}

// The bytes of the --save_async staging copy: what snapshot_shards copies (fp32).
int64_t staging_copy_bytes(const TrainerOptions& opt, const std::vector<fsdp::LocalParamShard>& shards, int replica,
                           int replicas) {
  int64_t need = 0;
  // The moments (Lion: one), with 8-bit ones their block scales.
  const int moments = (opt.adamw.lion ? 1 : 2) * (opt.adamw.bnb_bits == 8 ? 2 : 1);
  for (const auto& p : shards) {
    if (!checkpoints_values(opt, p)) continue;
    const auto [b, e] = replica_part(p.param_begin, p.param_end, replica, replicas);
    need += (e - b) * 4 * (checkpoints_moments(opt, p) ? 1 + moments : 1);
  }
  return need;
}

// Makes every page of a new staging buffer resident now, outside any step: one
// madvise(MADV_POPULATE_WRITE) (Linux 5.14) over its whole pages instead of ~200k separate faults
// at 776 MiB; where the kernel refuses, writing zeros faults them in. No mlock: the pages may
// still be swapped like any other heap memory.
void populate(at::Tensor& t) {
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + t.nbytes()) / page * page;
  if (last <= first || ::madvise(reinterpret_cast<void*>(first), last - first, MADV_POPULATE_WRITE) != 0) {
    t.zero_();
    return;
  }
  // The partial pages at either end.
  std::memset(t.data_ptr(), 0, first - begin);
  std::memset(reinterpret_cast<void*>(last), 0, begin + t.nbytes() - last);
}

}  // namespace

struct Trainer::Impl::ShardSet {
  std::vector<ckpt::RangePiece> kinds[kNumKinds];
  int64_t optimizer_step = 0;
  int64_t bytes() const {
    int64_t b = 0;
    for (const auto& k : kinds)
      for (const auto& p : k) b += static_cast<int64_t>(p.values.nbytes());
    return b;
  }
};

struct Trainer::Impl::PendingSave {
  explicit PendingSave(ckpt::CheckpointWriter w) : writer(std::move(w)) {}
  ~PendingSave() { join(); }  // an error unwinds the trainer: the write has no collectives
  // Waits for the writer. Training (or the exit) waits for it now, so it gets its normal CPU share
  // back first (needs CAP_SYS_NICE or a RLIMIT_NICE that allows it; otherwise it stays SCHED_IDLE):
  // at SCHED_IDLE on a loaded host a survivor of a node fault took 23 s instead of 11 to exit.
  void join() {
    if (!thread.joinable()) return;
    if (!done) {
      const sched_param param{};
      pthread_setschedparam(thread.native_handle(), SCHED_OTHER, &param);
    }
    thread.join();
  }
  ckpt::CheckpointWriter writer;
  std::thread thread;
  std::atomic<bool> done{false};
  std::vector<ckpt::WrittenFile> files;
  std::string error;        // the shard write's (background thread)
  std::string small_error;  // rank 0's small files' (main thread)
  // RSS (bytes) of this rank: the process's peak before the save (all its life: loading included),
  // at the save's start, the peak once the snapshot was taken (the stall's end), and the peak
  // through the whole save window (rss_watch; for --save_async it also holds the training steps
  // beside the write, whose log resets the kernel's window every step).
  std::unique_ptr<sys::RssPeakWatch> rss_watch;
  int64_t peak_before = 0, rss_at_start = 0, peak_after_snapshot = 0;
  int64_t saved_step = 0;
  double stall_seconds = 0, write_seconds = 0, write_cpu_seconds = 0, wait_seconds = 0;
};

bool Trainer::Impl::sharded_layout(const fs::path& dir) { return fs::is_directory(dir / kModelSub); }

// The ranges this rank owns, as views (copy = false, CPU fp32 shards) or copies in save_staging.
// The staging buffer is resident before the snapshot (prepare_save_staging), so the copy neither
// faults nor takes the free heap memory the next step's buffers reuse: a fresh copy per save made
// the step after it fault in ~210k pages (~1.3 s of system time per rank at 272M). (A fresh copy
// in its own huge-page mapping instead made this stall 0.4 -> 8 s: the kernel compacted memory.)
Trainer::Impl::ShardSet Trainer::Impl::snapshot_shards(bool copy) {
  ShardSet set;
  const auto [replica, replicas] = engine->shard_replica();
  int64_t used = 0;  // elements of save_staging taken so far
  auto piece = [&](const fsdp::LocalParamShard& p, const at::Tensor& shard_values) {
    const auto [b, e] = replica_part(p.param_begin, p.param_end, replica, replicas);
    at::Tensor v = shard_values.narrow(0, b - p.param_begin, e - b);
    if (copy) {
      ALPACA_CHECK(used + (e - b) <= save_staging.numel(), "the --save_async staging buffer holds " << save_staging.numel()
                                                            << " elements, fewer than this rank's shards (" << p.name << ")");
      at::Tensor dst = save_staging.narrow(0, used, e - b);
      used += e - b;
      v = dst.copy_(v);
    } else {
      v = v.to(at::kCPU, at::kFloat);
    }
    return ckpt::RangePiece{p.name, p.shape, b, e, v};
  };
  // 8-bit moments are dequantized for the snapshot (views of them outlive end_state_io).
  if (!opt.save_only_model) optimizer->begin_state_io();
  for (const auto& p : engine->local_param_shards()) {
    if (!checkpoints_values(opt, p)) continue;
    set.kinds[0].push_back(piece(p, p.values));
    if (!checkpoints_moments(opt, p)) continue;
    const int64_t n = p.param_end - p.param_begin;
    const bool two = optimizer->has_exp_avg_sq(), scales = optimizer->quantized();
    set.kinds[1].push_back(piece(p, optimizer->exp_avg(p.optim_index).narrow(0, p.shard_offset, n)));
    if (two) set.kinds[2].push_back(piece(p, optimizer->exp_avg_sq(p.optim_index).narrow(0, p.shard_offset, n)));
    if (scales) set.kinds[3].push_back(piece(p, optimizer->exp_avg_absmax(p.optim_index).narrow(0, p.shard_offset, n)));
    if (scales && two)
      set.kinds[4].push_back(piece(p, optimizer->exp_avg_sq_absmax(p.optim_index).narrow(0, p.shard_offset, n)));
  }
  if (!opt.save_only_model) optimizer->end_state_io();
  if (optimizer->adafactor() && !opt.save_only_model && rank == 0)
    for (const auto& st : optimizer->adafactor_state())  // copies: the steps go on changing them
      set.kinds[kAdafactorKind].push_back({st.key + "." + st.param, st.value.sizes().vec(), 0, st.value.numel(),
                                           st.value.reshape({-1}).to(at::kCPU, at::kFloat, false, /*copy=*/true)});
  set.optimizer_step = optimizer->step_count();
  return set;
}

// Whether this run will save asynchronously before its last step (that one saves synchronously).
bool Trainer::Impl::async_save_ahead() const {
  if (!opt.sharded_checkpoints || !opt.save_async) return false;
  if (opt.save_strategy == Interval::kSteps)
    return save_steps > 0 && (state.global_step / save_steps + 1) * save_steps < length.max_steps;
  return opt.save_strategy == Interval::kEpoch && length.steps_per_epoch < length.max_steps - state.global_step;
}

// The --save_async staging buffer (the planner's "--save_async staging copy"), allocated once when
// every rank has twice its size free (mem_available_bytes) and reused by every snapshot: its
// pages are made resident here, outside any step. Collective until it exists. Returns whether it
// does. Called at the start of a run that will save asynchronously (not under a CPU tensor cap,
// whose check needs the steps' peak: that one waits for the first save) and at every async save.
bool Trainer::Impl::prepare_save_staging() {
  if (save_staging.defined()) return true;
  const auto [replica, replicas] = engine->shard_replica();
  const int64_t need = staging_copy_bytes(opt, engine->local_param_shards(), replica, replicas);
  at::Tensor refuse = at::full({1}, mem_available_bytes() > 2 * need ? 0 : 1, at::TensorOptions().dtype(at::kLong).device(device));
  comm->all_reduce(refuse, dist::ReduceOp::kMax)->wait();
  if (refuse.item<int64_t>() != 0) {
    ALPACA_INFO("--save_async: not enough free host memory on some rank for a copy of its shards; saving synchronously");
    return false;
  }
  sys::Timer t;
  save_staging = at::empty({need / 4}, at::kFloat);
  populate(save_staging);
  ALPACA_INFO("--save_async: a " << need / (1 << 20) << " MiB host staging buffer for checkpoint snapshots (made resident in "
                                 << t.seconds() << " s), kept for the run");
  return true;
}

void Trainer::Impl::prepare_async_saves() {
  if (async_save_ahead() && util::cpu_tensor_cap_bytes() == 0) prepare_save_staging();
}

std::vector<ckpt::WrittenFile> Trainer::Impl::write_shards(const fs::path& dir, const ShardSet& set) const {
  std::vector<ckpt::WrittenFile> files;
  for (int k = 0; k < kNumKinds; ++k) {
    std::map<std::string, std::string> meta;
    if (k > 0) meta["step"] = std::to_string(set.optimizer_step);
    auto f = set.kinds[k].empty() && k > 0 ? std::vector<ckpt::WrittenFile>(ckpt::kShardParts)
                                           : ckpt::write_rank_shards(dir, kKinds[k].sub, kKinds[k].stem, rank, set.kinds[k], meta);
    files.insert(files.end(), f.begin(), f.end());
  }
  util::fault_pause_ms("ckpt.pause_before_seal");  // kill-mid-write tests (util/fault.h)
  return files;
}

// Rank 0's small files, their contents taken now (the step being saved) and written by the
// returned function later: on the background thread with --save_async, so the step that saves
// does not wait for the tokenizer's files either.
std::function<void(const fs::path&)> Trainer::Impl::small_checkpoint_files() const {
  std::optional<std::string> config;
  if (!opt.lora) config = export_config().to_json();
  std::optional<ckpt::ResumeState> resume;
  if (!opt.save_only_model) resume = capture_resume_state();
  return [this, config, saved = state, resume](const fs::path& dir) {
    if (config) {
      ckpt::write_file_durable(dir / "config.json", *config);
      ckpt::write_file_durable(dir / "generation_config.json", generation_config_json);  // consolidate's
    }
    write_tokenizer_files(dir);
    saved.save((dir / ckpt::kTrainerStateName).string());
    if (resume) resume->save((dir / ckpt::kResumeStateName).string());
  };
}

void Trainer::Impl::save_sharded_checkpoint(bool allow_async) {
  if (pending_save) finish_pending_save();
  note_best_checkpoint();
  sys::Timer stall;
  ckpt::CheckpointWriter writer(output_dir, state.global_step);
  if (rank == 0) writer.begin();
  barrier();  // the staging directory exists before any rank writes into it
  const int64_t peak_before = sys::peak_rss_bytes();
  auto rss_watch = std::make_unique<sys::RssPeakWatch>();
  const int64_t rss_at_start = sys::rss_bytes();
  // Asynchronous when every rank holds the staging buffer (made now if it was not at the start).
  const bool async = allow_async && opt.save_async && prepare_save_staging();
  ShardSet set = snapshot_shards(/*copy=*/async);
  auto pending = std::make_shared<PendingSave>(std::move(writer));
  pending->rss_at_start = rss_at_start;
  pending->peak_before = peak_before;
  pending->rss_watch = std::move(rss_watch);
  pending->saved_step = state.global_step;
  std::function<void(const fs::path&)> small;
  if (!opt.save_only_model) gather_rank_rng_states();  // collective; rank 0's resume state holds them
  try {  // a failure is reported through the status gather, so no rank waits for rank 0 in vain
    // A LoRA run's checkpoint also holds the peft adapter users load (adapter_model.safetensors,
    // adapter_config.json): gathered to rank 0 like HF Trainer's, trainable tensors only (a few
    // MiB). Resume reads the per-rank shards, not this copy. Collective.
    if (opt.lora) export_adapter(pending->writer.staging_dir());
    if (rank == 0) small = small_checkpoint_files();
  } catch (const std::exception& e) {
    pending->small_error = e.what();
  }
  auto run = [this, p = pending.get(), s = std::make_shared<ShardSet>(std::move(set)), small] {
    sys::Timer t;
    const double cpu0 = thread_cpu_seconds();
    try {
      if (small) small(p->writer.staging_dir());
    } catch (const std::exception& e) {
      p->small_error = e.what();
    }
    try {
      p->files = write_shards(p->writer.staging_dir(), *s);
    } catch (const std::exception& e) {
      p->error = e.what();
    }
    p->write_seconds = t.seconds();
    p->write_cpu_seconds = thread_cpu_seconds() - cpu0;
    p->done = true;
  };
  pending->peak_after_snapshot = pending->rss_watch->peak();
  if (!async) {
    run();
    pending->stall_seconds = stall.seconds();
    pending_save = pending;
    finish_pending_save();
    return;
  }
  pending->thread = std::thread([run] {
    lower_writer_priority();
    run();
  });
  pending->stall_seconds = stall.seconds();
  pending_save = pending;
  ALPACA_INFO("checkpoint-" << state.global_step << ": shards copied to host memory in " << pending->stall_seconds
                            << " s; writing them in the background");
}

void Trainer::Impl::poll_pending_save() {
  if (!pending_save) return;
  at::Tensor busy = at::full({1}, pending_save->done ? 0 : 1, at::TensorOptions().dtype(at::kLong).device(device));
  comm->all_reduce(busy, dist::ReduceOp::kMax)->wait();
  if (busy.item<int64_t>() == 0) finish_pending_save();
}

void Trainer::Impl::finish_pending_save() {
  std::shared_ptr<PendingSave> p = std::move(pending_save);
  if (!p) return;
  sys::Timer wait;
  p->join();
  p->wait_seconds = wait.seconds();
  // Every rank's status, bytes, peak RSS and (size, digest) per file, to every rank.
  at::Tensor mine = at::zeros({kGatherWidth}, at::kLong);
  auto* m = mine.data_ptr<int64_t>();
  const std::string error = p->error.empty() ? p->small_error : p->error;
  m[0] = error.empty() ? 0 : 1;
  const int64_t peak = p->rss_watch->peak();
  m[2] = std::max<int64_t>(0, peak - p->rss_at_start);  // what the save added
  for (size_t s = 0; s < p->files.size() && s < kSlots; ++s) {
    const auto& f = p->files[s];
    m[3 + 3 * s] = f.size;
    m[4 + 3 * s] = static_cast<int64_t>(f.digest_high);
    m[5 + 3 * s] = static_cast<int64_t>(f.digest_low);
    m[1] += std::max<int64_t>(f.size, 0);
  }
  if (p->files.empty())
    for (int s = 0; s < kSlots; ++s) m[3 + 3 * s] = -1;
  const int64_t rss[] = {p->peak_before, p->rss_at_start, p->peak_after_snapshot, peak,
                         static_cast<int64_t>(p->write_cpu_seconds * 1000)};
  std::copy(std::begin(rss), std::end(rss), m + kRssBase);
  at::Tensor all = at::empty({world * kGatherWidth}, at::TensorOptions().dtype(at::kLong).device(device));
  comm->all_gather_into(all, mine.to(device))->wait();
  all = all.to(at::kCPU).view({world, kGatherWidth});
  const auto a = all.accessor<int64_t, 2>();
  std::string failed;
  for (int r = 0; r < world; ++r)
    if (a[r][0] != 0) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  if (!failed.empty()) {
    std::string msg = p->writer.final_dir().filename().string() + " was not saved: rank(s) " + failed +
                      " could not write their shards";
    if (!error.empty()) msg += " (this rank: " + error + ")";
    if (rank == 0) msg += "; " + p->writer.abandon();
    ALPACA_FAIL(msg);
  }
  if (rank == 0) seal(*p, all);
  barrier();
}

void Trainer::Impl::seal(PendingSave& p, const at::Tensor& gathered) {
  const auto a = gathered.accessor<int64_t, 2>();
  std::map<std::string, std::pair<int64_t, std::string>> known;
  std::ostringstream per_rank;
  int64_t total = 0, max_rss = 0, others_rss = 0;
  for (int r = 0; r < world; ++r) {
    for (int s = 0; s < kSlots; ++s) {
      if (a[r][3 + 3 * s] < 0) continue;
      const Kind& k = kKinds[s / ckpt::kShardParts];
      known[ckpt::shard_file_name(k.sub, k.stem, r, s % ckpt::kShardParts)] = {
          a[r][3 + 3 * s], ckpt::xxh3_hex(static_cast<uint64_t>(a[r][4 + 3 * s]), static_cast<uint64_t>(a[r][5 + 3 * s]))};
    }
    total += a[r][1];
    per_rank << (r ? ", " : "") << a[r][1];
    max_rss = std::max(max_rss, a[r][2]);
    if (r) others_rss = std::max(others_rss, a[r][2]);
  }
  const fs::path final_dir = p.writer.commit(known);
  ALPACA_INFO("saved checkpoint " << final_dir.string() << ": shard bytes per rank [" << per_rank.str() << "] of " << total
              << " (1/" << world << " = " << total / world << "); RSS growth during the save: rank 0 "
              << a[0][2] / (1 << 20) << " MiB, other ranks at most " << others_rss / (1 << 20) << " MiB; training stalled "
              << p.stall_seconds << " s, the shard write took " << p.write_seconds << " s (sealed at step "
              << state.global_step << " of the save at step " << p.saved_step << ", after waiting " << p.wait_seconds
              << " s for it); " << per_rank_save_figures(gathered));
  if (opt.save_total_limit)
    ckpt::rotate_checkpoints(output_dir, *opt.save_total_limit, state.best_model_checkpoint.value_or(""), true);
}

void Trainer::Impl::load_sharded_weights(const fs::path& dir, const std::function<bool(const std::string&)>& include) {
  auto reader = std::make_shared<ckpt::ShardedTensorReader>(ckpt::ShardedTensorReader::open(dir / kModelSub));
  engine->load_parameters(
      [reader](const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end, at::Tensor out) {
        ALPACA_CHECK(reader->contains(name) && reader->shape(name) == shape,
                     reader->dir().string() << " has no tensor " << name << " of shape " << at::IntArrayRef(shape)
                                            << "; is it a checkpoint of this model?");
        reader->read_range(name, begin, end, out);
      },
      /*rank0_only=*/false, include);
}

void Trainer::Impl::load_sharded_optimizer(const fs::path& dir) {
  const OptimizerState saved = fs::is_directory(dir / kKinds[kAdafactorKind].sub) ? OptimizerState::kAdafactor
                               : fs::is_directory(dir / kKinds[2].sub)            ? OptimizerState::kAdamW
                                                                                  : OptimizerState::kLion;
  ALPACA_USER_CHECK(saved == optimizer_state_kind(), optimizer_mismatch(dir, saved));
  if (saved == OptimizerState::kAdafactor) {
    const auto reader = ckpt::ShardedTensorReader::open(dir / kKinds[kAdafactorKind].sub);
    for (const auto& st : optimizer->adafactor_state()) {
      const std::string name = st.key + "." + st.param;
      ALPACA_CHECK(reader.contains(name) && reader.shape(name) == st.value.sizes().vec(),
                   reader.dir().string() << " has no Adafactor statistic " << name << " of shape " << st.value.sizes()
                                         << "; the checkpoint is incomplete or of another model, resume from an older one");
      at::Tensor buf = at::empty({st.value.numel()}, at::kFloat);
      reader.read_range(name, 0, st.value.numel(), buf);
      st.value.copy_(buf.view(st.value.sizes()));
    }
    const std::string step = reader.metadata("step");
    ALPACA_CHECK(!step.empty(), reader.dir().string() << " has no optimizer step in its metadata; the checkpoint is corrupt");
    optimizer->set_step_count(std::stoll(step));
    return;
  }
  // The kinds this optimizer reads (kKinds' index): the moments, and for 8-bit ones their block
  // scales when the checkpoint has them (one of an 8-bit run); fp32 moments of another --optim are
  // quantized afresh. A run with fp32 moments reads the dequantized ones.
  const bool two = optimizer->has_exp_avg_sq();
  const bool have_absmax = fs::is_directory(dir / kKinds[3].sub);
  std::vector<int> kinds = {1};
  if (two) kinds.push_back(2);
  if (optimizer->quantized()) {
    if (have_absmax) {
      kinds.push_back(3);
      if (two) kinds.push_back(4);
    } else if (rank == 0) {
      ALPACA_INFO(dir.string() << " holds fp32 moments (another --optim): quantizing them to 8 bits");
    }
  } else if (have_absmax && rank == 0) {
    ALPACA_INFO(dir.string() << " holds 8-bit moments (bitsandbytes): resuming from their dequantized values");
  }
  std::vector<ckpt::ShardedTensorReader> readers;
  for (int k : kinds) readers.push_back(ckpt::ShardedTensorReader::open(dir / kKinds[k].sub));
  optimizer->begin_state_io();
  for (const auto& p : engine->local_param_shards()) {
    if (!p.trainable) continue;
    const int64_t n = p.param_end - p.param_begin;
    for (size_t k = 0; k < readers.size(); ++k) {
      const ckpt::ShardedTensorReader* r = &readers[k];
      ALPACA_CHECK(r->contains(p.name) && r->shape(p.name) == p.shape,
                   r->dir().string() << " has no optimizer state for " << p.name << " of shape " << at::IntArrayRef(p.shape)
                                     << "; the checkpoint is incomplete or of another model, resume from an older one");
      const size_t i = p.optim_index;
      const int kind = kinds[k];
      at::Tensor state = (kind == 1   ? optimizer->exp_avg(i)
                          : kind == 2 ? optimizer->exp_avg_sq(i)
                          : kind == 3 ? optimizer->exp_avg_absmax(i)
                                      : optimizer->exp_avg_sq_absmax(i))
                             .narrow(0, p.shard_offset, n);
      if (state.device().is_cpu() && state.scalar_type() == at::kFloat) {
        r->read_range(p.name, p.param_begin, p.param_end, state);
      } else {
        at::Tensor buf = at::empty({n}, at::kFloat);
        r->read_range(p.name, p.param_begin, p.param_end, buf);
        state.copy_(buf);
      }
    }
  }
  optimizer->end_state_io(/*written=*/true, have_absmax);  // collective for 8-bit moments without scales
  const std::string step = readers[0].metadata("step");
  ALPACA_CHECK(!step.empty(), readers[0].dir().string() << " has no optimizer step in its metadata; the checkpoint is corrupt");
  optimizer->set_step_count(std::stoll(step));
}

std::string Trainer::Impl::checkpoint_problem_shared(const fs::path& dir) {
  const std::string why = ckpt::checkpoint_problem(dir, rank, world);
  at::Tensor bad = at::zeros({world}, at::kLong);
  bad[rank] = why.empty() ? 0 : 1;
  bad = bad.to(device);
  comm->all_reduce(bad, dist::ReduceOp::kSum)->wait();
  bad = bad.to(at::kCPU);
  // The first rank that found a problem: every rank repeats that rank's share, so all of them
  // hold the same message naming the file (rank 0 prints input errors).
  for (int r = 0; r < world; ++r)
    if (bad[r].item<int64_t>() != 0) return r == rank ? why : ckpt::checkpoint_problem(dir, r, world);
  return "";
}

}  // namespace alpaca::train
