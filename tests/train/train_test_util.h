// The trainer-run fixture of the tests that run alpaca-train: the reference fixture a run
// trains on, the flag builder (the flags every tiny-model run shares, then the test's own), the
// foreground and background runs (mpirun for several ranks, ALPACA_FAULTS armed) and the
// metrics.jsonl the run writes.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace alpaca::testing {

// build/fixtures/<name>: what tests/reference/<script>.py wrote for the ctest fixture <name>.
std::filesystem::path fixture_dir(const std::string& name);

// The flags of one alpaca-train run, each once, in the order first set. A later set() of the
// same flag replaces its value, so a test states only what differs from the shared recipe.
class TrainFlags {
 public:
  // The run of a fixture's model/ on its data.json into `output_dir`, with the flags every
  // tiny-model run shares: --model_max_length 64 --logging_steps 1 --report_to jsonl --seed 42.
  TrainFlags(const std::filesystem::path& fixture, const std::filesystem::path& output_dir);
  // "--name value ..." pairs (a value may be 'single quoted'), each added or replaced.
  TrainFlags& set(const std::string& flags);
  TrainFlags& set(const std::string& name, const std::string& value);
  TrainFlags& model(const std::filesystem::path& dir) { return set("--model_name_or_path", dir.string()); }
  // --max_steps, --per_device_train_batch_size and --gradient_accumulation_steps.
  TrainFlags& steps(int64_t max_steps);
  TrainFlags& batch(int64_t per_device, int64_t accum);
  std::string str() const;  // the command-line text
  operator std::string() const { return str(); }

 private:
  std::vector<std::pair<std::string, std::string>> flags_;
};

// The parity fixtures' recipe (the HF loop of tests/reference/alpaca_reference.py): `steps` steps at
// learning rate `lr`, cosine with 10% warmup, weight decay 0.01, no saves.
TrainFlags parity_flags(const std::filesystem::path& fixture, const std::filesystem::path& out, int64_t steps,
                        int64_t per_device, int64_t accum, const std::string& lr);

// Flag groups of the fixtures' recipes.
inline constexpr const char* kCosineWarmup = "--warmup_ratio 0.1 --lr_scheduler_type cosine";
inline constexpr const char* kFullShard = "--fsdp 'full_shard auto_wrap'";
inline constexpr const char* kNf4Nested = "--load_in_4bit True --bnb_4bit_quant_type nf4 --use_bnb_nested_quant True";

// The shell command of `alpaca-train <args>` on `ranks` processes (1 = plain, >1 = mpirun -np),
// with ALPACA_FAULTS=<faults> (util/fault.h) in every rank's environment when not empty.
std::string trainer_command(const std::string& args, int ranks, const std::string& faults = "");
// alpaca-train started in the background (BackgroundRun), its output to `log`.
BackgroundRun launch_trainer(const std::string& args, int ranks, const std::filesystem::path& log,
                             const std::string& faults = "");

// A run several tests of one executable start from (they read its outputs, or copy them before
// writing): `alpaca-train <args(dir)>` on `ranks` processes, made when first constructed, kept
// until the process ends. Hold it in a function-local static so the first test that needs it
// runs it, whichever that is.
class SharedRun {
 public:
  SharedRun(const std::string& tag, const std::function<std::string(const std::filesystem::path&)>& args, int ranks);
  const std::filesystem::path& dir() const { return dir_; }
  int rc() const { return rc_; }
  const std::string& log() const { return log_; }

 private:
  TempDir tmp_;
  std::filesystem::path dir_;
  int rc_ = 0;
  std::string log_;
};

struct StepLog {
  int64_t step = 0;
  double loss = 0, learning_rate = 0, grad_norm = 0;
};

// Runs `alpaca-train <args>` with `ranks` processes (1 = plain, >1 = mpirun -np). Returns the
// exit status; `output` receives stdout+stderr.
int run_trainer(const std::string& args, int ranks, std::string* output);

// Sends `sig` to rank `rank` of a running mpirun job of alpaca-train that writes to `output_dir`
// (the process whose environment says OMPI_COMM_WORLD_RANK=<rank>; mpirun's own pid is no
// rank's). Returns that process's pid, or -1 when there is none (nothing is signalled).
int signal_rank(const std::filesystem::path& output_dir, int rank, int sig);

// The per-step training logs (entries with "loss" and "step") of output_dir/metrics.jsonl.
std::vector<StepLog> read_step_logs(const std::filesystem::path& output_dir);
// A reference fixture's per-step numbers (reference.json: "losses", "grad_norms",
// "learning_rates"; a list the reference does not write is empty).
struct ReferenceSteps {
  std::vector<double> losses, grad_norms, learning_rates;
};
ReferenceSteps read_reference_steps(const std::filesystem::path& reference_json);

// EXPECTs each logged step to match the reference's: the loss within 1e-4 relative, the gradient
// norm within 1e-3 relative, the learning rate (when the reference has them) within 1e-12.
// `who` names the reference in the messages. Returns the worst relative loss and norm differences.
struct StepParity {
  double worst_loss = 0, worst_norm = 0;
};
StepParity expect_steps_match(const std::vector<StepLog>& steps, const ReferenceSteps& ref, const std::string& who);

// EXPECTs each step's loss within `rel_tol` (relative) of the same step of `want`; `what` names the
// run in the messages. Returns the worst relative difference.
double expect_losses_close(const std::vector<StepLog>& got, const std::vector<StepLog>& want, double rel_tol,
                           const std::string& what);

// Every metrics.jsonl entry as key -> number (non-numbers skipped).
std::vector<std::map<std::string, double>> read_metrics(const std::filesystem::path& output_dir);

// tests/reference/lora_peft_load_check.py: peft's PeftModel.from_pretrained(base, adapter) against our
// logits (`ours`: input_ids, logits), and, when `merged` is given, that merged HF directory in
// transformers. `ok`: its JSON line was found; rc non-zero when peft warned while loading.
struct PeftLoadCheck {
  bool ok = false;
  int rc = -1;
  double max_abs_diff = 0, max_abs = 0, merged_max_abs_diff = 0;
  std::string warnings;  // the JSON list, as text
  std::string output;    // everything the script printed
};
PeftLoadCheck peft_load_check(const std::filesystem::path& base, const std::filesystem::path& adapter,
                              const std::filesystem::path& ours, const std::filesystem::path& merged = {});

}  // namespace alpaca::testing
