// Private state of the Trainer, shared by its setup, step loop, evaluation and checkpoint files.
#pragma once

#include <algorithm>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/ckpt/checkpoint_dir.h"
#include "alpaca/ckpt/resume_state.h"
#include "alpaca/ckpt/sharded_tensors.h"
#include "alpaca/ckpt/trainer_state.h"
#include "alpaca/data/alpaca_example.h"
#include "alpaca/data/collate.h"
#include "alpaca/data/sampler.h"
#include "alpaca/tokenizer/tokenizer.h"
#include "alpaca/dist/communicator.h"
#include "alpaca/fsdp/engine.h"
#include "alpaca/fsdp/fsdp_llama.h"
#include "alpaca/model/llama.h"
#include "alpaca/model/lora.h"
#include "alpaca/optim/adamw.h"
#include "alpaca/optim/loss_scaler.h"
#include "alpaca/optim/lr_schedule.h"
#include "alpaca/train/metrics.h"
#include "alpaca/train/options.h"
#include "alpaca/train/progress.h"
#include "alpaca/train/tensorboard.h"
#include "alpaca/train/trainer.h"
#include "alpaca/util/sys.h"

namespace alpaca::train {

// The micro-batches of one optimizer step on this rank and the counts over all ranks.
struct StepBatches {
  std::vector<data::Batch> batches;
  int64_t local_tokens = 0;   // attention-mask tokens on this rank
  int64_t global_labels = 0;  // label tokens over all ranks and micro-batches: the loss denominator
  int64_t global_tokens = 0;  // global_labels / global_tokens: read at the end of the step
  int64_t global_padded = 0;  // input_ids elements (padding included) over all ranks (HF's "all")
  int64_t global_non_padding = 0;  // HF's "non_padding" count over all ranks (data::TokenCounts)
  int64_t global_attended = 0;     // TRL's num_tokens count over all ranks (data::TokenCounts)
  // (labels, tokens, padded, non-padding, attended, then each micro-batch's labels) over all ranks,
  // int64 on the device
  at::Tensor counts;
  at::Tensor denominator_t;   // max(labels, 1) as an fp32 scalar on the device
  // TRL's per-micro-batch token metrics: this rank's (entropy sum, top-1 count) of each micro-batch,
  // fp32 on the device (forward_backward); after the step's read, each micro-batch's over all ranks.
  at::Tensor local_token_stats;
  std::vector<double> micro_entropy_sum, micro_top1;
  std::vector<int64_t> micro_labels;
  double denominator() const { return static_cast<double>(std::max<int64_t>(global_labels, 1)); }
};

// What one optimizer step produced.
struct StepOutcome {
  double loss = 0;  // the global mean token loss of the step
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // NaN when the update was skipped
  double lr = 0;         // the rate the optimizer step used
  double logged_lr = 0;  // the rate HF Trainer logs for it (optim::logged_learning_rate)
  bool stop = false;  // a rank was asked to save and stop (SIGTERM / SIGINT)
};

// The run's clocks and the logging window since the last training log entry.
struct RunWindow {
  sys::Timer run_timer, window_timer;
  int64_t steps = 0, tokens = 0, local_tokens = 0;
  int64_t syncs_at_start = 0;  // util::host_sync_count() after the previous step's log/eval/save
  double last_grad_norm = std::numeric_limits<double>::quiet_NaN(), last_lr = 0;
  std::optional<double> last_eval_loss;
  // TRL SFTTrainer's metrics since the last log: one value per micro-batch (over all ranks), the
  // mean token entropy and top-1 accuracy of its label tokens (0 for a micro-batch without any).
  std::vector<double> entropies, accuracies;
  bool evaluated_at_last_step = false;
};

// An evaluation's results over all ranks: HF's eval_loss, and TRL's per-batch means of the label
// tokens' entropy and top-1 accuracy, averaged over the batches.
struct EvalOutcome {
  double loss = std::numeric_limits<double>::quiet_NaN();
  double entropy = 0, mean_token_accuracy = 0;
};

struct Trainer::Impl {
  TrainerOptions opt;
  std::shared_ptr<dist::Communicator> comm;  // the caller's (train::run_training)
  int rank = 0;
  int world = 1;
  int local_rank = 0;  // on this node
  at::Device device = at::kCPU;

