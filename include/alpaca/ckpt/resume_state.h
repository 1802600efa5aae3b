// What HF's trainer_state.json does not hold but an exact resume needs: where the sampler is
// inside the epoch (in global samples, so any world size can continue), the RNG states, the
// scheduler step, the fp16 loss scaler, and fingerprints of the model and tokenizer that wrote
// the checkpoint (resuming with another model or tokenizer is an error that says which).
// Stored as JSON in checkpoint-<step>/alpaca_resume_state.json.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "alpaca/optim/lr_schedule.h"

namespace alpaca::ckpt {

inline constexpr const char* kResumeStateName = "alpaca_resume_state.json";
inline constexpr int kResumeStateVersion = 1;

struct LossScalerState {
  double scale = 65536.0;
  int64_t growth_tracker = 0;
};

// Ordered key -> value facts (e.g. "hidden_size" -> "64", "tokenizer.model sha256" -> "...").
using Fingerprint = std::map<std::string, std::string>;

struct ResumeState {
  int64_t global_step = 0;
  int64_t epoch = 0;              // the epoch in progress (0-based)
  int64_t samples_in_epoch = 0;   // global samples already consumed in that epoch
  int64_t steps_in_epoch = 0;     // optimizer steps already done in that epoch
  int64_t seed = 42;
  int64_t data_seed = 42;
  int64_t world_size = 1;         // of the run that wrote it (informational: resume may reshard)
  int64_t global_batch_size = 0;  // samples per optimizer step; must match on resume
  int64_t scheduler_step = 0;
  int64_t num_input_tokens_seen = 0;  // the trainer's non-padding tokens trained on
  // TRL's num_tokens count (the padding-free rows' --pad_to_multiple_of padding included); absent in
  // checkpoints written before it was kept, where it equalled num_input_tokens_seen.
  std::optional<int64_t> num_tokens;
  double total_loss_sum = 0;      // this session's logged step losses summed (informational: a
                                  // resumed session's train_loss counts its own steps only, as HF's)
  // The schedule's base learning rate. transformers restores it with the scheduler's state
  // (LambdaLR.base_lrs), so a resume continues the checkpoint's schedule whatever
  // --learning_rate says; absent in checkpoints written before it was kept.
  std::optional<double> learning_rate;
  std::optional<LossScalerState> loss_scaler;
  std::optional<optim::PlateauState> plateau;  // reduce_lr_on_plateau runs only: ReduceLROnPlateau's state
  std::string cpu_rng_state;                 // hex of at::Generator::get_state() (rank 0's)
  std::vector<std::string> cuda_rng_states;  // rank 0's generator of each visible device, hex
  // Every rank's own generators (HF's rng_state_<rank>.pth): "<cpu hex>" or "<cpu hex>:<its GPU's
  // hex>", by rank; dropout and NEFTune draw on each rank apart. Absent in checkpoints written before.
  std::vector<std::string> rank_rng_states;
  Fingerprint model;
  Fingerprint tokenizer;

  std::string to_json() const;
  static ResumeState from_json(const std::string& text, const std::string& what);
  void save(const std::string& path) const;  // durable write
  static ResumeState load(const std::string& path);
};

// Empty when `expected` (from the checkpoint) equals `actual` (this run); otherwise a message
// naming `what` ("model" / "tokenizer") and every differing fact, e.g.
// "the checkpoint's model differs from --model_name_or_path: hidden_size is 64 there, 32 here".
std::string fingerprint_mismatch(const std::string& what, const Fingerprint& expected, const Fingerprint& actual);

// The default CPU generator's and every CUDA generator's state, and their restoration.
std::string capture_cpu_rng_state();
void restore_cpu_rng_state(const std::string& hex);
std::vector<std::string> capture_cuda_rng_states();
// This rank's CPU generator and, on a GPU rank, its GPU's (cuda_device >= 0; -1 on a CPU rank):
// ResumeState::rank_rng_states' entry, and its restoration.
std::string capture_rank_rng_state(int cuda_device);
void restore_rank_rng_state(const std::string& state, int cuda_device);
void restore_cuda_rng_states(const std::vector<std::string>& hex_states);

// sha256 of a file's bytes as lowercase hex (tokenizer fingerprints). Throws naming the file.
std::string sha256_file(const std::string& path);

}  // namespace alpaca::ckpt
