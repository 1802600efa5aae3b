// Checkpoints and the final save. The default layout is sharded (trainer_sharded_ckpt.cpp), LoRA
// runs included; this file keeps the gathered one (--save_checkpoint_layout gathered), which every
// checkpoint written before the sharded layout has, and reads both. A gathered checkpoint-<step>/ holds the HF export (gathered one FSDP
// unit at a time; rank 0 writes), the tokenizer, trainer_state.json, our resume state and the
// AdamW moments per parameter name (optimizer.safetensors, "exp_avg.<name>" / "exp_avg_sq.<name>"),
// so it can be resumed on any world size. It is staged, fsync'ed and renamed (ckpt/).
#include <ATen/ATen.h>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/lora_merge.h"
#include "alpaca/fsdp/load_checkpoint.h"
#include "alpaca/io/hf_model.h"
#include "alpaca/io/safetensors.h"
#include "alpaca/util/error.h"
#include "alpaca/util/fault.h"
#include "alpaca/util/log.h"
#include "alpaca/util/user_error.h"
#include "alpaca/util/sys.h"
#include "trainer_impl.h"

namespace fs = std::filesystem;

namespace alpaca::train {
namespace {
constexpr const char* kOptimizerFile = "optimizer.safetensors";
}

void Trainer::Impl::barrier() { comm->barrier()->wait(); }

void Trainer::Impl::write_tokenizer_files(const fs::path& dir) const {
  for (const auto& [name, bytes] : tokenizer_files) ckpt::write_file_durable(dir / name, bytes);
}

void Trainer::Impl::export_model(const fs::path& dir, bool write_tokenizer) {
  if (opt.lora) {  // a peft adapter directory, never the gathered base
    export_adapter(dir);
    if (rank == 0 && write_tokenizer) write_tokenizer_files(dir);
    return;
  }
  std::unique_ptr<io::HfExportWriter> writer;
  const int64_t shard = opt.save_max_shard_bytes > 0 ? opt.save_max_shard_bytes : int64_t{5'000'000'000};
  if (rank == 0) writer = std::make_unique<io::HfExportWriter>(dir.string(), shard, std::nullopt);
  engine->reset_peaks();
  const int64_t rss_before = sys::rss_bytes();
  int64_t rss_peak = rss_before;
  engine->export_full_state([&](const std::string& name, const at::Tensor& value) {
    writer->add(name, value);
    rss_peak = std::max(rss_peak, sys::rss_bytes());
  });
  if (rank == 0) {
    writer->finish(export_config(), generation_config_json);
    if (write_tokenizer) write_tokenizer_files(dir);
    // The engine gathers one unit at a time for the export; RSS growth is the measured evidence
    // (its unshard counters only see the training path).
    ALPACA_INFO("exported the model to " << dir.string() << ": rank 0 RSS grew by at most "
                                         << (rss_peak - rss_before) / (1 << 20) << " MiB while writing ("
                                         << engine->memory_account().persistent_bytes() / (1 << 20)
                                         << " MiB of sharded model state on this rank)");
  }
}

ckpt::ResumeState Trainer::Impl::capture_resume_state() const {
  ckpt::ResumeState rs;
  rs.global_step = state.global_step;
  rs.epoch = epoch;
  rs.steps_in_epoch = step_in_epoch;
  rs.samples_in_epoch = step_in_epoch * length.global_batch_size;
  rs.seed = opt.seed;
  rs.data_seed = opt.data_seed;
  rs.world_size = world;
  rs.global_batch_size = length.global_batch_size;
  rs.scheduler_step = scheduler_step;
  rs.learning_rate = schedule.base_lr;
  if (schedule.type == optim::ScheduleType::kReduceOnPlateau) rs.plateau = schedule.plateau_state;
  rs.num_input_tokens_seen = tokens_trained;
  rs.num_tokens = trl_num_tokens;
  rs.total_loss_sum = losses.total_logged();
  if (scaler) rs.loss_scaler = ckpt::LossScalerState{scaler->scale(), scaler->growth_tracker()};
  rs.cpu_rng_state = ckpt::capture_cpu_rng_state();
  rs.cuda_rng_states = ckpt::capture_cuda_rng_states();
  rs.rank_rng_states = rank_rng_states;  // gather_rank_rng_states, at this save
  rs.model = model_fingerprint;
  rs.tokenizer = tokenizer_fingerprint;
  return rs;
}

void Trainer::Impl::save_checkpoint(bool allow_async) {
  if (opt.sharded_checkpoints) return save_sharded_checkpoint(allow_async);
  note_best_checkpoint();
  ckpt::CheckpointWriter writer(output_dir, state.global_step);
  sys::Timer timer;
  sys::reset_peak_rss_window();
  const int64_t rss_at_start = sys::rss_bytes();
  try {
    save_checkpoint_into(writer);
  } catch (const Error& e) {
    // A full disk (or any write error): no tmp-checkpoint-<step> is left behind, and the error
    // says what the save had written and what a checkpoint needs.
    if (rank != 0) throw;
    ALPACA_FAIL(e.message() << "; " << writer.abandon());
  }
  log_gathered_save(writer.final_dir(), timer.seconds(), rss_at_start);
}

// The same facts as a sharded save reports (bench/save_bench.py compares them): rank 0 wrote
// every byte; each rank's peak RSS during the save.
void Trainer::Impl::log_gathered_save(const fs::path& dir, double seconds, int64_t rss_at_start) {
  at::Tensor rss = at::zeros({world}, at::kLong);
  rss[rank] = std::max<int64_t>(0, sys::window_peak_rss_bytes() - rss_at_start);
  rss = rss.to(device);
  comm->all_reduce(rss, dist::ReduceOp::kSum)->wait();
  rss = rss.to(at::kCPU);
  if (rank != 0) return;
  int64_t bytes = 0, others = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) bytes += static_cast<int64_t>(e.file_size());
  for (int r = 1; r < world; ++r) others = std::max(others, rss[r].item<int64_t>());
  std::string per_rank = std::to_string(bytes);
  for (int r = 1; r < world; ++r) per_rank += ", 0";
  ALPACA_INFO("saved checkpoint " << dir.string() << " (gathered): shard bytes per rank [" << per_rank << "] of " << bytes
              << " (1/" << world << " = " << bytes / world << "); RSS growth during the save: rank 0 "
              << rss[0].item<int64_t>() / (1 << 20) << " MiB, other ranks at most " << others / (1 << 20)
              << " MiB; training stalled " << seconds << " s, the shard write took 0 s");
}

// Every rank's generators, as text, to every rank (HF saves rng_state_<rank>.pth on each process;
// here rank 0 writes them all into alpaca_resume_state.json). Collective: an all-gather of the
// texts (equal lengths: the same generators on every rank) as bytes.
void Trainer::Impl::gather_rank_rng_states() {
  const std::string mine = ckpt::capture_rank_rng_state(device.is_cuda() ? device.index() : -1);
  at::Tensor len = at::full({1}, static_cast<int64_t>(mine.size()), at::TensorOptions().dtype(at::kLong).device(device));
  comm->all_reduce(len, dist::ReduceOp::kMax)->wait();
  const int64_t n = len.item<int64_t>();
  at::Tensor bytes = at::zeros({n}, at::kLong);  // one character an element, 0-padded
  int64_t* b = bytes.data_ptr<int64_t>();
  for (size_t i = 0; i < mine.size(); ++i) b[i] = static_cast<unsigned char>(mine[i]);
  at::Tensor all = at::empty({world * n}, at::TensorOptions().dtype(at::kLong).device(device));
  comm->all_gather_into(all, bytes.to(device))->wait();
  all = all.to(at::kCPU).contiguous();
  const int64_t* a = all.data_ptr<int64_t>();
  rank_rng_states.assign(static_cast<size_t>(world), "");
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < n && a[r * n + i] != 0; ++i) rank_rng_states[r] += static_cast<char>(a[r * n + i]);
}