  std::optional<tokenizer::Tokenizer> tokenizer;  // set in setup (no empty Tokenizer exists)
  // train.py's mask (ids != pad) with its special tokens, TRL's (every example token) with its rule.
  data::AttentionMask attention_rule = data::AttentionMask::kNotPadId;
  // Rank 0: what tokenizer->save writes, and the run's chat template (trainer_setup.cpp).
  std::vector<std::pair<std::string, std::string>> tokenizer_files;
  void write_tokenizer_files(const std::filesystem::path& dir) const;
  model::LlamaForCausalLM model{nullptr};
  // What exports write besides the weights: config.json is the model's with TRL's mirrored token
  // ids (export_pad_id / export_eos_id, when set), generation_config.json the base's (or the one
  // transformers derives from its config) with the same changes (setup_tokenizer_and_model).
  std::optional<int64_t> export_pad_id, export_eos_id;
  std::string generation_config_json;
  model::LlamaConfig export_config() const;
  // Where the weights come from and how: the model is built on the meta device and each rank
  // reads only its own shards after apply_fsdp (setup_engine), unless weights_loaded.
  std::filesystem::path weights_dir;
  // Rows of embed_tokens / lm_head from this one on are the fp32 mean of the stored rows before it
  // (train.py's smart_tokenizer_and_embedding_resize; -1: all rows as stored).
  int64_t vocab_mean_from = -1;
  bool weights_loaded = false;
  // LoRA (--use_peft; trainer_lora.cpp): the adapters attached, and the vocabulary rows train.py
  // added to the base ([PAD]) that the adapter must carry for a peft user.
  model::LoraPlan lora_plan;
  std::vector<int64_t> added_token_ids;
  // The model under FSDP, wrapped by fsdp::apply_fsdp (the path the FSDP tests use); engine is
  // fsdp_model->engine().
  std::unique_ptr<fsdp::FsdpLlama> fsdp_model;
  fsdp::FsdpEngine* engine = nullptr;
  std::unique_ptr<optim::ShardedAdamW> optimizer;
  std::optional<optim::DynamicLossScaler> scaler;  // fp16 only
  optim::LrSchedule schedule;

  std::vector<data::Example> train_examples;
  std::vector<data::Example> eval_examples;
  std::unique_ptr<data::DistributedBatchSampler> sampler;
  RunLength length;

  int64_t logging_steps = 0, eval_steps = 0, save_steps = 0;  // resolved against the run length
  std::filesystem::path output_dir;

  // Position and bookkeeping (what a checkpoint stores).
  ckpt::TrainerState state;
  int64_t epoch = 0;            // epoch in progress
  int64_t step_in_epoch = 0;    // optimizer steps done in that epoch
  int64_t scheduler_step = 0;   // optimizer steps not skipped by the fp16 scaler
  int64_t initial_step = 0;     // global_step at the start of this session (after resume)
  // Non-padding tokens trained on (total_flos, throughput; resume state). trainer_state.json's
  // num_input_tokens_seen is HF's count instead: --include_num_input_tokens_seen (0 for "no").
  int64_t tokens_trained = 0;
  // TRL's num_tokens (data::TokenCounts::attended summed): tokens_trained plus, under bfd packing
  // with --pad_to_multiple_of, the padding of each padding-free row.
  int64_t trl_num_tokens = 0;
  int64_t cache_releases = 0;  // --torch_empty_cache_steps releases this session (logged at the end)
  LossAccumulator losses;
  std::optional<std::filesystem::path> resume_dir;
  ckpt::Fingerprint model_fingerprint, tokenizer_fingerprint;

  MetricsJsonl metrics;
  TensorBoardWriter tensorboard;  // rank 0 with --report_to tensorboard/all; disabled otherwise
  std::unique_ptr<ProgressReporter> progress;
  double flops_per_token = 0;
  std::optional<double> peak_flops;

  // setup (trainer_setup.cpp)
  explicit Impl(const TrainerOptions& o);
  void setup_tokenizer_and_model();
  void mirror_tokens_onto_configs(bool train_py_tokens, const std::filesystem::path& base,
                                  const model::LlamaConfig& base_cfg);
  void setup_data();
  void setup_engine();
  void setup_schedule();
  void build_sampler();  // from args' micro-batch and accumulation (setup_data, find_micro_batch)

  // --auto_find_batch_size (trainer_batch_finder.cpp)
  void find_micro_batch();
  bool probe_micro_batch_fits(int64_t micro);
  data::SamplerOptions sampler_options() const;  // from opt's micro-batch and accumulation
  // The examples of the micro-batch that pads to the most tokens at per-device batch `micro`.
  std::vector<int64_t> heaviest_micro_batch(int64_t micro) const;

  // loop (trainer_loop.cpp); train() runs the step functions top to bottom.
  int train();
  StepBatches gather_micro_batches();
  at::Tensor forward_backward(StepBatches& sb);
  at::Tensor reduce_step_loss(const at::Tensor& local_loss_sum, const StepBatches& sb);
  void read_step(const at::Tensor& red, const at::Tensor& norm_sq, StepBatches& sb, StepOutcome& out, double* norm);
  StepOutcome optimizer_step(const at::Tensor& red, StepBatches& sb);
  void advance(const StepBatches& sb, const StepOutcome& out, RunWindow& w);
  void log_eval_save(RunWindow& w, bool stop);
  void log_window(RunWindow& w);
  LogEntry evaluate_and_log();  // the evaluation's log entry (eval_loss, ...), logged
  // HF's _determine_best_metric: state.best_metric / best_global_step from an evaluation's value of
  // opt.metric_for_best_model (tracked_metric); whether it is a new best.
  bool determine_best_metric(double metric);
  // opt.metric_for_best_model's value in an evaluation's entry, rank 0's on every rank (collective).
  double tracked_metric(const LogEntry& eval);
  // HF's _save_checkpoint: state.best_model_checkpoint := checkpoint-<best_global_step> when that
  // is the checkpoint being saved or exists (called before a save writes trainer_state.json).
  void note_best_checkpoint();
  // --load_best_model_at_end: the best checkpoint's weights (or adapter) into the shards (collective).
  void load_best_model();
  void finish_run(const RunWindow& w);
  EvalOutcome evaluate();
  // TRL's entropy, mean_token_accuracy and num_tokens of a window (its per-micro-batch values), appended
  // to `e` with `prefix` (eval_ for an evaluation's); nothing when the window has no micro-batch.
  void append_token_metrics(LogEntry& e, const std::string& prefix, const std::vector<double>& entropies,
                            const std::vector<double>& accuracies) const;
  void log_entry(LogEntry entry, bool to_history = true);
  void open_tensorboard();  // rank 0, --report_to tensorboard/all (trainer_setup.cpp)