// Each rank takes back its own generators; a rank the checkpoint has none for (more ranks now, or a
// checkpoint from before they were kept: rank 0's for all) says so, as transformers warns.
void Trainer::Impl::restore_rank_rng_states(const ckpt::ResumeState& rs, const fs::path& dir) {
  const int cuda = device.is_cuda() ? device.index() : -1;
  if (static_cast<size_t>(rank) < rs.rank_rng_states.size()) {
    ckpt::restore_rank_rng_state(rs.rank_rng_states[static_cast<size_t>(rank)], cuda);
    if (rs.world_size != world && rank == 0)
      ALPACA_WARN("resuming " << dir.string() << " (written by " << rs.world_size << " ranks) on " << world
                              << ": each rank continues the random stream of the rank of its number, so random "
                                 "operations (dropout, NEFTune noise) do not repeat an uninterrupted run's");
    return;
  }
  ckpt::restore_cpu_rng_state(rs.cpu_rng_state);
  ckpt::restore_cuda_rng_states(rs.cuda_rng_states);
  if (!rs.rank_rng_states.empty()) {
    ALPACA_WARN("rank " << rank << " finds no random-number state of its own in " << dir.string() << " (written by "
                        << rs.world_size << " ranks); it continues rank 0's, so random operations (dropout, NEFTune "
                                            "noise) do not repeat an uninterrupted run's");
  } else if (world > 1 && rank == 0) {
    ALPACA_WARN(dir.string() << " keeps rank 0's random-number state only (written before every rank's was kept): "
                                "every rank continues it, so random operations (dropout, NEFTune noise) on ranks 1.."
                             << world - 1 << " do not repeat an uninterrupted run's");
  }
}

void Trainer::Impl::save_checkpoint_into(ckpt::CheckpointWriter& writer) {
  if (rank == 0) writer.begin();
  barrier();
  if (!opt.save_only_model) gather_rank_rng_states();
  const fs::path dir = writer.staging_dir();
  export_model(dir, /*write_tokenizer=*/true);
  if (!opt.save_only_model) {
    std::unique_ptr<io::SafetensorsWriter> opt_writer;
    if (rank == 0) opt_writer = std::make_unique<io::SafetensorsWriter>((dir / kOptimizerFile).string());
    if (optimizer->adafactor()) {  // every rank holds the statistics whole: rank 0 writes them
      if (rank == 0)
        for (const auto& st : optimizer->adafactor_state())
          opt_writer->add(st.key + "." + st.param, st.value.to(at::kCPU, at::kFloat).contiguous());
    } else {
      engine->gather_optimizer_state_by_name(*optimizer, [&](const std::string& name, const std::string& key,
                                                             const at::Tensor& value) {
        opt_writer->add(key + "." + name, value);
      });
    }
    if (rank == 0) {
      opt_writer->finish({{"format", "pt"}, {"step", std::to_string(optimizer->step_count())}});
      capture_resume_state().save((dir / ckpt::kResumeStateName).string());
    }
  }
  if (rank == 0) state.save((dir / ckpt::kTrainerStateName).string());
  util::fault_pause_ms("ckpt.pause_before_seal");  // kill-mid-write tests (util/fault.h)
  barrier();  // every rank's writes are done before rank 0 seals the checkpoint
  if (rank == 0) {
    const fs::path final_dir = writer.commit();
    ALPACA_INFO("saved checkpoint " << final_dir.string());
    if (opt.save_total_limit)
      ckpt::rotate_checkpoints(output_dir, *opt.save_total_limit, state.best_model_checkpoint.value_or(""), true);
  }
  sys::release_free_host_memory();  // gathered full tensors of the export are not reused by the steps
  barrier();
}

void Trainer::Impl::note_best_checkpoint() {
  if (opt.save_strategy == Interval::kNo || !state.best_global_step) return;
  // Every earlier checkpoint is sealed by now (a pending save is finished before the next starts).
  const fs::path best = output_dir / ("checkpoint-" + std::to_string(*state.best_global_step));
  if (*state.best_global_step == state.global_step || fs::is_directory(best)) state.best_model_checkpoint = best.string();
}

void Trainer::Impl::load_best_model() {
  finish_pending_save();  // the best checkpoint may be the one still being written
  const fs::path dir = *state.best_model_checkpoint;
  // Every rank reads its own ranges: all must see a complete checkpoint, or none loads it.
  const std::string problem = checkpoint_problem_shared(dir);
  if (!problem.empty()) {
    ALPACA_WARN("not loading the best model from " << dir.string() << ": " << problem
                << "; output_dir gets the last step's weights");
    return;
  }
  ALPACA_INFO("Loading best model from " << dir.string() << " (score: " << *state.best_metric << ").");
  if (opt.lora && sharded_layout(dir))
    load_sharded_weights(dir, [this](const std::string& name) { return is_adapter_param(name); });
  else if (opt.lora)
    load_adapter(dir);
  else if (sharded_layout(dir))
    load_sharded_weights(dir);
  else
    fsdp::load_checkpoint(*engine, dir.string(), opt.fsdp_policy.cpu_ram_efficient_loading);
}