  // LoRA (trainer_lora.cpp)
  void setup_lora(int64_t base_vocab_size);
  void init_trainable_token_rows();
  // DoRA: each magnitude vector set to its base weight's row norms once the base is loaded (peft's
  // initialisation), from the weights as training sees them (param_dtype; a 4-bit base dequantized).
  void init_dora_magnitudes();  // after the base is loaded: the deltas start as its rows (collective)
  ckpt::Fingerprint lora_fingerprint() const;                       // base identity + LoRA flags
  void check_lora_resume(const ckpt::Fingerprint& saved_model) const;  // clear errors, before the generic check
  bool is_adapter_param(const std::string& name) const;             // LoRA A/B or a modules_to_save parameter
  void export_adapter(const std::filesystem::path& dir);            // collective; rank 0 writes
  void load_adapter(const std::filesystem::path& dir);              // collective

  // checkpoints (trainer_checkpoint.cpp)
  void save_checkpoint(bool allow_async = false);
  void save_checkpoint_into(ckpt::CheckpointWriter& writer);  // save_checkpoint without the cleanup
  void load_checkpoint(const std::filesystem::path& dir);
  void log_gathered_save(const std::filesystem::path& dir, double seconds, int64_t rss_at_start);  // collective
  void load_gathered_optimizer(const std::filesystem::path& dir, const ckpt::ResumeState& rs);
  // What an optimizer keeps, and so what a checkpoint of it holds: AdamW's two moments, Lion's
  // momentum, Adafactor's statistics. A resume needs the run's own kind; the error otherwise.
  enum class OptimizerState { kAdamW, kLion, kAdafactor };
  OptimizerState optimizer_state_kind() const;
  std::string optimizer_mismatch(const std::filesystem::path& dir, OptimizerState saved) const;
  void export_model(const std::filesystem::path& dir, bool write_tokenizer);
  ckpt::ResumeState capture_resume_state() const;
  // Every rank's random-number generators at a save (collective; into rank_rng_states), and this
  // rank's own restored at a resume.
  void gather_rank_rng_states();
  void restore_rank_rng_states(const ckpt::ResumeState& rs, const std::filesystem::path& dir);
  std::vector<std::string> rank_rng_states;

  // sharded checkpoints, the default layout (trainer_sharded_ckpt.cpp)
  struct ShardSet;
  struct PendingSave;
  std::shared_ptr<PendingSave> pending_save;  // a background (--save_async) write not sealed yet
  at::Tensor save_staging;  // fp32 host buffer the --save_async snapshots copy into, kept for the run
  static bool sharded_layout(const std::filesystem::path& dir);
  void save_sharded_checkpoint(bool allow_async);  // collective
  bool async_save_ahead() const;
  bool prepare_save_staging();  // collective until the buffer exists; whether it does
  void prepare_async_saves();   // at the start of the run (collective)
  ShardSet snapshot_shards(bool copy);
  std::vector<ckpt::WrittenFile> write_shards(const std::filesystem::path& dir, const ShardSet& set) const;
  std::function<void(const std::filesystem::path&)> small_checkpoint_files() const;  // rank 0
  void poll_pending_save();    // collective, every step while a save is pending: seals it when all ranks are done
  void finish_pending_save();  // collective: waits for the background write, then seals (or fails naming the ranks)
  void seal(PendingSave& p, const at::Tensor& gathered);  // rank 0
  // Every parameter, or those `include` accepts (a LoRA run: its adapter), from the per-rank shards.
  void load_sharded_weights(const std::filesystem::path& dir, const std::function<bool(const std::string&)>& include = {});    // collective
  void load_sharded_optimizer(const std::filesystem::path& dir);  // local: this rank's ranges
  // ckpt::checkpoint_problem with the digests split between the ranks (collective): the file's
  // name on the rank that found it, a pointer to that rank elsewhere.
  std::string checkpoint_problem_shared(const std::filesystem::path& dir);
  void save_final();
  void barrier();
};

}  // namespace alpaca::train