void Trainer::Impl::load_checkpoint(const fs::path& dir) {
  const auto rs = ckpt::ResumeState::load((dir / ckpt::kResumeStateName).string());
  const bool sharded = sharded_layout(dir);
  ALPACA_USER_CHECK(sharded ? fs::is_directory(dir / "optimizer") : fs::exists(dir / kOptimizerFile), dir.string() << " was saved with --save_only_model (no " << kOptimizerFile
                                                              << "); it holds a model but cannot be resumed from");
  ALPACA_USER_CHECK(rs.global_batch_size == length.global_batch_size,
               "cannot resume from " << dir.string() << ": it was trained with a global batch of " << rs.global_batch_size
                                     << " examples per step, this run has " << length.global_batch_size
                                     << " (per_device_train_batch_size x ranks x gradient_accumulation_steps); keep the "
                                        "global batch, e.g. change gradient_accumulation_steps when the rank count changes");
  const ckpt::TrainerState saved = ckpt::TrainerState::load((dir / ckpt::kTrainerStateName).string());
  state.global_step = saved.global_step;
  state.epoch = saved.epoch;
  state.log_history = saved.log_history;
  state.total_flos = saved.total_flos;
  state.num_input_tokens_seen = saved.num_input_tokens_seen;  // HF's count (--include_num_input_tokens_seen)
  tokens_trained = rs.num_input_tokens_seen;                   // the non-padding count, as always kept here
  trl_num_tokens = rs.num_tokens.value_or(rs.num_input_tokens_seen);  // absent before it was kept: equal then
  state.best_metric = saved.best_metric;
  state.best_global_step = saved.best_global_step;
  state.best_model_checkpoint = saved.best_model_checkpoint;
  if (state.best_model_checkpoint && !fs::is_directory(*state.best_model_checkpoint)) {
    ALPACA_WARN("The best checkpoint " << *state.best_model_checkpoint << " recorded in the resumed state does not exist "
                "anymore. Ignoring it for this run.");  // transformers' words
    state.best_model_checkpoint.reset();
  }
  epoch = rs.epoch;
  step_in_epoch = rs.steps_in_epoch;
  // HF's ignore_data_skip: steps_trained_in_current_epoch = 0, so the interrupted epoch's dataloader
  // starts over (the global step, the epoch float HF computes from the in-epoch step, the schedule go on).
  if (opt.ignore_data_skip && step_in_epoch > 0 && step_in_epoch < length.steps_per_epoch) {
    ALPACA_INFO("--ignore_data_skip: epoch " << epoch << " starts again from its first batch (the checkpoint was "
                << step_in_epoch << " steps into it)");
    step_in_epoch = 0;
  }
  scheduler_step = rs.scheduler_step;
  if (schedule.type == optim::ScheduleType::kReduceOnPlateau && rs.plateau) schedule.plateau_state = *rs.plateau;
  if (rs.learning_rate && *rs.learning_rate != schedule.base_lr) {
    // transformers' resume loads the scheduler's state, base_lrs included: the run continues the
    // checkpoint's schedule. Same numbers as HF, and said out loud.
    ALPACA_WARN("resuming from " << dir.string() << " continues its learning rate " << *rs.learning_rate
                << " (the scheduler state transformers restores); --learning_rate " << schedule.base_lr
                << " applies to a run that starts fresh");
    schedule.base_lr = *rs.learning_rate;
  }
  losses.restore(state.global_step);

  if (opt.lora && sharded) {
    load_sharded_weights(dir, [this](const std::string& name) { return is_adapter_param(name); });
  } else if (opt.lora) {
    load_adapter(dir);
  }
  if (sharded) {
    load_sharded_optimizer(dir);  // the weights were read in setup_engine
  } else {
    load_gathered_optimizer(dir, rs);
  }
  if (scaler && rs.loss_scaler) scaler->set_state(rs.loss_scaler->scale, rs.loss_scaler->growth_tracker);
  restore_rank_rng_states(rs, dir);
  if (rs.world_size != world)
    ALPACA_INFO("resharding: the checkpoint was written by " << rs.world_size << " ranks, this run has " << world);
  ALPACA_INFO("resumed at step " << state.global_step << " (epoch " << epoch << ", step " << step_in_epoch
                                 << " of the epoch)");
}

// The layout before sharded checkpoints: optimizer.safetensors with "exp_avg.<name>" full tensors.
Trainer::Impl::OptimizerState Trainer::Impl::optimizer_state_kind() const {
  return optimizer->adafactor() ? OptimizerState::kAdafactor
         : optimizer->has_exp_avg_sq() ? OptimizerState::kAdamW
                                       : OptimizerState::kLion;
}

std::string Trainer::Impl::optimizer_mismatch(const fs::path& dir, OptimizerState saved) const {
  auto state_name = [](OptimizerState s) {
    return s == OptimizerState::kAdamW ? "AdamW moments (--optim adamw_*)"
           : s == OptimizerState::kLion ? "Lion's momentum alone (--optim lion_*)"
                                        : "Adafactor's statistics (--optim adafactor)";
  };
  auto optimizer_name = [](OptimizerState s) {
    return s == OptimizerState::kAdamW ? "AdamW" : s == OptimizerState::kLion ? "Lion" : "Adafactor";
  };
  std::ostringstream os;
  os << "cannot resume from " << dir.string() << ": it holds " << state_name(saved) << " and this run's optimizer, "
     << optimizer_name(optimizer_state_kind()) << ", has no use for them "
     << "(transformers would fail to load that optimizer state too); resume with the --optim the checkpoint was "
        "trained with (its training_args.json), or start a new run from its weights (--model_name_or_path "
     << dir.string() << ")";
  return os.str();
}

void Trainer::Impl::load_gathered_optimizer(const fs::path& dir, const ckpt::ResumeState& rs) {
  auto file = io::SafetensorsFile::open((dir / kOptimizerFile).string());
  // AdamW writes "exp_avg.<name>" and "exp_avg_sq.<name>" for every trainable parameter, Lion the
  // first only, Adafactor neither ("exp_avg_sq_row.<name>", ...).
  const auto names = file->names();
  auto any_prefix = [&](const char* prefix) {
    return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return n.starts_with(prefix); });
  };
  const OptimizerState saved = !any_prefix("exp_avg.") && any_prefix("exp_avg_sq") ? OptimizerState::kAdafactor
                               : any_prefix("exp_avg_sq.")                          ? OptimizerState::kAdamW
                                                                                    : OptimizerState::kLion;
  ALPACA_USER_CHECK(saved == optimizer_state_kind(), optimizer_mismatch(dir, saved));
  const auto& meta = file->metadata();
  auto it = meta.find("step");
  if (saved == OptimizerState::kAdafactor) {
    for (const auto& st : optimizer->adafactor_state()) {
      const std::string k = st.key + "." + st.param;
      const at::Tensor saved_value = file->contains(k) ? file->tensor(k) : at::Tensor();
      ALPACA_CHECK(saved_value.defined() && saved_value.sizes() == st.value.sizes(),
                   dir.string() << "/" << kOptimizerFile << " has no Adafactor statistic " << k << " of shape "
                                << st.value.sizes() << "; the checkpoint is incomplete or of another model");
      st.value.copy_(saved_value.to(at::kFloat));
    }
    optimizer->set_step_count(it != meta.end() ? std::stoll(it->second) : rs.scheduler_step);
    return;
  }
  engine->load_optimizer_state_by_name(*optimizer, [&](const std::string& name, const std::string& key) {
    const std::string k = key + "." + name;
    // 8-bit moments' block scales: absent from a checkpoint of fp32 moments (quantized afresh).
    if (key.ends_with("_absmax") && !file->contains(k)) return at::Tensor();
    ALPACA_CHECK(file->contains(k), dir.string() << "/" << kOptimizerFile << " has no tensor " << k
                                                 << "; the checkpoint is incomplete, resume from an older one");
    return file->tensor(k).to(at::kFloat).clone();
  });
  optimizer->set_step_count(it != meta.end() ? std::stoll(it->second) : rs.scheduler_step);
}

void Trainer::Impl::save_final() {
  finish_pending_save();  // a background checkpoint write is sealed (or reported) before the export
  export_model(output_dir, /*write_tokenizer=*/true);
  if (rank == 0) state.save((output_dir / ckpt::kTrainerStateName).string());
  if (opt.lora && opt.merge_adapter && rank == 0) {
    // Streams base + adapter from disk one tensor at a time (no rank gathers anything).
    const auto s = ckpt::merge_lora_adapter(opt.model_name_or_path.string(), output_dir.string(), (output_dir / "merged").string(),
                                            opt.save_max_shard_bytes > 0 ? opt.save_max_shard_bytes : int64_t{5'000'000'000});
    ALPACA_INFO("merged the adapter into " << (output_dir / "merged").string() << " (" << s.num_merged
                                           << " linears; RSS grew by " << s.peak_rss_growth / (1 << 20) << " MiB)");
  }
  barrier();
}

}  // namespace alpaca::train
